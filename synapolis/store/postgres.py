"""The PostgreSQL store (contract §12): one database shared by the state directories of many machines.

Imported only when `store` is a postgresql:// URL, and it alone imports psycopg. A CLI call opens one
connection; a long-lived process (`store.keep_connections()`: `synapolis mcp`, `serve`) keeps a pool
(psycopg-pool, imported only then). Every connection has `lock_timeout` and `statement_timeout` at
busy_timeout_ms, so nothing waits forever.

How the guarantees hold with many writers on several machines (docs/STORE.md has the reasoning):
- Total order: every signal insert first takes a per-session advisory transaction lock, then draws
  its `sequence`, and keeps the lock until it commits; so within a session sequence order is commit
  order, and once a reader sees sequence N committed, every lower number of that session is
  committed too (or rolled back for good).
- Watermarks: a write transaction fixes its horizon (the highest committed sequence of the session)
  before its first signal query and reads only up to it; a watermark never moves past the horizon,
  so it never passes a number whose transaction has not committed yet.
- Delivery: a drain takes a per-agent advisory lock without waiting (`pg_try_advisory_xact_lock`);
  a second drain of the same agent at the same moment returns nothing rather than waiting or
  delivering twice, and delivery rows commit with the transaction that returns the signals.
- Consensus sleep: `tired` serialises its count on a per-session advisory lock.
- Time: decisions that compare agents use the server's clock (`Store.now()`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import weakref
from datetime import timedelta, timezone

from ..errors import BusyError, InternalError, NotFoundError, UsageError
from . import base
from .events_pg import EVENTS_SCHEMA

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import dict_row
    from psycopg.pq import ConnStatus, DiagnosticField, ExecStatus

    _COMMAND_OK, _CONNECTION_OK, _SQLSTATE = ExecStatus.COMMAND_OK, ConnStatus.OK, DiagnosticField.SQLSTATE
    _TUPLES_OK = ExecStatus.TUPLES_OK
except ImportError:  # pragma: no cover - exercised by a test with the driver hidden
    psycopg = None

# each version's script is idempotent: an upgrade runs the whole of it again (9: path claims' index and waits, or
# idempotency keys, on two branches; 10: both, so a database either branch left at 9 is upgraded too)
SCHEMA_VERSION = 11  # 11: guard_events (store/events_pg.py)
CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout; with busy_timeout_ms the bound of §12 (at most 10 s)
NOTIFY_CHANNEL = "synapolis_signals"
POOL_MAX = 8  # connections of a long-lived process's pool
CLOCK_ANCHOR_S = 30.0  # how long `now()` runs on the monotonic clock before reading the server's again
INSTALL_HINT = 'pip install "synapolis[postgres]"'

_C = 'TEXT COLLATE "C"'  # ids and timestamps compare byte-wise, as on SQLite, whatever the database's locale

# EP-0118 §3's five tables with their names, columns and CHECKs, each with a `session_id` and keys that
# include it (the additions §12 allows), then our additions. Timestamps are the same fixed-width RFC 3339
# text as on SQLite, written from the server's clock.
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS sessions
(
    session_id  {_C} PRIMARY KEY,
    status      {_C} NOT NULL CHECK (status IN ('active', 'ended')),
    created_at  {_C} NOT NULL,
    ended_at    {_C},
    reopened_at {_C}
);

CREATE TABLE IF NOT EXISTS agents
(
    session_id     {_C} NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    id             {_C} NOT NULL,
    harness        {_C} NOT NULL,
    substrate      {_C} NOT NULL,
    status         {_C} NOT NULL CHECK (status IN ('active', 'idle', 'sleeping', 'stale')),
    last_heartbeat {_C},
    run_token      {_C} NOT NULL,
    joined_at      {_C},
    joined_seq     BIGINT NOT NULL DEFAULT 0,
    lamport        BIGINT NOT NULL DEFAULT 0,
    read_upto      BIGINT NOT NULL DEFAULT 0,
    delivered_upto BIGINT NOT NULL DEFAULT 0,
    started_at     {_C},
    PRIMARY KEY (session_id, id)
);

CREATE TABLE IF NOT EXISTS signals
(
    session_id {_C} NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    id         {_C} NOT NULL,
    sequence   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    timestamp  {_C} NOT NULL,
    sender     {_C} NOT NULL,
    recipient  {_C} NOT NULL,
    type       {_C} NOT NULL CHECK (type IN
                                   ('inform', 'query', 'delegate', 'ack', 'warn', 'sleep_event', 'sleep_request')),
    content    TEXT NOT NULL,
    lamport    BIGINT NOT NULL DEFAULT 0,
    reply_to   {_C},
    UNIQUE (session_id, id)
);

CREATE TABLE IF NOT EXISTS signal_reads
(
    session_id {_C} NOT NULL,
    signal_id  {_C} NOT NULL,
    agent_id   {_C} NOT NULL,
    read_at    {_C} NOT NULL,
    PRIMARY KEY (session_id, signal_id, agent_id),
    FOREIGN KEY (session_id, signal_id) REFERENCES signals (session_id, id) ON DELETE CASCADE,
    FOREIGN KEY (session_id, agent_id) REFERENCES agents (session_id, id) ON DELETE CASCADE
);

CREATE TABLE IF NOT EXISTS session_state
(
    session_id {_C} NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    key        {_C} NOT NULL,
    value      TEXT NOT NULL,
    updated_by {_C} NOT NULL,
    updated_at {_C} NOT NULL,
    PRIMARY KEY (session_id, key)
);

CREATE TABLE IF NOT EXISTS staged_memories
(
    session_id  {_C} NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    id          {_C} NOT NULL,
    agent_id    {_C} NOT NULL,
    memory_data TEXT NOT NULL,
    created_at  {_C} NOT NULL,
    staged_seq  BIGINT GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (session_id, id)
);

CREATE TABLE IF NOT EXISTS signal_deliveries
(
    session_id      {_C} NOT NULL,
    signal_id       {_C} NOT NULL,
    agent_id        {_C} NOT NULL,
    delivered_at    {_C} NOT NULL,
    delivery_method {_C} NOT NULL CHECK (delivery_method IN
                                         ('startup_drain', 'piggyback', 'poll', 'push', 'hook')),
    offers          INTEGER NOT NULL DEFAULT 1,
    last_offered_at {_C} NOT NULL,
    PRIMARY KEY (session_id, signal_id, agent_id),
    FOREIGN KEY (session_id, signal_id) REFERENCES signals (session_id, id) ON DELETE CASCADE
);

CREATE TABLE IF NOT EXISTS rate_buckets
(
    session_id {_C} NOT NULL,
    agent_id   {_C} NOT NULL,
    tokens     DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, agent_id)
);

-- a copy of each agent's latest heartbeat document (the file on its own machine is written first)
CREATE TABLE IF NOT EXISTS heartbeats
(
    agent_id    {_C} PRIMARY KEY,
    host        {_C},
    session_id  {_C},
    doc         TEXT NOT NULL,
    received_at {_C} NOT NULL
);

-- claims (contract §9): the record of each item ever claimed (its token is the high-water mark: the
-- row is never deleted) and every event (claims.jsonl on SQLite)
CREATE TABLE IF NOT EXISTS claims
(
    item       {_C} PRIMARY KEY,
    token      BIGINT NOT NULL CHECK (token >= 1),
    claimed_by {_C} NOT NULL,
    expires_at {_C} NOT NULL,
    released_at {_C},
    record     TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS claim_events
(
    seq   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item  {_C} NOT NULL,
    at    {_C} NOT NULL,
    event TEXT NOT NULL
);

-- the path claims that may be held (contract §14), keyed by their pattern's literal prefix (lower-cased):
-- "who holds a path" and the overlap check look at a few keys, not every claim (synapolis.claim_index).
-- Changed in the claim's own transaction. Claims from before it (an upgrade) go in under '' (a candidate
-- for every question) until they are released
CREATE TABLE IF NOT EXISTS claim_paths
(
    item   {_C} PRIMARY KEY,
    prefix {_C} NOT NULL
);
CREATE INDEX IF NOT EXISTS claim_paths_by_prefix ON claim_paths (prefix);
INSERT INTO claim_paths (item, prefix)
SELECT item, '' FROM claims WHERE released_at IS NULL AND item !~ '^[A-Za-z0-9_-]+:' ON CONFLICT (item) DO NOTHING;

-- who waits for which item (`claim --wait`, contract §14): the wait-for graph that refuses a deadlock.
-- A waiter refreshes seen_at while it waits; a row not refreshed for a while is a waiter that died
CREATE TABLE IF NOT EXISTS claim_waits
(
    agent_id   {_C} NOT NULL,
    item       {_C} NOT NULL,
    since      {_C} NOT NULL,
    seen_at    {_C} NOT NULL,
    until      {_C} NOT NULL,
    blocked_by TEXT NOT NULL,
    PRIMARY KEY (agent_id, item)
);

-- the notes bus of each session (sessions/<id>/notes.jsonl on SQLite)
CREATE TABLE IF NOT EXISTS notes
(
    session_id {_C} NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    at         {_C} NOT NULL,
    agent_id   {_C} NOT NULL,
    text       TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- the consolidated memories of every session (state/memory/ledger.jsonl on SQLite), one JSON line each
CREATE TABLE IF NOT EXISTS memory_ledger
(
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         {_C},
    session_id {_C},
    merged_by  {_C},
    merged_at  {_C},
    line       TEXT NOT NULL
);

-- escalation incidents (contract §6; escalations/<key>.json and escalations.jsonl on SQLite): the current
-- incident of each key (an agent id or '@global': one per key across every machine) and every event
CREATE TABLE IF NOT EXISTS escalation_incidents
(
    key_name   {_C} PRIMARY KEY,
    id         {_C} NOT NULL,
    status     {_C} NOT NULL CHECK (status IN ('open', 'resolved')),
    updated_at {_C},
    incident   TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS escalation_events
(
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    incident_id {_C} NOT NULL,
    at          {_C} NOT NULL,
    event       {_C} NOT NULL,
    record      TEXT NOT NULL
);

-- a send in one round trip (signals.send's steps, in its order; Transaction.send_signal): the audience, the
-- caller, its token bucket (signals.take_token's maths, the same IEEE doubles), the Lamport value, then the
-- insert under the session's insert lock (sequence order is commit order), the caller's clock and NOTIFY.
-- Version 8 adds p_reserved (below), version 9 p_key (the idempotency key, stored with the signal; a second one
-- of the sender is a unique violation of signals_by_key); the older functions stay for machines not yet upgraded.
CREATE OR REPLACE FUNCTION synapolis_send(p_session TEXT, p_id TEXT, p_timestamp TEXT, p_sender TEXT,
    p_recipient TEXT, p_type TEXT, p_content TEXT, p_caller TEXT, p_candidates TEXT[], p_rate DOUBLE PRECISION,
    p_moment DOUBLE PRECISION, p_lock_key TEXT, p_channel TEXT, p_reserved BIGINT, p_key TEXT) RETURNS JSON
    LANGUAGE plpgsql
AS $send$
DECLARE
    v_rows     JSON;
    v_clock    BIGINT;
    v_tokens   DOUBLE PRECISION;
    v_sequence BIGINT;
BEGIN
    -- of each row of the audience, what signals.audience reads (a broadcast to 1,000 agents answers 1,000)
    IF p_candidates IS NULL THEN
        SELECT COALESCE(json_agg(json_build_object('id', a.id, 'status', a.status, 'last_heartbeat',
                                                   a.last_heartbeat) ORDER BY a.id), '[]'::json)
        INTO v_rows FROM agents a
        WHERE a.session_id = p_session AND a.id <> p_sender AND NOT starts_with(p_sender, a.id || '.');
    ELSE
        SELECT json_agg(json_build_object('id', a.id, 'status', a.status, 'last_heartbeat', a.last_heartbeat)
                        ORDER BY a.id) INTO v_rows FROM agents a
        WHERE a.session_id = p_session AND a.id = ANY (p_candidates);
        IF v_rows IS NULL THEN
            RETURN json_build_object('refused', 'recipient');
        END IF;
    END IF;
    IF p_caller IS NOT NULL THEN
        SELECT lamport INTO v_clock FROM agents WHERE session_id = p_session AND id = p_caller;
        IF NOT FOUND THEN
            RETURN json_build_object('refused', 'caller');
        END IF;
        IF p_rate IS NOT NULL THEN
            -- one statement refills, spends and writes the bucket on its latest version, holding its row (two
            -- sends of one agent on two machines cannot spend one token); a bucket short of a token stays as it is
            INSERT INTO rate_buckets AS b (session_id, agent_id, tokens, updated_at)
            SELECT p_session, p_caller, p_rate - 1.0, p_moment WHERE p_rate >= 1.0
            ON CONFLICT (session_id, agent_id) DO UPDATE
            SET tokens = LEAST(p_rate, b.tokens + GREATEST(0.0, p_moment - b.updated_at) * (p_rate / 60.0)) - 1.0,
                updated_at = p_moment
            WHERE LEAST(p_rate, b.tokens + GREATEST(0.0, p_moment - b.updated_at) * (p_rate / 60.0)) >= 1.0;
            IF NOT FOUND THEN
                SELECT LEAST(p_rate, tokens + GREATEST(0.0, p_moment - updated_at) * (p_rate / 60.0)) INTO v_tokens
                FROM rate_buckets WHERE session_id = p_session AND agent_id = p_caller;
                RETURN json_build_object('refused', 'rate', 'tokens', COALESCE(v_tokens, p_rate));
            END IF;
        END IF;
    ELSE
        SELECT COALESCE(max(lamport), 0) INTO v_clock FROM signals WHERE session_id = p_session;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_lock_key, 0));
    -- A stored id (the same message twice in one microsecond) is found by the unique index itself (ON
    -- CONFLICT), not by a SELECT whose plan a connection keeps: one planned while the table was new went on
    -- scanning the session's every signal through another index (docs/STORE.md, "Round trips"). The number
    -- such an attempt drew is handed back, and the retry (the next microsecond's id, in this transaction,
    -- under this lock) stores with it: a duplicate leaves no gap in the session's sequence.
    IF p_reserved IS NULL THEN
        INSERT INTO signals (session_id, id, timestamp, sender, recipient, type, content, lamport, reply_to,
                             idempotency_key)
        VALUES (p_session, p_id, p_timestamp, p_sender, p_recipient, p_type, p_content, v_clock + 1, NULL, p_key)
        ON CONFLICT (session_id, id) DO NOTHING RETURNING sequence INTO v_sequence;
    ELSE
        INSERT INTO signals (sequence, session_id, id, timestamp, sender, recipient, type, content, lamport,
                             reply_to, idempotency_key) OVERRIDING SYSTEM VALUE
        VALUES (p_reserved, p_session, p_id, p_timestamp, p_sender, p_recipient, p_type, p_content, v_clock + 1,
                NULL, p_key)
        ON CONFLICT (session_id, id) DO NOTHING RETURNING sequence INTO v_sequence;
    END IF;
    IF v_sequence IS NULL THEN
        RETURN json_build_object('sequence', NULL, 'lamport', v_clock + 1, 'rows', v_rows, 'reserved',
                                 COALESCE(p_reserved, currval(pg_get_serial_sequence('signals', 'sequence'))));
    END IF;
    IF p_caller IS NOT NULL THEN
        UPDATE agents SET lamport = v_clock + 1 WHERE session_id = p_session AND id = p_caller AND lamport < v_clock + 1;
    END IF;
    PERFORM pg_notify(p_channel, p_session);
    RETURN json_build_object('sequence', v_sequence, 'lamport', v_clock + 1, 'rows', v_rows);
END
$send$;

CREATE INDEX IF NOT EXISTS signals_by_session ON signals (session_id, sequence);
CREATE INDEX IF NOT EXISTS signals_by_recipient ON signals (session_id, recipient, sequence);
CREATE INDEX IF NOT EXISTS signals_by_sender ON signals (session_id, recipient, sender, sequence);
CREATE INDEX IF NOT EXISTS signal_reads_by_agent ON signal_reads (session_id, agent_id, signal_id);
CREATE INDEX IF NOT EXISTS deliveries_by_agent ON signal_deliveries (session_id, agent_id, delivery_method, offers);

-- version 9: idempotency keys (docs/SIGNALS.md, "Retries and idempotency keys"), stored with the signal or note:
-- a retry with the same key, from any machine, runs into the unique index and replays the first
ALTER TABLE signals ADD COLUMN IF NOT EXISTS idempotency_key {_C};
CREATE UNIQUE INDEX IF NOT EXISTS signals_by_key ON signals (session_id, sender, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
ALTER TABLE notes ADD COLUMN IF NOT EXISTS idempotency_key {_C};
CREATE UNIQUE INDEX IF NOT EXISTS notes_by_key ON notes (session_id, agent_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""

SCHEMA += EVENTS_SCHEMA  # version 11
_COLS = "s.sequence, s.id, s.timestamp, s.sender, s.recipient, s.type, s.content, s.lamport, s.reply_to"
_UNREAD = (" AND NOT EXISTS (SELECT 1 FROM signal_reads r WHERE r.session_id = s.session_id "
           "AND r.signal_id = s.id AND r.agent_id = %s)")
_UNDELIVERED = (" AND NOT EXISTS (SELECT 1 FROM signal_deliveries d WHERE d.session_id = s.session_id "
                "AND d.signal_id = s.id AND d.agent_id = %s)")
# a send in one call (Transaction.send_signal): session, id, timestamp, sender, recipient, type, content, caller,
# candidates, rate, moment, insert lock key, NOTIFY channel, reserved sequence, idempotency key
SEND_CALL = ("SELECT synapolis_send(%s, %s, %s, %s, %s, %s, %s, %s, %s::text[], %s::float8, %s::float8, %s, %s, "
             "%s::int8, %s::text) AS out")
# the same as the statement each connection prepares at its second send (`_execute_send`), parameters $1 to $15
SEND_STATEMENT_NAME = b"synapolis_send"
SEND_STATEMENT = (SEND_CALL % tuple(f"${i}" for i in range(1, 16))).encode()
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_TRY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0)) AS got"


def require_driver() -> None:
    if psycopg is None:
        raise UsageError(f"the store is a PostgreSQL URL, but the driver psycopg is not installed: {INSTALL_HINT}")


def describe_url(url: str) -> str:
    """The URL without its password, rebuilt from its parsed parts: `postgresql://user@host:port/dbname` (what
    messages name); one that does not parse is named as such and nothing of it shown (pgurl.py)."""
    from ..pgurl import describe

    return describe(url)


def split_password(url: str) -> tuple[str, str | None]:
    """(a libpq conninfo without the password, the password or None): connections are made from the two, so
    nothing that holds or logs a conninfo (psycopg-pool's warnings, a connection's repr) ever carries the
    password. UsageError, quoting nothing of the URL, when it does not parse (pgurl.py's strict reading, then
    libpq's own, whose errors quote the text they refuse)."""
    from psycopg.conninfo import make_conninfo

    from ..pgurl import problem

    reason = problem(url)
    if reason is None:
        try:
            parts = conninfo_to_dict(url)
        except Exception:  # noqa: BLE001 - libpq's message quotes the URL: never shown
            reason = "libpq does not accept it (an unknown query parameter, or a value it refuses)"
    if reason is not None:
        raise UsageError(f"the store URL does not parse: {reason}; nothing of it is shown, since it may hold "
                         "a password")
    password = parts.pop("password", None)
    return make_conninfo(**parts), password


def _cause(exc: BaseException) -> str:
    """The useful last line of a libpq error ("password authentication failed ...", "Connection refused")."""
    text = str(exc).strip()
    if "failed: " in text:
        text = text.rsplit("failed: ", 1)[-1]
    first = text.splitlines()[0] if text else type(exc).__name__
    for prefix in ("FATAL:", "ERROR:"):
        first = first.replace(prefix, "")
    return " ".join(first.split()) or type(exc).__name__


def _command(conn, command: bytes) -> None:
    """BEGIN or COMMIT through libpq itself (`pgconn.exec_`, psycopg's documented low-level interface): a
    cursor's execute spends about 80,000 instructions on a command without parameters or rows, as much as the
    send between them (docs/STORE.md, "Round trips")."""
    result = conn.pgconn.exec_(command)
    if result.status != _COMMAND_OK:
        _raise_failure(conn, result, command.decode())


# How far each connection is with SEND_STATEMENT: absent, never run; ONCE, run once unprepared (a process that
# sends one signal, a CLI call, pays no round trip to prepare it); PREPARED. A prepared statement lasts as long as
# its connection, whatever becomes of the transaction that prepared it, unless DEALLOCATE ALL drops it: psycopg
# sends that when a ROLLBACK, DROP, ALTER or DISCARD runs through its cursor or `rollback()`, so the store rolls
# back through `_command` and changes the schema only on a new connection (`_ensure_schema`), before any send.
_SEND_STATE = weakref.WeakKeyDictionary()
_ONCE, _PREPARED = 1, 2
_NO_SUCH_STATEMENT = b"26000"  # SQLSTATE invalid_sql_statement_name


def _execute_send(conn, params) -> bytes | None:
    """The one value SEND_STATEMENT returns for `params`, through libpq itself (`pgconn.exec_params`, and from
    the connection's second send on, prepared, `exec_prepared`). A cursor's execute of it spent 45,000
    instructions more, adapting 14 parameters and loading the row (docs/STORE.md, "Round trips"). Parameters go
    as text: str as UTF-8 (every connection's client_encoding), numbers as their repr, None as NULL."""
    pgconn = conn.pgconn
    values = [_text_param(value) for value in params]
    state = _SEND_STATE.get(conn)
    if state is None:
        result = pgconn.exec_params(SEND_STATEMENT, values)
        _SEND_STATE[conn] = _ONCE
    else:
        if state == _ONCE:
            prepared = pgconn.prepare(SEND_STATEMENT_NAME, SEND_STATEMENT)
            if prepared.status != _COMMAND_OK:
                _raise_failure(conn, prepared, "PREPARE")
            _SEND_STATE[conn] = _PREPARED
        result = pgconn.exec_prepared(SEND_STATEMENT_NAME, values)
    if result.status != _TUPLES_OK:
        if result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            _SEND_STATE[conn] = _ONCE  # dropped after all: this send fails, the connection's next prepares again
        _raise_failure(conn, result, "EXECUTE")
    return result.get_value(0, 0)


def _text_param(value) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return repr(value).encode()
    if "\x00" in value:
        # libpq ends a text parameter at its first NUL, which would store the text cut short; psycopg's own
        # adaptation refuses it with this error, which `_translate` turns into the user's one-line refusal
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value.encode()


def _raise_failure(conn, result, what: str) -> None:
    """A failed libpq call raised as psycopg raises it: the class of its SQLSTATE, or OperationalError when
    the connection is lost (the transaction's retry and error translation depend on that)."""
    message = (result.error_message or conn.pgconn.error_message or b"").decode("utf-8", "replace").strip()
    message = message or f"{what} failed"
    if conn.pgconn.status != _CONNECTION_OK:
        raise psycopg.OperationalError(message)
    state = result.error_field(_SQLSTATE)
    raise (pg_errors.lookup(state.decode()) if state else psycopg.DatabaseError)(message)


def _text_array(items) -> str | None:
    """A text[] literal of `items` (None stays NULL), each quoted and escaped, so that every string is itself
    (a quoted NULL is the text 'NULL'): psycopg's own list adaptation spends about 56,000 instructions a call
    finding the element type, a third of a send's statement."""
    if items is None:
        return None
    return "{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items) + "}"


