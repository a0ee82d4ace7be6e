"""Who holds a path (contract §14): the path claims that may be held, indexed by literal prefix, and the
overlap check a path claim passes before it is granted.

Every path claim is keyed by its pattern's leading literal segments, lower-cased (`src/api` for
`src/api/*.py`, "" for `**/*.md`): a path can only match a pattern whose prefix is one of the path's
own leading runs of segments, and two patterns can only overlap when one's prefix leads the other's.
So "who holds `src/api/users.py`" looks at five keys, not at every claim, and a claim of `src/api/**`
looks at the keys on its own line. The index is only a filter: each candidate's pattern is then
matched exactly (pathpatterns) and its claim record read afresh, so the record stays the truth.

On the SQLite store the index is `state/claims-index.json` ({item: prefix} of every path claim that
may be held), changed under the path-claims lock (store/local/claims.py, file_slot): an item is added before its claim
file is written and removed after its release is, so a crash leaves at most an extra candidate, never
a missing one. A missing or unreadable index is rebuilt from the claim files by the next writer, and a
reader scans the claim files meanwhile. On PostgreSQL it is the table `claim_paths`, changed in the
claim's own transaction.
"""

from __future__ import annotations

import os
from datetime import datetime

from .pathpatterns import compile_pattern, matches, overlaps_compiled, prefixes_of
# the index itself is the store's (store/claim_keys.py: the key; store/local/claim_index.py: the SQLite store's
# file): re-exported here, where the guard and the hooks have always found it
from .store.claim_keys import index_prefix, is_path_item, lines_of  # noqa: F401
from .store.local.claim_index import (INDEX_FILE, INDEX_VERSION, file_candidates, file_index_change,  # noqa: F401
                                      index_path, one_reading, read_file_index)


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
    # a claim item is ASCII (names.validate_claim_item), so is its prefix: a path's non-ASCII prefix matches
    # none, and one holding a surrogate (a file name git gave in bytes that are not UTF-8) is no text a
    # database takes (PostgreSQL refused the whole guard: exit 1, and git's hook let the commit through)
    wanted = sorted({p for ps in keys.values() for p in ps if p.isascii()})
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
