"""The guard's event record on the state directory's own files (the SQLite store): guard-events.json, newest kept."""

from __future__ import annotations

import os

FILE = "guard-events.json"
LOCK = "guard-events"
FORMAT = 1


def _path(ws) -> str:
    return os.path.join(ws.files.root, FILE)


def _read(path: str) -> list[dict]:
    from ..atomic import read_json_or

    doc = read_json_or(path)
    events = doc.get("events") if isinstance(doc, dict) else None
    # a damaged or hand-edited file: what is readable of it, never a failure of the refusal that records
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def record(ws, event: dict, keep: int) -> None:
    """Append `event`, keeping the newest `keep`, under the record's lock (two refusals at once both stay)."""
    from ..atomic import atomic_write_json, locked

    path = _path(ws)
    with locked(ws.files.lock(LOCK), timeout=ws.config.busy_timeout_ms / 1000.0):
        events = (_read(path) + [event])[-keep:]
        # not durable: an event lost to a power cut costs a line on a page, and a hook pays no fsync for it
        atomic_write_json(path, {"format": FORMAT, "events": events}, durable=False, mode=0o644)


def recent(ws, limit: int) -> list[dict]:
    """The newest `limit` events, newest first; without locking (the file is replaced whole)."""
    if limit <= 0:
        return []
    return _read(_path(ws))[-limit:][::-1]
