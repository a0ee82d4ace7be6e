"""The shared whiteboard (`session_state` in session.db) and the notes bus (`notes.jsonl`) of a session."""

from __future__ import annotations

from datetime import datetime

from .atomic import JsonlLog, iter_jsonl_backwards, locked
from .errors import NotFoundError, UsageError
from .names import check_content, check_limit, check_text
from .sessions import ts
from .timeutil import format_ts

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


# -- notes bus -------------------------------------------------------------------------------------

def _last_seq(path) -> int:
    """The seq of the last complete note, reading backwards from the end (a torn tail is skipped)."""
    for record in iter_jsonl_backwards(path):
        if type(record.get("seq")) is int:
            return record["seq"]
    return 0


def check_note(text, config) -> str:
    """The note's text, or UsageError before anything is written."""
    return check_content(text, "note", config)


class note_appender:
    """`with note_appender(ws, sid) as add:` — `add(tx, agent_id, text, now)` appends one note and returns it
    (the store's note_appender: `tx` is the verb's write transaction, which the file does not need).

    The session's notes lock is held for the whole body, so `seq` is unique and increasing; when the body
    raises after the append (the same verb's store transaction failed), the note is taken back, so a
    verb that fails has appended nothing and a retry never duplicates it. (A class, as atomic.locked:
    contextlib stays off the hot verbs' imports.)
    """

    def __init__(self, ws, session_id: str):
        self.ws = ws
        self.path = ws.files.session_notes(session_id)  # a str: a `note` never loads pathlib
        self.lock = locked(ws.files.lock(f"notes.{session_id}"))
        self.log = JsonlLog(self.path)
        self.appended: list[int] = []  # where each append began

    def __enter__(self):
        self.lock.__enter__()
        try:
            self.log.__enter__()
        except BaseException:
            self.lock.__exit__(None, None, None)
            raise
        return self.add

    def add(self, tx, agent_id: str, text: str, now: datetime, key: str | None = None) -> dict:
        check_note(text, self.ws.config)
        record = {"seq": _last_seq(self.path) + 1, "at": format_ts(now, micro=True), "agent_id": agent_id,
                  "text": text}
        self.appended.append(self.log.append(record))
        if key is not None:  # KeyTaken when this agent appended a note with it already: this line is taken back
            tx.remember_note(agent_id, key, record, record["at"])
        return record

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is not None and self.appended:
                self.log.undo(self.appended[0])
        finally:
            try:
                self.log.__exit__(kind, value, traceback)
            finally:
                self.lock.__exit__(kind, value, traceback)


def append_note(ws, session_id: str, agent_id: str, text: str, now: datetime) -> dict:
    """Append one note; `seq` is assigned under a per-session lock, so it is unique and increasing."""
    check_note(text, ws.config)
    with note_appender(ws, session_id) as add:
        return add(None, agent_id, text, now)


def read_notes(ws, session_id: str, limit: int = 50) -> list[dict]:
    """The newest `limit` notes, oldest first, read backwards from the end of the file: the cost is the
    newest notes, not the whole bus."""
    check_limit(limit, optional=False)
    newest = []
    for record in iter_jsonl_backwards(ws.files.session_notes(session_id)):
        if _is_note(record):
            newest.append(record)
            if len(newest) >= limit:
                break
    newest.reverse()
    return newest


def _is_note(record: dict) -> bool:
    # a hand-edited or damaged line is skipped like a torn one: every reader may rely on these four
    return (type(record.get("seq")) is int and isinstance(record.get("at"), str)
            and isinstance(record.get("agent_id"), str) and isinstance(record.get("text"), str))
