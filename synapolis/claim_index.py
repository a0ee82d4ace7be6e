"""Who holds a path (contract §14): the path claims that may be held, indexed by literal prefix, and the
overlap check a path claim passes before it is granted.

Every path claim is keyed by its pattern's leading literal segments, lower-cased (`src/api` for
`src/api/*.py`, "" for `**/*.md`): a path can only match a pattern whose prefix is one of the path's
own leading runs of segments, and two patterns can only overlap when one's prefix leads the other's.
So "who holds `src/api/users.py`" looks at five keys, not at every claim, and a claim of `src/api/**`
looks at the keys on its own line. The index is only a filter: each candidate's pattern is then
matched exactly (pathpatterns) and its claim record read afresh, so the record stays the truth.

On the SQLite store the index is `state/claims-index.json` ({item: prefix} of every path claim that
may be held), changed under the path-claims lock (claims.file_slot): an item is added before its claim
file is written and removed after its release is, so a crash leaves at most an extra candidate, never
a missing one. A missing or unreadable index is rebuilt from the claim files by the next writer, and a
reader scans the claim files meanwhile. On PostgreSQL it is the table `claim_paths`, changed in the
claim's own transaction.
"""

from __future__ import annotations

import os
from datetime import datetime

from .names import is_name
from .pathpatterns import compile_pattern, literal_prefix, matches, overlaps_compiled, prefixes_of

INDEX_FILE = "claims-index.json"
INDEX_VERSION = 1


def index_prefix(item: str) -> str:
    """The key of a path claim in the index: its literal prefix, lower-cased (a superset when the file system
    heeds case; exact matching comes after)."""
    return literal_prefix(item).lower()


def lines_of(prefix: str) -> list[str]:
    """The prefixes a pattern with this prefix may overlap, at or above it: "" and each leading run."""
    return prefixes_of(prefix) if prefix else [""]


def is_path_item(item: str) -> bool:
    return not is_name(item)


# --- the SQLite store's index file --------------------------------------------------------------------

def index_path(ws) -> str:
    return os.path.join(ws.files.root, INDEX_FILE)


_HELD_READS: dict | None = None  # inside one_reading(): {index path: what it read}


class one_reading:
    """`with one_reading():` the index is read at most once in the body, and every reader in it gets that
    reading (a hook asks file_candidates, then the guard asks again: one parse of a big index, not two).
    The answers are those of a guard that ran at the moment of that read; nothing is kept after the body.
    For pure queries only: a claim or release must not run inside (its overlap check must see the index as
    it is under the path-claims lock; the writer's own update reads afresh regardless)."""

    def __enter__(self):
        global _HELD_READS
        self.outer, _HELD_READS = _HELD_READS, ({} if _HELD_READS is None else _HELD_READS)
        return self

    def __exit__(self, *exc):
        global _HELD_READS
        _HELD_READS = self.outer
        return False


def read_file_index(ws, fresh: bool = False) -> dict | None:
    """{item: prefix}, or None when there is no usable index (never written, removed, damaged). `fresh`: read
    the file even inside one_reading() (a writer changes what it read)."""
    from .atomic import read_json

    path = index_path(ws)
    if _HELD_READS is not None and path in _HELD_READS and not fresh:
        found = _HELD_READS[path]
        return None if found is None else dict(found)
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict) or doc.get("schema_version") != INDEX_VERSION or not isinstance(doc.get("items"), dict):
        items = None
    else:
        items = doc["items"]
    if _HELD_READS is not None:
        _HELD_READS[path] = None if items is None else dict(items)
    return items


def nothing_held(ws, env=None) -> bool:
    """True when, without opening any store, no path claim can be held: the SQLite store, and its index lists
    no item (or there is neither an index nor any claim file). A hook's quiet path asks this first; False
    means "ask guard" (another store, an index that lists items, claim files from before the index)."""
    env = os.environ if env is None else env
    url = env.get("SYNAPOLIS_STORE_URL") or ws.config.values.get("store") or "sqlite"
    if not (isinstance(url, str) and url.strip() == "sqlite"):
        return False
    items = read_file_index(ws)
    if items is not None:
        return not items
    from .atomic import json_names

    try:
        return not json_names(ws.files.claims)
    except OSError:
        return False


