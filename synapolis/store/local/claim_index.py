"""The local store's path-claims index: `claims-index.json` ({item: prefix}), rebuilt from the claim files when lost."""

from __future__ import annotations

import os

from ...atomic import atomic_write_json, json_names, read_json
from ..claim_keys import index_prefix, is_claim_record, is_path_item

INDEX_FILE = "claims-index.json"
INDEX_VERSION = 1


def index_path(ws) -> str:
    return os.path.join(ws.files.root, INDEX_FILE)


# inside one_reading(), by thread: {thread id: {index path: what it read}}. By thread, because the team server
# decides sandboxes' pre-tool events on worker threads at once (web/api_call.run_hook): one reading shared by
# all was put back by whichever block left last, after the other had ended, and stayed for good (a path claimed
# later was let through). `_thread` is loaded in every process already: no import on a hook's path
_HELD_READS: dict[int, dict] = {}


class one_reading:
    """`with one_reading():` the index is read at most once in the body, and every reader in it gets that
    reading (a hook asks file_candidates, then the guard asks again: one parse of a big index, not two).
    The answers are those of a guard that ran at the moment of that read; nothing is kept after the body.
    For pure queries only: a claim or release must not run inside (its overlap check must see the index as
    it is under the path-claims lock; the writer's own update reads afresh regardless). One thread's block
    is its own: another thread's readers read afresh."""

    def __enter__(self):
        from _thread import get_ident

        self.thread = get_ident()
        self.outer = _HELD_READS.get(self.thread)
        _HELD_READS[self.thread] = {} if self.outer is None else self.outer
        return self

    def __exit__(self, *exc):
        if self.outer is None:
            _HELD_READS.pop(self.thread, None)
        else:
            _HELD_READS[self.thread] = self.outer
        return False


def read_file_index(ws, fresh: bool = False) -> dict | None:
    """{item: prefix}, or None when there is no usable index (never written, removed, damaged). `fresh`: read
    the file even inside one_reading() (a writer changes what it read)."""
    path = index_path(ws)
    held = None
    if _HELD_READS:
        from _thread import get_ident

        held = _HELD_READS.get(get_ident())
    if held is not None and path in held and not fresh:
        found = held[path]
        return None if found is None else dict(found)
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict) or doc.get("schema_version") != INDEX_VERSION or not isinstance(doc.get("items"), dict):
        items = None
    else:
        items = doc["items"]
    if held is not None:
        held[path] = None if items is None else dict(items)
    return items


def _scan_items(ws) -> dict:
    """{item: prefix} of every unreleased path claim, from the claim files themselves (no pathlib: a claim's
    first use of the index runs this)."""
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
        if is_claim_record(doc) and is_path_item(doc["item"]) and not doc.get("released_at"):
            out[doc["item"]] = index_prefix(doc["item"])
    return out


def _write_file_index(ws, items: dict) -> None:
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
