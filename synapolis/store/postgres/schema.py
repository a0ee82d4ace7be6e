"""The PostgreSQL store's schema: its tables, indexes and functions, one idempotent script per version."""

from __future__ import annotations

from .events import EVENTS_SCHEMA

# each version's script is idempotent: an upgrade runs the whole of it again (9: path claims' index and waits, or
# idempotency keys, on two branches; 10: both, so a database either branch left at 9 is upgraded too)
SCHEMA_VERSION = 13  # 11: guard_events (store/postgres/events.py); 12: synapolis_send judges a broadcast; 13: the
# audience epoch (store/postgres/audience.py)
AUDIENCE_JUMP_S = 60  # a heartbeat this far forward or more draws a new audience epoch (store/postgres/audience.py)

_C = 'TEXT COLLATE "C"'  # ids and timestamps compare byte-wise, as on SQLite, whatever the database's locale
# the update of an agents row that can move a broadcast's audience whatever the window (version 13, below): its
# status, or its heartbeat back, to or from nothing, or forward by AUDIENCE_JUMP_S or more. An UPDATE that sets
# neither column (a send's Lamport clock, a delivery's mark) does not even look; no UPDATE changes an agent's id
# or session. Short: every UPDATE that looks compiles the condition anew, about 10 us for this one on the bench VM
_MOVED_COLUMNS = "status, last_heartbeat"
_MOVES = ("OLD.status <> NEW.status OR NEW.last_heartbeat IS NULL OR OLD.last_heartbeat IS NULL "
          "OR NEW.last_heartbeat < OLD.last_heartbeat OR NEW.last_heartbeat::timestamptz >= "
          f"OLD.last_heartbeat::timestamptz + interval '{AUDIENCE_JUMP_S} seconds'")

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

-- version 12: a broadcast's audience from its own index
CREATE INDEX IF NOT EXISTS agents_by_liveness ON agents (session_id, status, last_heartbeat, id);

