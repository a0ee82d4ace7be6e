"""The SQLite store's schema: each session.db's tables, its migrations, and its private files (0600/0700)."""

from __future__ import annotations

import os
import sqlite3

from ..run_tokens import hash_token, is_hashed

# 2: run tokens are kept as their SHA-256 (store/run_tokens.py), and the files are private (0600/0700)
# 3: the broadcasts' index by sender (signals_broadcasts_by_sender), or idempotency keys (_IDEMPOTENCY_SCHEMA): two
#    branches each made a version 3; 4: both, each step idempotent, so a store either one left at 3 is completed
# 6: each agent's token bucket in its registry row (_BUCKET_COLUMNS)
SCHEMA_VERSION = 6
# session.db, its -wal and -shm hold every agent's signals and (hashed) run token: only their owner may
# read them, from the moment they exist (SQLite gives -wal and -shm the mode of the database file)
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

# Schema 3: a reader's inbox takes the broadcasts of each other sender from this index, in sequence order, so
# it never walks the broadcasts of its own family (its own and its sub-agents', which it does not see)
_BROADCASTS_INDEX = ("CREATE INDEX IF NOT EXISTS signals_broadcasts_by_sender ON signals (sender, sequence) "
                     "WHERE recipient = '*'")

# Schema 5: a broadcast's audience (every registered agent, live or waiting) from this index alone: the live
# ones are one range of it per live status, the rest the ranges around them, so a broadcast reads ids from the
# index without touching a registration row (issue 31; audience.py)
_LIVENESS_INDEX = "CREATE INDEX IF NOT EXISTS agents_by_liveness ON agents (status, last_heartbeat, id)"

# Schema 6: each agent's token bucket (rate_limit_per_min) in its own registry row, NULL for a full one: a send
# spends its token and raises its Lamport clock in one statement on one row (store/local/signals.py), where the
# rate_buckets table (kept, no longer written) took a statement and a page of its own. Copied over once.
_BUCKET_COLUMNS = ("ALTER TABLE agents ADD COLUMN tokens REAL", "ALTER TABLE agents ADD COLUMN bucket_at REAL",
                   "UPDATE agents SET (tokens, bucket_at) = (SELECT b.tokens, b.updated_at FROM rate_buckets b "
                   "WHERE b.agent_id = agents.id) WHERE EXISTS (SELECT 1 FROM rate_buckets b WHERE b.agent_id = agents.id)")

# EP-0118 §3's five tables exactly as written (names, columns, CHECKs), then our additions.
# Timestamps we write are RFC 3339 UTC with microseconds (`2026-06-02T10:09:24.123456Z`): fixed
# width, so comparing them as strings orders them in time.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents
(
    id             TEXT PRIMARY KEY,
    harness        TEXT NOT NULL,
    substrate      TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('active', 'idle', 'sleeping', 'stale')),
    last_heartbeat TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    run_token      TEXT NOT NULL,
    joined_at      TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    -- additions: the last signal sequence when the agent first joined (older broadcasts are history),
    -- its Lamport clock, and two watermarks: every signal it can see up to `read_upto` is read (or
    -- history), up to `delivered_upto` delivered, read or history; they keep inbox queries short.
    joined_seq     INTEGER NOT NULL DEFAULT 0,
    lamport        INTEGER NOT NULL DEFAULT 0,
    read_upto      INTEGER NOT NULL DEFAULT 0,
    delivered_upto INTEGER NOT NULL DEFAULT 0,
    started_at     TIMESTAMP
);

CREATE TABLE IF NOT EXISTS signals
(
    id        TEXT NOT NULL UNIQUE,
    sequence  INTEGER PRIMARY KEY AUTOINCREMENT,
    timestamp TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    sender    TEXT NOT NULL,
    recipient TEXT NOT NULL,
    type      TEXT NOT NULL CHECK (type IN
                                   ('inform', 'query', 'delegate', 'ack', 'warn', 'sleep_event', 'sleep_request')),
    content   TEXT NOT NULL,
    lamport   INTEGER NOT NULL DEFAULT 0,
    reply_to  TEXT
);

