"""The PostgreSQL store's transaction on one session: locking, the registry, rates, the whiteboard, memories."""

from __future__ import annotations

import contextlib

from .. import base
from .driver import _dump
from .signals import _COLS, PostgresSignalTransaction


class PostgresTransaction(PostgresSignalTransaction):
    """One transaction on one session's rows of the shared database: the signals' part (signals.py) and
    the rest."""

    # -- the registry ------------------------------------------------------------------------------
    def agent(self, agent_id):
        return self._one("SELECT * FROM agents WHERE session_id = %s AND id = %s", (self.session_id, agent_id))

    def agents(self, ids=None):
        if ids is None:
            return self._all("SELECT * FROM agents WHERE session_id = %s ORDER BY id", (self.session_id,))
        return self._all("SELECT * FROM agents WHERE session_id = %s AND id = ANY(%s) ORDER BY id",
                         (self.session_id, list(ids)))

    def register_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.cur.execute("INSERT INTO agents (session_id, id, harness, substrate, status, last_heartbeat, run_token, "
                         "joined_at, joined_seq, read_upto, delivered_upto, started_at) "
                         "VALUES (%s, %s, %s, %s, 'active', %s, %s, %s, %s, 0, 0, %s)",
                         (self.session_id, agent_id, harness, substrate, stamp, run_token, stamp,
                          self.max_sequence(), stamp))

    def restart_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.cur.execute("UPDATE agents SET harness = %s, substrate = %s, status = 'active', last_heartbeat = %s, "
                         "run_token = %s, started_at = %s WHERE session_id = %s AND id = %s",
                         (harness, substrate, stamp, run_token, stamp, self.session_id, agent_id))

    def refresh_agent(self, agent_id, stamp, status):
        self.cur.execute("UPDATE agents SET last_heartbeat = %s, status = %s WHERE session_id = %s AND id = %s",
                         (stamp, status, self.session_id, agent_id))

    def count_live(self, cutoff, exclude=None, *, ceiling):
        row = self._one("SELECT COUNT(*) AS n FROM agents WHERE session_id = %s AND status = 'active' "
                        "AND last_heartbeat >= %s AND last_heartbeat <= %s AND id IS DISTINCT FROM %s",
                        (self.session_id, cutoff, ceiling, exclude))
        return int(row["n"])

    def flag_stale(self, cutoff, *, ceiling):
        return self._all("UPDATE agents a SET status = 'stale' FROM agents b "
                         "WHERE a.session_id = %s AND a.status IN ('active', 'idle') "
                         "AND (a.last_heartbeat IS NULL OR a.last_heartbeat < %s OR a.last_heartbeat > %s) "
                         "AND b.session_id = a.session_id AND b.id = a.id "
                         "RETURNING a.id, b.status, a.last_heartbeat", (self.session_id, cutoff, ceiling))

    def raise_lamport(self, agent_id, value):
        self.cur.execute("UPDATE agents SET lamport = %s WHERE session_id = %s AND id = %s AND lamport < %s",
                         (value, self.session_id, agent_id, value))

    def set_delivered_upto(self, agent_id, mark):
        self.cur.execute("UPDATE agents SET delivered_upto = %s WHERE session_id = %s AND id = %s "
                         "AND delivered_upto < %s", (mark, self.session_id, agent_id, mark))

    def set_read_upto(self, agent_id, mark):
        # GREATEST: two acks of one agent at once each move it only past what they saw read
        self.cur.execute("UPDATE agents SET read_upto = GREATEST(read_upto, %s), "
                         "delivered_upto = GREATEST(delivered_upto, %s) WHERE session_id = %s AND id = %s",
                         (mark, mark, self.session_id, agent_id))

    # -- heartbeat copies ------------------------------------------------------------------------
    def put_heartbeat(self, doc, stamp):
        _put_heartbeat(self.cur, doc, stamp)

    # -- the rate limit ----------------------------------------------------------------------------
    def rate_bucket(self, agent_id):
        # FOR UPDATE: two sends of one agent on two machines cannot both spend one token
        return self._one("SELECT tokens, updated_at FROM rate_buckets WHERE session_id = %s AND agent_id = %s "
                         "FOR UPDATE", (self.session_id, agent_id))

    def set_rate_bucket(self, agent_id, tokens, updated_at):
        self.cur.execute("INSERT INTO rate_buckets (session_id, agent_id, tokens, updated_at) VALUES (%s, %s, %s, %s) "
                         "ON CONFLICT (session_id, agent_id) DO UPDATE SET tokens = excluded.tokens, "
                         "updated_at = excluded.updated_at", (self.session_id, agent_id, tokens, updated_at))

    # -- the whiteboard ----------------------------------------------------------------------------
    def whiteboard_set(self, key, value, agent_id, stamp):
        self.cur.execute("INSERT INTO session_state (session_id, key, value, updated_by, updated_at) "
                         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session_id, key) DO UPDATE SET "
                         "value = excluded.value, updated_by = excluded.updated_by, updated_at = excluded.updated_at",
                         (self.session_id, key, value, agent_id, stamp))

    def whiteboard_get(self, key):
        return self._one("SELECT key, value, updated_by, updated_at FROM session_state "
                         "WHERE session_id = %s AND key = %s", (self.session_id, key))

    def whiteboard_all(self):
        return self._all("SELECT key, value, updated_by, updated_at FROM session_state WHERE session_id = %s "
                         "ORDER BY key", (self.session_id,))

    # -- staged memories ---------------------------------------------------------------------------
    def stage_memory(self, memory_id, agent_id, data, stamp):
        return self._one("INSERT INTO staged_memories (session_id, id, agent_id, memory_data, created_at) "
                         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1 AS added",
                         (self.session_id, memory_id, agent_id, data, stamp)) is not None

    def staged_memories(self):
        return self._all("SELECT id, agent_id, memory_data, created_at FROM staged_memories WHERE session_id = %s "
                         "ORDER BY created_at, staged_seq", (self.session_id,))

    def unstage(self, memory_ids):
        self.cur.execute("DELETE FROM staged_memories WHERE session_id = %s AND id = ANY(%s)",
                         (self.session_id, list(memory_ids)))

    def count_staged(self):
        return int(self._one("SELECT COUNT(*) AS n FROM staged_memories WHERE session_id = %s",
                             (self.session_id,))["n"])

    # -- idempotency keys --------------------------------------------------------------------------
    def signal_by_key(self, sender, key):
        return self._one(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.sender = %s "
                         "AND s.idempotency_key = %s", (self.session_id, sender, key))

    def note_by_key(self, agent_id, key):
        row = self._one("SELECT seq, at, agent_id, text FROM notes WHERE session_id = %s AND agent_id = %s "
                        "AND idempotency_key = %s", (self.session_id, agent_id, key))
        return None if row is None else {"seq": int(row["seq"]), "at": row["at"], "agent_id": row["agent_id"],
                                         "text": row["text"]}