def _family(agent_id: str) -> tuple[str, str]:
    return agent_id + ".", agent_id + "/"


# The distinct senders of the session's broadcasts, one index seek each (signals_by_sender), past a reader's
# sub-agents in one seek: an inbox then reads each other sender's broadcasts as an index range in sequence
# order, and never the reader's own family's, which it does not see (issue 31)
_BROADCAST_SENDERS = (
    "WITH RECURSIVE b(sender) AS ((SELECT sender FROM signals WHERE session_id = %(session)s AND recipient = '*' "
    "ORDER BY sender LIMIT 1) UNION ALL SELECT (SELECT s.sender FROM signals s WHERE s.session_id = %(session)s "
    "AND s.recipient = '*' AND s.sender > CASE WHEN b.sender > %(lo)s AND b.sender < %(hi)s THEN %(hi)s "
    "ELSE b.sender END ORDER BY s.sender LIMIT 1) FROM b WHERE b.sender IS NOT NULL) "
    "SELECT sender FROM b WHERE sender IS NOT NULL LIMIT %(cap)s")


def _key(*parts: str) -> str:
    return "synapolis." + ".".join(parts)


class PostgresTransaction(base.Transaction):
    """One transaction on one session's rows of the shared database."""

    offers_send_signal = True

    def __init__(self, cur, session_id: str, writing: bool):
        self.cur = cur
        self.session_id = session_id
        self.writing = writing
        self._horizon = None
        self._reserved = None  # a sequence number drawn by an insert whose id was stored already
        self._senders = {}  # _broadcast_senders by reader, for this transaction (an insert forgets them)

    def _all(self, sql, args=()):
        self.cur.execute(sql, args)
        return self.cur.fetchall()

    def _one(self, sql, args=()):
        self.cur.execute(sql, args)
        return self.cur.fetchone()

    # -- locking -----------------------------------------------------------------------------------
    def exclusive(self, topic):
        self.cur.execute(_LOCK, (_key(self.session_id, topic),))

    def try_exclusive(self, topic):
        return bool(self._one(_TRY_LOCK, (_key(self.session_id, topic),))["got"])

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

    # -- signals -----------------------------------------------------------------------------------
    def max_sequence(self):
        """The horizon: fixed at the first signal query of the transaction. Inserts hold the session's
        insert lock from drawing a number to committing, so every sequence up to it is committed."""
        if self._horizon is None:
            row = self._one("SELECT COALESCE(max(sequence), 0) AS m FROM signals WHERE session_id = %s",
                            (self.session_id,))
            self._horizon = int(row["m"])
        return self._horizon

    def max_lamport(self):
        row = self._one("SELECT COALESCE(max(lamport), 0) AS m FROM signals WHERE session_id = %s",
                        (self.session_id,))
        return int(row["m"])

    def insert_signal(self, signal, caller=None):
        # the session's insert lock first, held to commit, and only then the sequence: sequence order is
        # commit order (see the module doc). One statement: the lock's row feeds the INSERT, so the lock
        # is taken before nextval() runs. A stored id is found by the unique index itself (ON CONFLICT), not
        # by a planned lookup (docs/STORE.md, "Round trips"); the number such an attempt drew is kept and the
        # retry (signals.send: the next microsecond's id, this transaction, this lock) inserts with it, so a
        # duplicate leaves no gap.
        reserved, self._reserved = self._reserved, None
        columns = "session_id, id, timestamp, sender, recipient, type, content, lamport, reply_to, idempotency_key"
        if reserved is None:
            into, values = f"({columns})", ""
        else:
            into, values = f"(sequence, {columns}) OVERRIDING SYSTEM VALUE", "%s::int8, "
        try:
            row = self._one(
                "WITH locked AS (SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))), "
                f"stored AS (INSERT INTO signals {into} SELECT {values}%s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
                "FROM locked ON CONFLICT (session_id, id) DO NOTHING RETURNING sequence), "
                "clock AS (UPDATE agents SET lamport = %s WHERE session_id = %s AND id = %s AND lamport < %s) "
                "SELECT s.sequence, CASE WHEN s.sequence IS NULL THEN "
                "currval(pg_get_serial_sequence('signals', 'sequence')) END AS drawn, "
                "CASE WHEN s.sequence IS NOT NULL THEN pg_notify(%s, %s) END AS notified "
                # the LEFT JOIN gives a row either way, read after the INSERT ran (so currval has its number)
                "FROM (SELECT 1) AS one LEFT JOIN stored s ON true",
                (_key(self.session_id, "signals"), *([] if reserved is None else [reserved]), self.session_id,
                 signal["id"], signal["timestamp"], signal["sender"], signal["recipient"], signal["type"],
                 signal["content"], signal["lamport"], signal["reply_to"], signal.get("idempotency_key"),
                 signal["lamport"], self.session_id, caller, signal["lamport"], NOTIFY_CHANNEL, self.session_id))
        except psycopg.Error as exc:
            _key_taken(exc, "signals_by_key", signal.get("idempotency_key"))  # this sender stored it already
            raise
        if row["sequence"] is None:
            self._reserved = reserved if reserved is not None else int(row["drawn"])
            return None  # that id is stored already
        sequence = int(row["sequence"])
        self._senders.clear()
        if self._horizon is not None:
            self._horizon = max(self._horizon, sequence)  # our own insert is ours to see
        return sequence

    def send_signal(self, signal, *, caller, candidates, rate, moment):
        key = signal.get("idempotency_key")
        try:
            sent = _execute_send(
                self.cur.connection,
                (self.session_id, signal["id"], signal["timestamp"], signal["sender"], signal["recipient"],
                 signal["type"], signal["content"], caller, _text_array(candidates), rate, moment,
                 _key(self.session_id, "signals"), NOTIFY_CHANNEL, self._reserved, key))
        except psycopg.Error as exc:
            _key_taken(exc, "signals_by_key", key)
            raise
        out = json.loads(sent)
        # an id stored already: signals.send retries with the next microsecond's id, which takes the number
        # this attempt drew (see synapolis_send)
        self._reserved = out.get("reserved")
        self._senders.clear()
        if out.get("sequence") is not None and self._horizon is not None:
            self._horizon = max(self._horizon, int(out["sequence"]))  # our own insert is ours to see
        return out

    def recent_signals(self, limit):
        return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s ORDER BY s.sequence DESC LIMIT %s",
                         (self.session_id, int(limit)))

    def find_signals(self, ref, limit=100):
        if len(ref) == 64:
            return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.id = %s",
                             (self.session_id, ref))
        return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.id >= %s AND s.id < %s "
                         "ORDER BY s.id LIMIT %s", (self.session_id, ref, ref + "g", limit))

    MAX_BROADCAST_SEEKS = 64  # senders of broadcasts served by one branch each; more: one walk of them all

    def _broadcast_senders(self, agent_id):
        """The senders of broadcasts the reader sees (all but itself and its sub-agents) up to the horizon, or
        None past MAX_BROADCAST_SEEKS. Taken after the horizon is fixed: every broadcast below it is committed."""
        if agent_id not in self._senders:
            lo, hi = _family(agent_id)
            rows = self._all(_BROADCAST_SENDERS, {"session": self.session_id, "lo": lo, "hi": hi,
                                                  "cap": self.MAX_BROADCAST_SEEKS + 3})
            found = [r["sender"] for r in rows if r["sender"] != agent_id and not lo < r["sender"] < hi]
            self._senders[agent_id] = found if len(found) <= self.MAX_BROADCAST_SEEKS else None
        return self._senders[agent_id]

    def _visible_select(self, agent_id, bfloor, dfloor, unread, undelivered):
        lo, hi = _family(agent_id)
        top = self.max_sequence()
        senders = self._broadcast_senders(agent_id)
        extra, extra_args = "", []
        if unread:
            extra, extra_args = extra + _UNREAD, extra_args + [agent_id]
        if undelivered:
            extra, extra_args = extra + _UNDELIVERED, extra_args + [agent_id]
        if senders is None:  # many senders: the reader's own broadcasts are then a small share of them all
            branches = [("s.recipient = '*' AND s.sequence > %s AND s.sender <> %s AND NOT (s.sender > %s AND "
                         "s.sender < %s)", [bfloor, agent_id, lo, hi])]
        else:
            branches = [("s.recipient = '*' AND s.sender = %s AND s.sequence > %s", [who, bfloor]) for who in senders]
        branches += [
            ("s.recipient = %s AND s.sequence > %s", [agent_id, dfloor]),
            ("s.recipient > %s AND s.recipient < %s AND s.sequence > %s", [lo, hi, dfloor]),
        ]
        sql, args = [], []
        for where, params in branches:
            sql.append(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.sequence <= %s AND {where}{extra}")
            args += [self.session_id, top] + params + extra_args
        return " UNION ALL ".join(f"({q})" for q in sql), args

    def visible_signals(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, newest_first=False,
                        limit=None, reader_fields=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        inner += f" ORDER BY sequence {'DESC' if newest_first else 'ASC'}"
        if limit is not None:
            inner += " LIMIT %s"
            args.append(min(int(limit), 2 ** 63 - 1))
        if not reader_fields:
            rows = self._all(inner, args)
            return rows[::-1] if newest_first else rows
        sql = (f"SELECT v.*, r.read_at, d.delivered_at, d.delivery_method FROM ({inner}) v "
               "LEFT JOIN signal_reads r ON r.session_id = %s AND r.signal_id = v.id AND r.agent_id = %s "
               "LEFT JOIN signal_deliveries d ON d.session_id = %s AND d.signal_id = v.id AND d.agent_id = %s "
               "ORDER BY v.sequence")
        return self._all(sql, [*args, self.session_id, agent_id, self.session_id, agent_id])

    def count_visible(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, below=None, cap=1000):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        where = ""
        if below is not None:
            where, args = " WHERE v.sequence < %s", [*args, below]
        row = self._one(f"SELECT count(*) AS n FROM (SELECT 1 FROM ({inner}) v{where} LIMIT %s) c", [*args, cap])
        return int(row["n"])

    def first_visible_sequence(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        row = self._one(f"SELECT min(sequence) AS m FROM ({inner}) v", args)
        return int(row["m"]) if row and row["m"] is not None else None

    def latest_visible_sequence(self, agent_id):
        inner, args = self._visible_select(agent_id, 0, 0, False, False)
        row = self._one(f"SELECT max(sequence) AS m FROM ({inner}) v", args)
        return int(row["m"]) if row and row["m"] is not None else 0

    def hook_redeliveries(self, agent_id, max_offers, cutoff):
        return self._all(
            f"SELECT {_COLS}, d.offers FROM signal_deliveries d JOIN signals s "
            "ON s.session_id = d.session_id AND s.id = d.signal_id "
            "WHERE d.session_id = %s AND d.agent_id = %s AND d.delivery_method = 'hook' AND d.offers < %s "
            "AND d.last_offered_at <= %s" + _UNREAD + " ORDER BY s.sequence",
            (self.session_id, agent_id, max_offers, cutoff, agent_id))

    def add_deliveries(self, agent_id, signal_ids, stamp, method):
        self.cur.executemany("INSERT INTO signal_deliveries (session_id, signal_id, agent_id, delivered_at, "
                             "delivery_method, offers, last_offered_at) VALUES (%s, %s, %s, %s, %s, 1, %s)",
                             [(self.session_id, i, agent_id, stamp, method, stamp) for i in signal_ids])

    def reoffer(self, agent_id, signal_ids, stamp):
        self.cur.execute("UPDATE signal_deliveries SET offers = offers + 1, last_offered_at = %s "
                         "WHERE session_id = %s AND agent_id = %s AND signal_id = ANY(%s)",
                         (stamp, self.session_id, agent_id, list(signal_ids)))

    def add_reads(self, agent_id, signal_ids, stamp):
        self.cur.executemany("INSERT INTO signal_reads (session_id, signal_id, agent_id, read_at) "
                             "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                             [(self.session_id, i, agent_id, stamp) for i in signal_ids])

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


def _key_taken(exc, index: str, key) -> None:
    """KeyTaken for a unique violation of `index` (signals_by_key, notes_by_key: the key is stored already)."""
    if key is not None and isinstance(exc, pg_errors.UniqueViolation) and index in str(exc):
        raise base.KeyTaken(key) from None


class ClaimSlot:
    """One item's claim inside a transaction holding the item's advisory lock (see claims.FileSlot)."""

    def __init__(self, cur, item: str, row):
        import json

        from ..claims import _is_record

        self.cur, self.item = cur, item
        self.existed = row is not None
        self.record = None
        self._token = 0
        if row is not None:
            with contextlib.suppress(ValueError):
                doc = json.loads(row["record"])
                self.record = doc if _is_record(doc, item) else None

    def high_water(self) -> int:
        self.cur.execute("SELECT GREATEST((SELECT token FROM claims WHERE item = %s), "
                         "(SELECT max((event::json->>'token')::bigint) FROM claim_events WHERE item = %s)) AS top",
                         (self.item, self.item))
        row = self.cur.fetchone()
        return int(row["top"] or 0)

    def settle(self) -> None:
        """Nothing to repair: the claim row and its event commit in one transaction."""

    def path_claim_candidates(self, prefixes, under=None) -> list[str]:
        return _path_claim_candidates(self.cur, prefixes, under)

    def claim_records(self, items) -> dict:
        return _claim_records(self.cur, items)

    def write(self, record: dict, event: dict) -> None:
        import json

        from ..claim_index import index_prefix, is_path_item

        if is_path_item(self.item):
            if record.get("released_at"):
                self.cur.execute("DELETE FROM claim_paths WHERE item = %s", (self.item,))
            else:
                self.cur.execute("INSERT INTO claim_paths (item, prefix) VALUES (%s, %s) ON CONFLICT (item) "
                                 "DO UPDATE SET prefix = excluded.prefix", (self.item, index_prefix(self.item)))
        dump = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        self.cur.execute("INSERT INTO claims (item, token, claimed_by, expires_at, released_at, record) "
                         "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (item) DO UPDATE SET token = excluded.token, "
                         "claimed_by = excluded.claimed_by, expires_at = excluded.expires_at, "
                         "released_at = excluded.released_at, record = excluded.record",
                         (record["item"], record["token"], record["claimed_by"], record["expires_at"],
                          record.get("released_at"), dump))
        self.cur.execute("INSERT INTO claim_events (item, at, event) VALUES (%s, %s, %s)",
                         (record["item"], event["at"], json.dumps(event, ensure_ascii=False, separators=(",", ":"))))


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for the prefixes under `prefix` (its own wildcards escaped)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "/%" if prefix else "_%"


def _path_claim_candidates(cur, prefixes, under) -> list[str]:
    if under is None:
        cur.execute("SELECT item FROM claim_paths WHERE prefix = ANY(%s)", (list(prefixes),))
    else:
        cur.execute("SELECT item FROM claim_paths WHERE prefix = ANY(%s) OR prefix LIKE %s",
                    (list(prefixes), _like_prefix(under)))
    return [row["item"] for row in cur.fetchall()]


def _claim_records(cur, items) -> dict:
    import json

    from ..claims import _is_record

    cur.execute("SELECT item, record FROM claims WHERE item = ANY(%s)", (list(items),))
    out = {}
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            doc = json.loads(row["record"])
            if _is_record(doc, row["item"]):
                out[row["item"]] = doc
    return out


def _waits(cur) -> list[dict]:
    cur.execute("SELECT agent_id, item, since, seen_at, until, blocked_by FROM claim_waits ORDER BY since")
    out = []
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            extra = json.loads(row["blocked_by"])
            out.append({"agent_id": row["agent_id"], "item": row["item"], "since": row["since"],
                        "seen_at": row["seen_at"], "until": row["until"], "blocked_by": extra.get("blocked_by", []),
                        "blocking": extra.get("blocking", [])})
    return out


class WaitBook:
    """The claim_waits rows inside a transaction holding the waiters' advisory lock (see claim_waits.FileWaitBook)."""

    def __init__(self, cur):
        self.cur = cur

    def waits(self) -> list[dict]:
        return _waits(self.cur)

    def put(self, record: dict, swept=()) -> None:
        for agent_id, item in swept:
            self.remove(agent_id, item)
        extra = json.dumps({"blocked_by": record["blocked_by"], "blocking": record["blocking"]}, ensure_ascii=False)
        self.cur.execute("INSERT INTO claim_waits (agent_id, item, since, seen_at, until, blocked_by) "
                         "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (agent_id, item) DO UPDATE SET "
                         "seen_at = excluded.seen_at, until = excluded.until, blocked_by = excluded.blocked_by",
                         (record["agent_id"], record["item"], record["since"], record["seen_at"], record["until"],
                          extra))

    def remove(self, agent_id: str, item: str) -> None:
        self.cur.execute("DELETE FROM claim_waits WHERE agent_id = %s AND item = %s", (agent_id, item))

    def claim_records(self, items) -> dict:
        return _claim_records(self.cur, items)


def _put_heartbeat(cur, doc: dict, stamp: str) -> None:
    cur.execute("INSERT INTO heartbeats (agent_id, host, session_id, doc, received_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (agent_id) DO UPDATE SET host = excluded.host, "
                "session_id = excluded.session_id, doc = excluded.doc, received_at = excluded.received_at",
                (doc["agent_id"], doc.get("host"), doc.get("session_id"), _dump(doc), stamp))


def _dump(value) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _current_incidents(cur) -> dict:
    import json

    from ..escalation import is_incident

    cur.execute("SELECT key_name, incident FROM escalation_incidents ORDER BY key_name")
    found = {}
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            incident = json.loads(row["incident"])
            if is_incident(incident):
                found[row["key_name"]] = incident
    return found


class EscalationBook:
    """The incidents in the shared database, on a connection of its own that holds the escalation lock
    (a session-level advisory lock) for the `with` body: no transaction stays open while notifiers run."""

    def __init__(self, conn, paths):
        self.conn, self.paths = conn, paths
        self._current = None

    def current(self) -> dict:
        with self.conn.cursor() as cur:
            self._current = _current_incidents(cur)
        return dict(self._current)

    def record(self, changed: dict, records: list) -> None:
        """The changed incidents and their events in one transaction; then this machine's files."""
        from ..escalation import mirror

        if changed or records:
            with self.conn.transaction(), self.conn.cursor() as cur:
                if changed:
                    cur.executemany(
                        "INSERT INTO escalation_incidents (key_name, id, status, updated_at, incident) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key_name) DO UPDATE SET id = excluded.id, "
                        "status = excluded.status, updated_at = excluded.updated_at, incident = excluded.incident",
                        [(name, i["id"], i["status"], i.get("updated_at"), _dump(i)) for name, i in changed.items()])
                if records:
                    cur.executemany("INSERT INTO escalation_events (incident_id, at, event, record) "
                                    "VALUES (%s, %s, %s, %s)",
                                    [(r["incident_id"], r["at"], r["event"], _dump(r)) for r in records])
        incidents = dict(self._current if self._current is not None else {})
        incidents.update(changed)
        mirror(self.paths, incidents, records)


class PostgresSessionStore(base.SessionStore):
    """One session's rows in the shared database, through the process's connection."""

    def __init__(self, backend: "PostgresStore", session_id: str):
        self.backend = backend
        self.session_id = session_id
        self.busy_timeout_ms = backend.busy_timeout_ms

    @contextlib.contextmanager
    def write(self):
        with self.backend.transaction("BEGIN") as cur:
            yield PostgresTransaction(cur, self.session_id, True)

    @contextlib.contextmanager
    def read(self):
        # one snapshot for every query of the body
        with self.backend.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as cur:
            yield PostgresTransaction(cur, self.session_id, False)

    def close(self) -> None:
        """The connection belongs to the process's store; nothing to give back."""


class PostgresStore(base.Store):
    """The shared database named by a postgresql:// URL: one connection per process made on first use, or
    a pool of them in a long-lived process."""

    kind = "postgresql"

    def __init__(self, ws, url: str, pooled: bool = False):
        require_driver()
        self.ws = ws
        self.url = url
        # every connection is made from these two, never from the URL (split_password says why)
        self.conninfo, self._password = split_password(url)
        self.pooled = pooled  # a long-lived process: a pool of connections (store.keep_connections)
        self._pool = None
        self.where = describe_url(url)
        self.busy_timeout_ms = int(ws.config.busy_timeout_ms)
        self._lock = threading.RLock()
        self._conn = None
        self._cursor = None  # the cursor of `_conn` (_cursor_for)
        # the server's clock as last read (free with the schema check at connect) and this process's monotonic
        # clock at that moment: `now()` runs on from it, see there
        self._clock_anchor = None

    # -- connections and errors --------------------------------------------------------------------
    def _connect_options(self) -> dict:
        timeout = self.busy_timeout_ms
        secret = {} if self._password is None else {"password": self._password}
        return {**secret, "autocommit": True, "row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": "synapolis", "client_encoding": "UTF8",
                "options": f"-c lock_timeout={timeout} -c statement_timeout={timeout} "
                           "-c idle_in_transaction_session_timeout=60000 -c TimeZone=UTC"}

    def _connect(self):
        try:
            conn = psycopg.connect(self.conninfo, **self._connect_options())
        except psycopg.Error as exc:
            raise self._unreachable(exc) from None
        try:
            self._ensure_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _scrub(self, text: str) -> str:
        """libpq's message without the password, should it ever quote it (it does not: the password never
        rides in the conninfo it is given with the other parts; this is the second line of defence)."""
        password = self._password
        return text.replace(password, "***") if password else text

    def _unreachable(self, exc) -> BusyError:
        return BusyError(f"store {self.where} cannot be reached: {self._scrub(_cause(exc))}")

    def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _translate(self, exc) -> Exception:
        """A psycopg error as a synapolis one; a connection that may be broken is dropped (the next call
        reconnects)."""
        if isinstance(exc, (pg_errors.LockNotAvailable, pg_errors.QueryCanceled, pg_errors.DeadlockDetected,
                            pg_errors.SerializationFailure)):
            return BusyError(f"store {self.where} stayed locked past busy_timeout_ms={self.busy_timeout_ms}: "
                             f"{self._scrub(_cause(exc))}")
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            self._drop()
            return BusyError(f"store {self.where} failed: {self._scrub(_cause(exc))}")
        if isinstance(exc, psycopg.DataError) and "NUL (0x00)" in str(exc):
            # PostgreSQL's text cannot hold U+0000 (SQLite's can): bad input, refused whole, nothing stored
            return UsageError(f"store {self.where}: text with a NUL character (U+0000) cannot be stored in "
                              "PostgreSQL; remove it and try again")
        if isinstance(exc, psycopg.IntegrityError):
            return InternalError(f"store {self.where}: {self._scrub(_cause(exc))}")
        return InternalError(f"store {self.where}: {self._scrub(_cause(exc))}")

    def connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _open_pool(self):
        """The pool of a long-lived process (psycopg-pool, imported only here): up to POOL_MAX connections,
        each checked against the schema when made, so threads (the MCP server's tools, the HTTP server's
        requests) no longer wait for each other's transactions."""
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(self.conninfo, min_size=1, max_size=POOL_MAX, kwargs=self._connect_options(),
                              configure=self._ensure_schema, open=False, name="synapolis",
                              # a failed attempt is given up at once and the next call asking for a
                              # connection tries again: a backoff could leave a server that came back
                              # unused for minutes
                              reconnect_timeout=0)
        pool.open(wait=False)
        return pool

    @contextlib.contextmanager
    def _checkout(self):
        """A connection for one transaction: the process's own (threads take turns), or one of the pool."""
        if not self.pooled:
            with self._lock:
                yield self.connection()
            return
        from psycopg_pool import PoolTimeout

        with self._lock:
            if self._pool is None:
                self._pool = self._open_pool()
        if self._pool.get_stats().get("pool_size", 1) == 0:
            # no connection and none being made: the last attempt failed (reconnect_timeout=0). Waiting for the
            # pool would only time out after CONNECT_TIMEOUT_S, for every part of every request of a server whose
            # store is away; a connection of our own names the cause at once (and the pool grows when it works)
            self._connect().close()
        try:
            ctx = self._pool.connection(timeout=CONNECT_TIMEOUT_S)
            conn = ctx.__enter__()
        except PoolTimeout:
            # no connection within the bound: name the cause (what a connection of our own meets), or busy
            self._connect().close()
            raise BusyError(f"store {self.where}: all {POOL_MAX} connections stayed busy for "
                            f"{CONNECT_TIMEOUT_S} s") from None
        try:
            yield conn
        except BaseException as exc:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            ctx.__exit__(None, None, None)

    def _discard(self, conn) -> None:
        """A connection found broken: closed, so that neither the process nor the pool uses it again."""
        with contextlib.suppress(Exception):
            conn.close()
        if conn is self._conn:
            self._conn = self._cursor = None

    @contextlib.contextmanager
    def transaction(self, begin: str = "BEGIN"):
        """A transaction on a connection of the process (`_checkout`): committed on success, rolled back on
        any error; psycopg errors become BusyError / InternalError. A connection that died while idle (the
        server restarted between two calls of a long-lived process) fails at BEGIN, before anything ran:
        the transaction starts again once on a new connection, so the caller never sees it.

        (libpq's pipeline mode was measured: on a local server its client-side cost outweighs the round
        trips it saves, benchmarks/RESULTS.md; statements that belong together are fused instead.)
        """
        begin = begin.encode()
        for attempt in (1, 2):
            with self._checkout() as conn:
                cur = self._cursor_for(conn)
                try:
                    _command(conn, begin)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    self._discard(conn)
                    if attempt == 2:
                        raise self._translate(exc) from None
                    if self._pool is not None:
                        self._pool.check()  # the pool's other idle connections died with it: replaced
                    continue
                except psycopg.Error as exc:
                    self._rollback(conn)
                    raise self._translate(exc) from None
                try:
                    yield cur
                    _command(conn, b"COMMIT")
                except psycopg.Error as exc:
                    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                        self._discard(conn)
                    self._rollback(conn)
                    raise self._translate(exc) from None
                except BaseException:
                    self._rollback(conn)
                    raise
                return

    def _cursor_for(self, conn):
        """The cursor a transaction runs on. The process's own connection keeps one (its transactions take turns,
        and making a cursor costs a tenth of a send's client time); a pooled connection's is made per transaction."""
        if self.pooled:
            return conn.cursor()
        cur = self._cursor
        if cur is None or cur.connection is not conn:
            cur = self._cursor = conn.cursor()
        return cur

    def _rollback(self, conn) -> None:
        if conn.closed:
            return
        try:
            _command(conn, b"ROLLBACK")  # past psycopg, which would deallocate every prepared statement (_SEND_STATE)
        except Exception:  # noqa: BLE001 - a connection that cannot even roll back is not reused
            self._discard(conn)

    def _ensure_schema(self, conn) -> None:
        """Create or upgrade the schema once; two machines doing it at once wait on one advisory lock."""
        try:
            row = conn.execute("SELECT version, clock_timestamp() AS now FROM synapolis_schema").fetchone()
        except pg_errors.UndefinedTable:
            row = None
        except psycopg.Error as exc:
            raise self._translate(exc) from None
        if row is not None and row["version"] >= SCHEMA_VERSION:
            self._clock_anchor = (row["now"], time.monotonic())
            return
        try:
            with conn.transaction():
                conn.execute(_LOCK, (_key("schema"),))
                conn.execute("CREATE TABLE IF NOT EXISTS synapolis_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
                             "version INTEGER NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                             "upgraded_at TIMESTAMPTZ NOT NULL DEFAULT now())")
                found = conn.execute("SELECT version FROM synapolis_schema").fetchone()
                if found is None or found["version"] < SCHEMA_VERSION:
                    conn.execute(SCHEMA)
                    conn.execute("INSERT INTO synapolis_schema (id, version) VALUES (1, %s) ON CONFLICT (id) "
                                 "DO UPDATE SET version = excluded.version, upgraded_at = now()", (SCHEMA_VERSION,))
        except psycopg.Error as exc:
            raise self._translate(exc) from None

    def schema_version(self) -> int:
        with self.transaction() as cur:
            cur.execute("SELECT version FROM synapolis_schema")
            return int(cur.fetchone()["version"])

    def now(self):
        """The server's clock: read from the server (free with the first query of a connection), then run
        on with this process's monotonic clock, which a change of the local wall clock does not move, and
        read again after CLOCK_ANCHOR_S. Within one process that saves a round trip per verb; two clocks
        drift apart by a few parts per million, microseconds over CLOCK_ANCHOR_S."""
        anchor = self._clock_anchor
        if anchor is None or time.monotonic() - anchor[1] > CLOCK_ANCHOR_S:
            with self._checkout() as conn:  # a new connection reads the clock for free (_ensure_schema)
                anchor = self._clock_anchor
                if anchor is None or time.monotonic() - anchor[1] > CLOCK_ANCHOR_S:
                    try:
                        moment = conn.execute("SELECT clock_timestamp() AS now").fetchone()["now"]
                    except psycopg.Error as exc:
                        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                            self._discard(conn)
                        raise self._translate(exc) from None
                    anchor = self._clock_anchor = (moment, time.monotonic())
        moment, at = anchor
        return (moment + timedelta(seconds=time.monotonic() - at)).astimezone(timezone.utc)

    def close(self) -> None:
        with self._lock:
            self._drop()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

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
        import json

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
        import json

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
        from ..claim_index import is_path_item

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
        import json

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
        from ..board import check_note
        from ..timeutil import format_ts

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
        import json

        from ..names import validate_agent_id
        from ..sleep import LedgerHoldings

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
                                 json.dumps(line, ensure_ascii=False, separators=(",", ":"))) for line in fresh])
        return fresh, held

    def _json_objects(self, sql: str) -> list[dict]:
        """The first column of each row of `sql`, decoded: the JSON objects (anything else skipped)."""
        import json

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
        from .events_pg import record

        record(self, event, keep)

    def recent_events(self, limit):
        from .events_pg import recent

        return recent(self, limit)

    # -- across machines ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive_pass(self, name: str, lock_path):
        """One pass of `name` at a time across every machine: a session-level advisory lock on a
        connection of its own, held for the pass (and the local file lock too)."""
        from ..atomic import locked

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
    from ..timeutil import format_ts

    return format_ts(store.now())
