"""The shared whiteboard (`session_state` in session.db) and the notes bus (`notes.jsonl`) of a session."""

from __future__ import annotations

from datetime import datetime

from .errors import NotFoundError, UsageError
from .names import check_content, check_text
from .sessions import ts
from .store.local.notes import check_note, last_seq as _last_seq, note_appender, read_notes  # noqa: F401

MAX_KEY = 200


def check_key(key) -> str:
    if not isinstance(key, str) or not key.strip():
        raise UsageError("whiteboard key must not be empty")
    if len(key) > MAX_KEY:
        raise UsageError(f"whiteboard key is longer than {MAX_KEY} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UsageError("whiteboard key may not contain control characters")
    return check_text(key, "whiteboard key")


def _entry(row) -> dict:
    return {"key": row["key"], "value": row["value"], "updated_by": row["updated_by"], "updated_at": row["updated_at"]}


# -- whiteboard ------------------------------------------------------------------------------------

def write_entry(tx, key: str, value: str, agent_id: str, now: datetime, config) -> dict:
    """Inside a write transaction: set `key` to `value` (last writer wins, with who and when)."""
    check_key(key)
    check_content(value, "whiteboard value", config, allow_empty=True)
    stamp = ts(now)
    tx.whiteboard_set(key, value, agent_id, stamp)
    return {"key": key, "value": value, "updated_by": agent_id, "updated_at": stamp}


def read_entry(tx, key: str) -> dict:
    check_key(key)
    row = tx.whiteboard_get(key)
    if row is None:
        raise NotFoundError(f"no whiteboard key {key!r}")
    return _entry(row)


def read_entries(tx) -> list[dict]:
    return [_entry(r) for r in tx.whiteboard_all()]


# -- notes bus (its file is the store's: store/local/notes.py) -------------------------------------------

def append_note(ws, session_id: str, agent_id: str, text: str, now: datetime) -> dict:
    """Append one note; `seq` is assigned under a per-session lock, so it is unique and increasing."""
    check_note(text, ws.config)
    with note_appender(ws, session_id) as add:
        return add(None, agent_id, text, now)
