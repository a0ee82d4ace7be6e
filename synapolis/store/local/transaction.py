"""The SQLite store's transaction: the registry, the rate limit, the whiteboard, staged memories and keys."""

from __future__ import annotations

from .. import base
from .signals import _COLS, SqliteSignalTransaction


class SqliteTransaction(SqliteSignalTransaction):
    """A transaction on one session.db: the signals' part (signals.py) and the rest."""

    __slots__ = ()

    # -- the registry --------------------------------------------------------------------------------
    def agent(self, agent_id):
        return self.conn.execute("SELECT * FROM agents WHERE id = ?", (agent_id,)).fetchone()

    def agents(self, ids=None):
        if ids is None:
            return self.conn.execute("SELECT * FROM agents ORDER BY id").fetchall()
        ids = list(ids)
        marks = ",".join("?" * len(ids))
        return self.conn.execute(f"SELECT * FROM agents WHERE id IN ({marks}) ORDER BY id", ids).fetchall()

    def register_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.conn.execute("INSERT INTO agents (id, harness, substrate, status, last_heartbeat, run_token, joined_at, "
                          "joined_seq, read_upto, delivered_upto, started_at) "
                          "VALUES (?, ?, ?, 'active', ?, ?, ?, ?, 0, 0, ?)",
                          (agent_id, harness, substrate, stamp, run_token, stamp, self.max_sequence(), stamp))
        if self.changes is not None:
            self._count_change()  # a slot a quiet hook may hold (synapolis.harness.quiet)

    def restart_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.conn.execute("UPDATE agents SET harness = ?, substrate = ?, status = 'active', last_heartbeat = ?, "
                          "run_token = ?, started_at = ? WHERE id = ?",
                          (harness, substrate, stamp, run_token, stamp, agent_id))
        if self.changes is not None:
            self._count_change()  # maybe taken over from a quiet hook (synapolis.harness.quiet)

    def refresh_agent(self, agent_id, stamp, status):
        self.conn.execute("UPDATE agents SET last_heartbeat = ?, status = ? WHERE id = ?", (stamp, status, agent_id))

    def count_live(self, cutoff, exclude=None, *, ceiling):
        row = self.conn.execute("SELECT COUNT(*) FROM agents WHERE status = 'active' AND last_heartbeat >= ? "
                                "AND last_heartbeat <= ? AND id IS NOT ?", (cutoff, ceiling, exclude)).fetchone()
        return int(row[0])

    def flag_stale(self, cutoff, *, ceiling):
        where = ("status IN ('active', 'idle') AND (last_heartbeat IS NULL OR last_heartbeat < ? "
                 "OR last_heartbeat > ?)")
        rows = self.conn.execute(f"SELECT id, status, last_heartbeat FROM agents WHERE {where}",
                                 (cutoff, ceiling)).fetchall()
        if rows:
            self.conn.execute(f"UPDATE agents SET status = 'stale' WHERE {where}", (cutoff, ceiling))
        return rows

    def raise_lamport(self, agent_id, value):
        self.conn.execute("UPDATE agents SET lamport = ? WHERE id = ? AND lamport < ?", (value, agent_id, value))

    def set_delivered_upto(self, agent_id, mark):
        self.conn.execute("UPDATE agents SET delivered_upto = ? WHERE id = ? AND delivered_upto < ?",
                          (mark, agent_id, mark))

    def set_read_upto(self, agent_id, mark):
        self.conn.execute("UPDATE agents SET read_upto = ?, delivered_upto = max(delivered_upto, ?) WHERE id = ?",
                          (mark, mark, agent_id))

    # -- the rate limit ------------------------------------------------------------------------------
    # (in the agent's registry row since schema 6: NULL tokens is a full bucket; only a registered agent sends)
    def rate_bucket(self, agent_id):
        return self.conn.execute("SELECT tokens, bucket_at AS updated_at FROM agents WHERE id = ? "
                                 "AND tokens IS NOT NULL", (agent_id,)).fetchone()

    def set_rate_bucket(self, agent_id, tokens, updated_at):
        self.conn.execute("UPDATE agents SET tokens = ?, bucket_at = ? WHERE id = ?", (tokens, updated_at, agent_id))

    # -- the whiteboard ------------------------------------------------------------------------------
    def whiteboard_set(self, key, value, agent_id, stamp):
        self.conn.execute("INSERT INTO session_state (key, value, updated_by, updated_at) VALUES (?, ?, ?, ?) "
                          "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_by = excluded.updated_by, "
                          "updated_at = excluded.updated_at", (key, value, agent_id, stamp))

    def whiteboard_get(self, key):
        return self.conn.execute("SELECT * FROM session_state WHERE key = ?", (key,)).fetchone()

    def whiteboard_all(self):
        return self.conn.execute("SELECT * FROM session_state ORDER BY key").fetchall()

    # -- staged memories -----------------------------------------------------------------------------
    def stage_memory(self, memory_id, agent_id, data, stamp):
        cursor = self.conn.execute("INSERT OR IGNORE INTO staged_memories (id, agent_id, memory_data, created_at) "
                                   "VALUES (?, ?, ?, ?)", (memory_id, agent_id, data, stamp))
        return cursor.rowcount > 0

    def staged_memories(self):
        return self.conn.execute("SELECT id, agent_id, memory_data, created_at FROM staged_memories "
                                 "ORDER BY created_at, rowid").fetchall()

    def unstage(self, memory_ids):
        self.conn.executemany("DELETE FROM staged_memories WHERE id = ?", [(i,) for i in memory_ids])

    def count_staged(self):
        return int(self.conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0])

    # -- idempotency keys ----------------------------------------------------------------------------
    def signal_by_key(self, sender, key):
        return self.conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.sender = ? AND s.idempotency_key = ?",
                                 (sender, key)).fetchone()

    def remember_note(self, agent_id, key, record, stamp):
        """A note's key (its line is in notes.jsonl, outside this database): KeyTaken when stored already."""
        import json

        cursor = self.conn.execute("INSERT INTO note_keys (agent_id, key, note, created_at) VALUES (?, ?, ?, ?) "
                                   "ON CONFLICT DO NOTHING", (agent_id, key, json.dumps(record, ensure_ascii=False),
                                                              stamp))
        if cursor.rowcount == 0:
            raise base.KeyTaken(key)

    def note_by_key(self, agent_id, key):
        import json

        row = self.conn.execute("SELECT note FROM note_keys WHERE agent_id = ? AND key = ?", (agent_id, key)).fetchone()
        return None if row is None else json.loads(row["note"])
