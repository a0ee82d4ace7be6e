"""The local store's notes bus: `sessions/<id>/notes.jsonl`, appended under the session's notes lock (contract §8)."""

from __future__ import annotations

from datetime import datetime

from ...atomic import JsonlLog, iter_jsonl_backwards, locked
from ...names import check_content, check_limit
from ...timeutil import format_ts


def last_seq(path) -> int:
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
        record = {"seq": last_seq(self.path) + 1, "at": format_ts(now, micro=True), "agent_id": agent_id,
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


def read_notes(ws, session_id: str, limit: int = 50) -> list[dict]:
    """The newest `limit` notes, oldest first, read backwards from the end of the file: the cost is the
    newest notes, not the whole bus."""
    check_limit(limit, optional=False)
    newest = []
    for record in iter_jsonl_backwards(ws.files.session_notes(session_id)):
        if is_note(record):
            newest.append(record)
            if len(newest) >= limit:
                break
    newest.reverse()
    return newest


def is_note(record: dict) -> bool:
    # a hand-edited or damaged line is skipped like a torn one: every reader may rely on these four
    return (type(record.get("seq")) is int and isinstance(record.get("at"), str)
            and isinstance(record.get("agent_id"), str) and isinstance(record.get("text"), str))