def _scan_items(ws) -> dict:
    """{item: prefix} of every unreleased path claim, from the claim files themselves (no pathlib: a claim's
    first use of the index runs this)."""
    from .atomic import json_names, read_json
    from .rules.claims import _is_record

    out = {}
    folder = ws.files.claims
    try:
        names = json_names(folder)
    except NotADirectoryError:
        return out
    for name in names:
        try:
            doc = read_json(os.path.join(folder, name))
        except (OSError, ValueError):
            continue
        if _is_record(doc) and is_path_item(doc["item"]) and not doc.get("released_at"):
            out[doc["item"]] = index_prefix(doc["item"])
    return out


def _write_file_index(ws, items: dict) -> None:
    from .atomic import atomic_write_json

    atomic_write_json(index_path(ws), {"schema_version": INDEX_VERSION, "items": items})


def file_index_change(ws, item: str, held: bool) -> None:
    """Put `item` in the index (`held`) or take it out; under the path-claims lock. A missing index is
    rebuilt from the claim files first."""
    items = read_file_index(ws, fresh=True)
    if items is None:
        items = _scan_items(ws)
    elif (item in items) == held:
        return
    if held:
        items[item] = index_prefix(item)
    else:
        items.pop(item, None)
    _write_file_index(ws, items)


def file_candidates(ws, prefixes, under: str | None = None) -> list[str]:
    """The items of the index whose prefix is in `prefixes`, or lies under `under` (a prefix, "" for
    everything); without an index, the same from the claim files."""
    items = read_file_index(ws)
    if items is None:
        items = _scan_items(ws)
    wanted = set(prefixes)
    below = None if under is None else (under + "/" if under else "")
    return [item for item, prefix in items.items()
            if prefix in wanted or (below is not None and prefix.startswith(below) and prefix != under)]


def file_records(ws, items) -> dict:
    """{item: its claim record} read afresh from the claim files (unreadable or missing ones left out)."""
    from .claims import file_document
    from .errors import SynapolisError

    out = {}
    for item in items:
        try:
            record, _existed = file_document(ws, item)
        except SynapolisError:
            continue
        if record is not None:
            out[item] = record
    return out


# --- the questions ---------------------------------------------------------------------------------

def _held(record: dict, now: datetime) -> bool:
    from .rules.claims import claim_state

    return claim_state(record, now) == "held"


def holders_of(ws, rel_paths: list[str], now: datetime) -> dict[str, list[dict]]:
    """{path: [records of claims held at `now` whose pattern matches it]} for normalised project-relative
    paths (lower-cased when the project's file system ignores case)."""
    from .project import project_of
    _root, fold = project_of(ws)
    store = ws.store
    keys = {path: prefixes_of(path.lower()) for path in rel_paths}
    wanted = sorted({p for ps in keys.values() for p in ps})
    candidates = store.path_claim_candidates(wanted)
    if not candidates:
        return {}
    by_prefix: dict[str, list[tuple[str, tuple]]] = {}
    for item in candidates:
        by_prefix.setdefault(index_prefix(item), []).append((item, compile_pattern(item, fold)))
    hits: dict[str, list[str]] = {}
    for path, prefixes in keys.items():
        for prefix in prefixes:
            for item, compiled in by_prefix.get(prefix, ()):
                if matches(compiled, path):
                    hits.setdefault(path, []).append(item)
    if not hits:
        return {}
    records = store.claim_records(sorted({i for items in hits.values() for i in items}))
    out: dict[str, list[dict]] = {}
    for path, items in hits.items():
        for item in items:
            record = records.get(item)
            if record is not None and _held(record, now):
                out.setdefault(path, []).append(record)
    return out


def overlapping(slot, item: str, now: datetime, fold: bool) -> list[dict]:
    """The records of the claims held at `now` whose pattern overlaps the path pattern `item` (itself left
    out), read through `slot`, which holds the path-claims lock."""
    prefix = index_prefix(item)
    candidates = [c for c in slot.path_claim_candidates(lines_of(prefix), under=prefix) if c != item]
    if not candidates:
        return []
    mine = compile_pattern(item, fold)
    hits = [c for c in candidates if overlaps_compiled(mine, compile_pattern(c, fold))]
    if not hits:
        return []
    records = slot.claim_records(hits)
    return [records[c] for c in hits if c in records and _held(records[c], now)]