-- version 13: a session's audience epoch, drawn anew by every change to its registry that can move a broadcast's
-- audience (store/postgres/audience.py says why these and no others): a registration or its removal, a status,
-- and a heartbeat that goes back, to or from nothing, or forward by {AUDIENCE_JUMP_S} seconds or more. A heartbeat
-- that moves an agent a little forward, nearly every one, draws nothing and waits on no one. Such a change
-- leaves a row in audience_moves at once; at the commit a deferred trigger on that row draws the epoch from a
-- sequence (a value a rolled-back transaction saw is never seen again) and deletes the row. So the epoch's row
-- is the last lock a transaction takes, and two cannot each hold a lock the other waits for; and a row of
-- audience_moves anyone sees is a change of their own transaction, not yet committed, whose broadcasts then
-- read the registry again. One trigger on agents per kind of change: each costs every UPDATE it looks at.
CREATE SEQUENCE IF NOT EXISTS synapolis_audience_epochs;
CREATE TABLE IF NOT EXISTS audience_epochs
(
    session_id {_C} PRIMARY KEY,
    epoch      BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS audience_moves
(
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id {_C} NOT NULL
);
CREATE INDEX IF NOT EXISTS audience_moves_by_session ON audience_moves (session_id);
CREATE OR REPLACE FUNCTION synapolis_audience_moving() RETURNS TRIGGER
    LANGUAGE plpgsql
AS $moving$
DECLARE
    v_session TEXT := CASE WHEN TG_OP = 'INSERT' THEN NEW.session_id ELSE OLD.session_id END;
BEGIN
    -- one row a transaction and session (the only rows it can see here are its own): a statement that moves
    -- many agents (the watchdog's stale flags) draws one epoch at the commit, not one an agent
    INSERT INTO audience_moves (session_id) SELECT v_session
    WHERE NOT EXISTS (SELECT 1 FROM audience_moves WHERE session_id = v_session);
    RETURN NULL;
END
$moving$;
CREATE OR REPLACE FUNCTION synapolis_audience_moved() RETURNS TRIGGER
    LANGUAGE plpgsql
AS $moved$
BEGIN
    INSERT INTO audience_epochs (session_id, epoch) VALUES (NEW.session_id, nextval('synapolis_audience_epochs'))
    ON CONFLICT (session_id) DO UPDATE SET epoch = excluded.epoch;
    DELETE FROM audience_moves WHERE id = NEW.id;
    RETURN NULL;
END
$moved$;
DROP TRIGGER IF EXISTS audience_moves_drawn ON audience_moves;
CREATE CONSTRAINT TRIGGER audience_moves_drawn AFTER INSERT ON audience_moves DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION synapolis_audience_moved();
DROP TRIGGER IF EXISTS agents_audience_joined ON agents;
CREATE TRIGGER agents_audience_joined AFTER INSERT OR DELETE ON agents
    FOR EACH ROW EXECUTE FUNCTION synapolis_audience_moving();
DROP TRIGGER IF EXISTS agents_audience_moved ON agents;
CREATE TRIGGER agents_audience_moved AFTER UPDATE OF {_MOVED_COLUMNS} ON agents
    FOR EACH ROW WHEN ({_MOVES}) EXECUTE FUNCTION synapolis_audience_moving();

-- a send in one round trip (signals.send's steps, in its order; Transaction.send_signal): the audience, the
-- caller, its token bucket (signals.take_token's maths, the same IEEE doubles), the Lamport value, then the
-- insert under the session's insert lock (sequence order is commit order), the caller's clock and NOTIFY.
-- Version 8 adds p_reserved (below), version 9 p_key (the idempotency key, stored with the signal; a second one
-- of the sender is a unique violation of signals_by_key), version 12 the live window's two edges (p_cutoff,
-- p_ceiling: a broadcast's audience judged here, from agents_by_liveness; issue 31), version 13 p_epoch (below).
-- The older functions stay in the databases that have them, for machines not yet upgraded.
CREATE OR REPLACE FUNCTION synapolis_send(p_session TEXT, p_id TEXT, p_timestamp TEXT, p_sender TEXT,
    p_recipient TEXT, p_type TEXT, p_content TEXT, p_caller TEXT, p_candidates TEXT[], p_rate DOUBLE PRECISION,
    p_moment DOUBLE PRECISION, p_lock_key TEXT, p_channel TEXT, p_reserved BIGINT, p_key TEXT, p_cutoff TEXT,
    p_ceiling TEXT, p_epoch BIGINT) RETURNS JSON
    LANGUAGE plpgsql
AS $send$
DECLARE
    v_rows     JSON;
    v_live     TEXT;
    v_leaves   TEXT;
    v_top      TEXT;
    v_waiting  JSON;
    v_epoch    BIGINT;
    v_moved    BOOLEAN;
    v_clock    BIGINT;
    v_tokens   DOUBLE PRECISION;
    v_sequence BIGINT;
BEGIN
    -- a broadcast with the live window (cutoff, ceiling; status.registry_window): the registry's whole audience
    -- (the caller takes the sender's chain out), unless the caller holds the one of the session's epoch (p_epoch)
    IF p_candidates IS NULL THEN
        -- the epoch first: a change committed before it is in what is read after it
        SELECT epoch INTO v_epoch FROM audience_epochs WHERE session_id = p_session;
        v_epoch := COALESCE(v_epoch, 0);
        -- this transaction's own change, which draws its epoch at the commit: read, and not to be kept
        v_moved := EXISTS (SELECT 1 FROM audience_moves WHERE session_id = p_session);
        IF p_epoch IS DISTINCT FROM v_epoch OR v_moved THEN
            -- the live ids as one string (no object per recipient; from the ranges of agents_by_liveness,
            -- unordered: the caller sorts them), with the earliest and latest live heartbeats
            SELECT string_agg(a.id, E'\n'), min(a.last_heartbeat), max(a.last_heartbeat) INTO v_live, v_leaves, v_top
            FROM agents a WHERE a.session_id = p_session AND a.status IN ('active', 'idle')
              AND a.last_heartbeat >= p_cutoff AND a.last_heartbeat <= p_ceiling;
            -- the waiting: the index's ranges around the live ones, each its own branch (a plan that scans them
            -- all would read every registration again)
            SELECT COALESCE(json_agg(json_build_array(w.id, w.status, w.last_heartbeat)), '[]'::json) INTO v_waiting
            FROM (SELECT id, status, last_heartbeat FROM agents WHERE session_id = p_session
                      AND status IN ('sleeping', 'stale')
                  UNION ALL SELECT id, status, last_heartbeat FROM agents WHERE session_id = p_session
                      AND status IN ('active', 'idle') AND last_heartbeat < p_cutoff
                  UNION ALL SELECT id, status, last_heartbeat FROM agents WHERE session_id = p_session
                      AND status IN ('active', 'idle') AND last_heartbeat > p_ceiling
                  UNION ALL SELECT id, status, last_heartbeat FROM agents WHERE session_id = p_session
                      AND status IN ('active', 'idle') AND last_heartbeat IS NULL) w;
        END IF;
    ELSE  -- a directed signal: of each row of the recipient's chain, what signals.audience reads
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
    RETURN json_build_object('sequence', v_sequence, 'lamport', v_clock + 1, 'rows', v_rows, 'live', v_live,
                             'waiting', v_waiting, 'leaves', v_leaves, 'top', v_top, 'epoch', v_epoch,
                             'moved', v_moved);
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
