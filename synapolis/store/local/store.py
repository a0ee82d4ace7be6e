"""The SQLite store itself (`SqliteStore`): sessions as `session.json` files, and the families it keeps as files."""

from __future__ import annotations

import os

from ...errors import NotFoundError
from .. import base
from .connection import SessionStore


class SqliteStore(base.Store):
    """The embedded default: one session.db per session, session.json beside it, the rest in files."""

    kind = "sqlite"

    def __init__(self, ws):
        self.ws = ws

    def open_session(self, session_id: str, create: bool = False) -> SessionStore:
        return SessionStore.open(self.ws, session_id, create=create)

    def note_appender(self, session_id):
        from .notes import note_appender

        # notes.jsonl under its lock; a note whose transaction fails is taken back (notes.note_appender)
        return note_appender(self.ws, session_id)

    def read_notes(self, session_id, limit):
        from .notes import read_notes

        return read_notes(self.ws, session_id, limit)

    def notes_version(self, session_id):
        try:
            return os.stat(self.ws.files.session_notes(session_id)).st_size  # the bus grows by appends only
        except OSError:
            return 0

    def append_ledger(self, tx, merged, *, session_id, merged_by, reader=None):
        from .ledger import append_to_ledger

        # the file, under its own lock; a crash before the database commits is made safe by skipping
        # what the ledger holds on the retry (sleep.consolidate)
        return append_to_ledger(self.ws.paths, merged, session_id=session_id, merged_by=merged_by, reader=reader)

    def read_ledger(self):
        from .ledger import read_ledger

        return read_ledger(self.ws.paths)

    def ledger_location(self):
        return str(self.ws.paths.memory_ledger)

    def session_signature(self, session_id: str):
        try:
            st = os.stat(self.ws.files.session_db(session_id))
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def session_exists(self, session_id: str) -> bool:
        return os.path.exists(self.ws.files.session_json(session_id))

    def create_session(self, session_id: str, created_at: str) -> bool:
        from ...atomic import atomic_write_json, locked

        path = self.ws.files.session_json(session_id)
        with locked(self.ws.paths.lock(f"session.{session_id}")):
            SessionStore.open(self.ws, session_id, create=True).close()
            if os.path.exists(path):
                return False
            atomic_write_json(path, {"session_id": session_id, "status": "active",
                                     "created_at": created_at, "ended_at": None})
        return True

    def read_session(self, session_id: str) -> dict:
        from ...atomic import read_json

        path = self.ws.files.session_json(session_id)  # a str: hooks read this on every call, without pathlib
        try:
            document = read_json(path)
        except FileNotFoundError:
            raise NotFoundError(f"unknown session {session_id!r}") from None
        except (OSError, ValueError) as exc:
            raise NotFoundError(f"session {session_id!r} has an unreadable session.json ({exc})") from None
        if not isinstance(document, dict):
            raise NotFoundError(f"session {session_id!r} has a malformed session.json")
        named = document.get("session_id")
        if isinstance(named, str) and named != session_id:
            # a session is its folder: a copy of one (`cp -a sessions/S sessions/S.bak`) still says S, and
            # counting it as S would list S twice and make every `start` ambiguous
            raise NotFoundError(f"session {session_id!r} has a session.json naming another session {named!r}")
        return document

    def list_sessions(self) -> list[dict]:
        from ...atomic import is_temp_name
        from ...errors import UsageError

        folder = self.ws.files.sessions  # plain strings: a beat that names no session looks here, without pathlib
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for name in names:
            # a session id may start with a dot (§2): only temp names and what is not a folder are skipped
            if is_temp_name(name) or not os.path.isdir(os.path.join(folder, name)):
                continue
            try:
                document = self.read_session(name)
            except (NotFoundError, UsageError):  # a stray folder or broken file is simply not a session
                continue
            found.append(document)
        return found

    def set_session_status(self, session_id: str, status: str, stamp: str) -> dict:
        from ...atomic import atomic_write_json, locked

        with locked(self.ws.paths.lock(f"session.{session_id}")):
            document = self.read_session(session_id)
            document["status"] = status
            if status == "ended":
                document["ended_at"] = stamp
            else:
                document["ended_at"] = None
                document["reopened_at"] = stamp
            atomic_write_json(self.ws.files.session_json(session_id), document)
        return document

    # -- claims (contract §9): the claim files, the index file, the wait book ----------------------------
    def claim_slot(self, item):
        from .claims import file_slot  # the claim files under their file lock

        return file_slot(self.ws, item)

    def claim_document(self, item):
        from .claims import file_document

        return file_document(self.ws, item)

    def claim_documents(self):
        from .claims import file_documents

        return file_documents(self.ws)

    def path_claim_candidates(self, prefixes, under=None):
        from .claim_index import file_candidates

        return file_candidates(self.ws, prefixes, under)

    def claim_records(self, items):
        from .claims import file_records

        return file_records(self.ws, items)

    def wait_book(self):
        from .waits import FileWaitBook  # state/claim-waits.json under its lock

        return FileWaitBook(self.ws)

    def waits(self):
        from .waits import BOOK_FILE, read_file_waits

        return read_file_waits(os.path.join(self.ws.files.root, BOOK_FILE))

    # -- escalation incidents (contract §6): the escalations/ files under their file lock ------------------
    def escalation_book(self):
        from .incidents import file_book

        return file_book(self.ws)

    def incidents(self):
        from .incidents import load_incidents

        return load_incidents(self.ws.paths)

    def incident_log(self):
        from .incidents import file_log

        return file_log(self.ws)

    # -- the guard's events (contract §15): guard-events.jsonl, the newest kept ----------------------------
    def record_event(self, event, keep):
        from .events import record

        record(self.ws, event, keep)

    def recent_events(self, limit):
        from .events import recent

        return recent(self.ws, limit)