CREATE TABLE IF NOT EXISTS signal_reads
(
    signal_id TEXT NOT NULL,
    agent_id  TEXT NOT NULL,
    read_at   TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (signal_id, agent_id),
    FOREIGN KEY (signal_id) REFERENCES signals (id) ON DELETE CASCADE,
    FOREIGN KEY (agent_id) REFERENCES agents (id) ON DELETE CASCADE
);

CREATE TABLE IF NOT EXISTS session_state
(
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE IF NOT EXISTS staged_memories
(
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    memory_data TEXT NOT NULL,
    created_at  TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

-- SPEC-037: a row only in the transaction that put the signal's content into a response to agent_id.
CREATE TABLE IF NOT EXISTS signal_deliveries
(
    signal_id       TEXT NOT NULL,
    agent_id        TEXT NOT NULL,
    delivered_at    TIMESTAMP NOT NULL,
    delivery_method TEXT NOT NULL CHECK (delivery_method IN
                                         ('startup_drain', 'piggyback', 'poll', 'push', 'hook')),
    offers          INTEGER NOT NULL DEFAULT 1,
    last_offered_at TIMESTAMP NOT NULL,
    PRIMARY KEY (signal_id, agent_id),
    FOREIGN KEY (signal_id) REFERENCES signals (id) ON DELETE CASCADE
);

-- one token bucket per sending agent (rate_limit_per_min), up to schema 5 (since: agents.tokens, bucket_at)
CREATE TABLE IF NOT EXISTS rate_buckets
(
    agent_id   TEXT PRIMARY KEY,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS signals_by_recipient ON signals (recipient, sequence);
CREATE INDEX IF NOT EXISTS signal_reads_by_agent ON signal_reads (agent_id, signal_id);
CREATE INDEX IF NOT EXISTS deliveries_by_agent ON signal_deliveries (agent_id, delivery_method, offers);
""" + "\n" + _BROADCASTS_INDEX + ";\n"

# version 3: idempotency keys (docs/SIGNALS.md, "Retries and idempotency keys"): a signal's with the signal, unique
# per sender; a note's beside it (the note itself is in notes.jsonl), unique per agent
_IDEMPOTENCY_SCHEMA = """
ALTER TABLE signals ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS signals_by_key ON signals (sender, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS note_keys
(
    agent_id   TEXT NOT NULL,
    key        TEXT NOT NULL,
    note       TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (agent_id, key)
) WITHOUT ROWID;
"""


def create_private(path: str) -> None:
    """Create the folder (0700) and an empty database file (0600) before SQLite opens it, so the file is
    private from its first moment whatever the umask; SQLite then creates -wal and -shm with its mode."""
    os.makedirs(os.path.dirname(path), mode=PRIVATE_DIR, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE))
    except FileExistsError:  # a racing creator made it (the same way)
        pass


def make_private(path: str) -> None:
    """Take a store made by an older synapolis private: its folder 0700; the file, -wal and -shm 0600.
    Only the owner may change a mode; for anyone else this quietly does nothing."""
    if os.name == "nt":  # pragma: no cover - no POSIX modes
        return
    for target, mode in ((os.path.dirname(path), PRIVATE_DIR), (path, PRIVATE_FILE),
                         (path + "-wal", PRIVATE_FILE), (path + "-shm", PRIVATE_FILE)):
        try:
            if os.stat(target).st_mode & 0o777 & ~mode:
                os.chmod(target, mode)
        except OSError:
            continue


def _hash_clear_tokens(conn) -> None:
    """Schema 2: replace run tokens an older synapolis kept in clear with their hash (store/run_tokens.py)."""
    rows = conn.execute("SELECT id, run_token FROM agents").fetchall()
    conn.executemany("UPDATE agents SET run_token = ? WHERE id = ?",
                     [(hash_token(r["run_token"]), r["id"]) for r in rows if not is_hashed(r["run_token"])])


def _statements(script: str):
    """Split a script into statements (executescript would commit our transaction first)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