def _put_heartbeat(cur, doc: dict, stamp: str) -> None:
    cur.execute("INSERT INTO heartbeats (agent_id, host, session_id, doc, received_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (agent_id) DO UPDATE SET host = excluded.host, "
                "session_id = excluded.session_id, doc = excluded.doc, received_at = excluded.received_at",
                (doc["agent_id"], doc.get("host"), doc.get("session_id"), _dump(doc), stamp))


class PostgresSessionStore(base.SessionStore):
    """One session's rows in the shared database, through the process's connection."""

    def __init__(self, backend, session_id: str):  # backend: the PostgresStore (store.py)
        self.backend = backend
        self.session_id = session_id
        self.busy_timeout_ms = backend.busy_timeout_ms
        self.audience = None  # a broadcast's audience, kept while the session's epoch holds (audience.py)

    @contextlib.contextmanager
    def write(self):
        # (a rollback leaves `audience` as it is: send_signal keeps none read by a transaction that changed the
        # registry, so it holds only what others committed)
        with self.backend.transaction("BEGIN") as cur:
            yield PostgresTransaction(cur, self.session_id, True, self)

    def forget_audience(self) -> None:
        self.audience = None

    @contextlib.contextmanager
    def read(self):
        # one snapshot for every query of the body
        with self.backend.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            yield PostgresTransaction(cur, self.session_id, False)

    def close(self) -> None:
        """The connection belongs to the process's store; nothing to give back."""
