"""The PostgreSQL store itself (`PostgresStore`): sessions, heartbeat copies, claims, notes, ledger and incidents."""

from __future__ import annotations

import contextlib
import json
import threading

from ...errors import NotFoundError
from .claims import ClaimSlot, WaitBook, _claim_records, _path_claim_candidates, _waits
from .connection import PostgresConnection
from .driver import _LOCK, CONNECT_TIMEOUT_S, NOTIFY_CHANNEL, _dump, _key, _key_taken, psycopg
from .incidents import EscalationBook, _current_incidents
from .transaction import PostgresSessionStore, _put_heartbeat


class PostgresStore(PostgresConnection):
    """The shared database named by a postgresql:// URL: each record family's rows, through the transactions of
    its connection (connection.py)."""

    # -- sessions ----------------------------------------------------------------------------------
    def _session_row(self, cur, session_id):
        cur.execute("SELECT session_id, status, created_at, ended_at, reopened_at FROM sessions "
                    "WHERE session_id = %s", (session_id,))
        return cur.fetchone()

    @staticmethod
    def _document(row) -> dict:
        doc = {k: row[k] for k in ("session_id", "status", "created_at", "ended_at")}
        if row.get("reopened_at"):
            doc["reopened_at"] = row["reopened_at"]
        return doc

    def open_session(self, session_id: str, create: bool = False) -> PostgresSessionStore:
        if create:
            self.create_session(session_id, _stamp(self))
        elif not self.session_exists(session_id):
            raise NotFoundError(f"unknown session {session_id!r} in store {self.where}")
        return PostgresSessionStore(self, session_id)

    def session_exists(self, session_id: str) -> bool:
        with self.transaction() as cur:
            return self._session_row(cur, session_id) is not None

    def create_session(self, session_id: str, created_at: str) -> bool:
        with self.transaction() as cur:
            cur.execute("INSERT INTO sessions (session_id, status, created_at) VALUES (%s, 'active', %s) "
                        "ON CONFLICT DO NOTHING RETURNING 1 AS created", (session_id, created_at))
            return cur.fetchone() is not None

    def read_session(self, session_id: str) -> dict:
        with self.transaction() as cur:
            row = self._session_row(cur, session_id)
        if row is None:
            raise NotFoundError(f"unknown session {session_id!r}")
        return self._document(row)

    def list_sessions(self) -> list[dict]:
        with self.transaction() as cur:
            cur.execute("SELECT session_id, status, created_at, ended_at, reopened_at FROM sessions "
                        "ORDER BY session_id")
            return [self._document(r) for r in cur.fetchall()]

    def set_session_status(self, session_id: str, status: str, stamp: str) -> dict:
        with self.transaction() as cur:
            if status == "ended":
                cur.execute("UPDATE sessions SET status = 'ended', ended_at = %s WHERE session_id = %s "
                            "RETURNING *", (stamp, session_id))
            else:
                cur.execute("UPDATE sessions SET status = %s, ended_at = NULL, reopened_at = %s "
                            "WHERE session_id = %s RETURNING *", (status, stamp, session_id))
            row = cur.fetchone()
        if row is None:
            raise NotFoundError(f"unknown session {session_id!r}")
        return self._document(row)

    def put_heartbeat_copy(self, doc, stamp):
        with self.transaction() as cur:
            _put_heartbeat(cur, doc, stamp)

    def heartbeat_copies(self):
        with self.transaction() as cur:
            cur.execute("SELECT doc, received_at FROM heartbeats ORDER BY agent_id")
            rows = cur.fetchall()
        copies = []
        for row in rows:
            with contextlib.suppress(ValueError):
                doc = json.loads(row["doc"])
                if isinstance(doc, dict):
                    copies.append({**doc, "received_at": row["received_at"]})
        return copies

    def heartbeat_copy(self, agent_id):
        with self.transaction() as cur:
            cur.execute("SELECT doc, received_at FROM heartbeats WHERE agent_id = %s", (agent_id,))
            row = cur.fetchone()
        if row is None:
            return None
        try:
            doc = json.loads(row["doc"])
        except ValueError:
            return None
        return {**doc, "received_at": row["received_at"]} if isinstance(doc, dict) else None

    # -- claims --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def claim_slot(self, item):
        """The item's advisory lock for one transaction: one winner per item across every machine, and
        the token drawn from the row, which is never deleted, so it never goes back."""
        from ..claim_keys import is_path_item

        with self.transaction() as cur:
            if is_path_item(item):
                # every change of a path claim takes one lock first, so of two overlapping patterns only one
                # wins (§14), on every machine; then the item's own
                cur.execute(_LOCK, (_key("claim-paths"),))
            cur.execute(_LOCK, (_key("claim", item),))
            cur.execute("SELECT record FROM claims WHERE item = %s", (item,))
            row = cur.fetchone()
            yield ClaimSlot(cur, item, row)

    def path_claim_candidates(self, prefixes, under=None):
        with self.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            return _path_claim_candidates(cur, prefixes, under)

    def claim_records(self, items):
        with self.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            return _claim_records(cur, items)

    @contextlib.contextmanager
    def wait_book(self):
        """The waiters under one advisory lock for the transaction: one wait-for graph across every machine."""
        with self.transaction() as cur:
            cur.execute(_LOCK, (_key("claim-waits"),))
            yield WaitBook(cur)

    def waits(self):
        with self.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            return _waits(cur)

    def claim_document(self, item):
        with self.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            cur.execute("SELECT record FROM claims WHERE item = %s", (item,))
            row = cur.fetchone()
        slot = ClaimSlot(None, item, row)
        return slot.record, slot.existed

    def claim_documents(self):
        with self.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            cur.execute("SELECT item, record FROM claims ORDER BY item")
            rows = cur.fetchall()
        out = []
        for row in rows:
            try:
                out.append((json.loads(row["record"]), row["item"], "does not look like a claim record"))
            except ValueError as exc:
                out.append((None, row["item"], str(exc)))
        return out

    # -- the notes bus -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def note_appender(self, session_id):
        from ..local.notes import check_note
        from ...timeutil import format_ts

        def add(tx, agent_id, text, now, key=None):
            check_note(text, self.ws.config)
            tx.exclusive("notes")  # seq = the last + 1, one appender at a time; in the verb's transaction
            try:
                tx.cur.execute("INSERT INTO notes (session_id, seq, at, agent_id, text, idempotency_key) "
                               "SELECT %s, COALESCE(max(seq), 0) + 1, %s, %s, %s, %s FROM notes WHERE session_id = %s "
                               "RETURNING seq",
                               (session_id, format_ts(now, micro=True), agent_id, text, key, session_id))
            except psycopg.Error as exc:
                _key_taken(exc, "notes_by_key", key)  # this agent appended a note with this key already
                raise
            seq = int(tx.cur.fetchone()["seq"])
            tx.cur.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, session_id))
            return {"seq": seq, "at": format_ts(now, micro=True), "agent_id": agent_id, "text": text}

        yield add

    def read_notes(self, session_id, limit):
        with self.transaction() as cur:
            cur.execute("SELECT seq, at, agent_id, text FROM (SELECT * FROM notes WHERE session_id = %s "
                        "ORDER BY seq DESC LIMIT %s) n ORDER BY seq", (session_id, int(limit)))
            return [dict(r) for r in cur.fetchall()]

    def notes_version(self, session_id):
        with self.transaction() as cur:
            cur.execute("SELECT COALESCE(max(seq), 0) AS v FROM notes WHERE session_id = %s", (session_id,))
            return int(cur.fetchone()["v"])

    # -- the memory ledger -------------------------------------------------------------------------
    def append_ledger(self, tx, merged, *, session_id, merged_by, reader=None):
        """In the consolidating transaction itself: the lines and the cleared staging commit together."""
        from ...names import validate_agent_id
        from ..ledger import LedgerHoldings

        validate_agent_id(merged_by)
        stamped = [{**line, "session_id": session_id, "merged_by": merged_by} for line in merged]
        tx.cur.execute(_LOCK, (_key("ledger"),))  # one consolidation at a time reads and extends it
        tx.cur.execute("SELECT line FROM memory_ledger ORDER BY seq")
        holdings = LedgerHoldings()
        for row in tx.cur.fetchall():
            with contextlib.suppress(ValueError):
                line = json.loads(row["line"])
                if isinstance(line, dict):
                    holdings.add(line)
        fresh, held = holdings.split(stamped)
        if fresh:
            tx.cur.executemany("INSERT INTO memory_ledger (id, session_id, merged_by, merged_at, line) "
                               "VALUES (%s, %s, %s, %s, %s)",
                               [(line.get("id"), session_id, merged_by, line.get("merged_at"),
                                 _dump(line)) for line in fresh])
        return fresh, held

    def _json_objects(self, sql: str) -> list[dict]:
        """The first column of each row of `sql`, decoded: the JSON objects (anything else skipped)."""
        with self.transaction() as cur:
            cur.execute(sql)
            rows = cur.fetchall()
        found = []
        for row in rows:
            with contextlib.suppress(ValueError):
                value = json.loads(next(iter(row.values())))
                if isinstance(value, dict):
                    found.append(value)
        return found

    def read_ledger(self):
        return self._json_objects("SELECT line FROM memory_ledger ORDER BY seq")

    def ledger_location(self):
        return f"{self.where} (table memory_ledger)"

    # -- escalation incidents ------------------------------------------------------------------------
    @contextlib.contextmanager
    def escalation_book(self):
        """One escalation writer at a time across every machine: a session-level advisory lock on a
        connection of its own (waiting at most busy_timeout_ms), released with it."""
        conn = self._connect()
        try:
            try:
                conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_key("escalation"),))
                yield EscalationBook(conn, self.ws.paths)
            except psycopg.Error as exc:
                raise self._translate(exc) from None
        finally:
            conn.close()  # the lock goes with the connection

    def incidents(self):
        with self.transaction() as cur:
            return _current_incidents(cur)

    def incident_log(self):
        return self._json_objects("SELECT record FROM escalation_events ORDER BY seq")

    def record_event(self, event, keep):
        from .events import record

        record(self, event, keep)

    def recent_events(self, limit):
        from .events import recent

        return recent(self, limit)

    # -- across machines ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive_pass(self, name: str, lock_path):
        """One pass of `name` at a time across every machine: a session-level advisory lock on a
        connection of its own, held for the pass (and the local file lock too)."""
        from ...atomic import locked

        with locked(lock_path, blocking=False) as got_local:
            if not got_local:
                yield False
                return
            conn = self._connect()
            try:
                got = bool(conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS got",
                                        (_key("pass", name),)).fetchone()["got"])
                yield got
            finally:
                conn.close()  # the lock goes with the connection

    def listen(self, on_change, stop: threading.Event, retry_s: float = 1.0) -> threading.Thread:
        """Call `on_change(session_id)` for every signal stored on any machine (LISTEN/NOTIFY), and
        `on_change(None)` ("re-check everything") after each (re)connection, since notifications sent
        while disconnected are lost. Runs on a daemon thread until `stop` is set."""

        def run():
            while not stop.is_set():
                try:
                    conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                           application_name="synapolis-listen",
                                           **({} if self._password is None else {"password": self._password}))
                except Exception:  # noqa: BLE001 - unreachable: try again shortly
                    stop.wait(retry_s)
                    continue
                try:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    on_change(None)
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5, stop_after=64):
                            on_change(note.payload)
                except Exception:  # noqa: BLE001 - a dropped connection: reconnect and re-check
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        conn.close()
                stop.wait(retry_s)

        thread = threading.Thread(target=run, name="synapolis-pg-listen", daemon=True)
        thread.start()
        return thread


def _stamp(store) -> str:
    from ...timeutil import format_ts

    return format_ts(store.now())
