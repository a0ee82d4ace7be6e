"""Sessions and `start`: the store's schema, joining/creating/ambiguity, conflicts and reclaim, identity.json."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from datetime import timedelta

import pytest

from conftest import NOW
from synapolis import actions, sessions
from synapolis.errors import AmbiguousIdentityError, ConflictError, ForbiddenError, UsageError
from synapolis.identity import hash_token
from synapolis.store import SessionStore

EP_COLUMNS = {
    "agents": ["id", "harness", "substrate", "status", "last_heartbeat", "run_token", "joined_at"],
    "signals": ["id", "sequence", "timestamp", "sender", "recipient", "type", "content"],
    "signal_reads": ["signal_id", "agent_id", "read_at"],
    "session_state": ["key", "value", "updated_by", "updated_at"],
    "staged_memories": ["id", "agent_id", "memory_data", "created_at"],
}


@pytest.mark.sqlite_only
def test_store_has_ep0118_tables_in_wal_mode(ws):
    sid = sessions.create_session(ws, "s1", now=NOW)
    conn = sqlite3.connect(str(ws.paths.session_db(sid)))
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        for table, columns in EP_COLUMNS.items():
            have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            assert have[: len(columns)] == columns, table
        have = [r[1] for r in conn.execute("PRAGMA table_info(signal_deliveries)")]
        assert have[:4] == ["signal_id", "agent_id", "delivered_at", "delivery_method"]
        # the CHECKs as written in EP-0118
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO agents (id, harness, substrate, status, run_token) VALUES ('a','h','s','stopped','t')")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO signals (id, sender, recipient, type, content) VALUES ('x','a','b','chat','c')")
    finally:
        conn.close()
    doc = json.loads(ws.paths.session_json(sid).read_text())
    assert doc["session_id"] == "s1" and doc["status"] == "active" and doc["ended_at"] is None


@pytest.mark.sqlite_only
def test_a_failed_transaction_rolls_back_and_leaves_the_store_free(ws):
    """The store's write()/read() (classes, so no hot verb imports contextlib): a body that raises has its
    writes rolled back, its error comes out as it was (an IntegrityError, a KeyError) or as a synapolis error
    (another sqlite3 error: InternalError), and the store's lock is free at once for another thread."""
    import threading

    from synapolis.errors import InternalError

    sid = sessions.create_session(ws, "s1", now=NOW)
    stamp = "2026-06-02T10:00:00.000000Z"
    with SessionStore.open(ws, sid) as store:
        with pytest.raises(sqlite3.IntegrityError):
            with store.write() as tx:
                tx.register_agent("alice", harness="h", substrate="", stamp=stamp, run_token="t")
                tx.execute("INSERT INTO agents (id, harness, substrate, status, run_token) VALUES ('b','h','s','x','t')")
        with pytest.raises(KeyError):
            with store.write() as tx:
                tx.register_agent("alice", harness="h", substrate="", stamp=stamp, run_token="t")
                raise KeyError("the verb's own failure")
        with pytest.raises(InternalError, match="no such table"):
            with store.read() as tx:
                tx.execute("SELECT * FROM nowhere")
        found = []
        other = threading.Thread(target=lambda: found.append(_registered(store, "alice")), daemon=True)
        other.start()
        other.join(10)
        assert found == [False]  # the other thread got the lock, and nothing of the failed writes is there
        with store.write() as tx:
            tx.register_agent("alice", harness="h", substrate="", stamp=stamp, run_token="t")
    with SessionStore.open(ws, sid) as store:  # committed: a new connection sees it
        assert _registered(store, "alice")


def _registered(store, agent_id: str) -> bool:
    with store.write() as tx:
        return tx.agent(agent_id) is not None


def test_open_unknown_session_is_not_found(ws):
    from synapolis.errors import NotFoundError

    with pytest.raises(NotFoundError):
        SessionStore.open(ws, "nope")
    assert not ws.paths.session_dir("nope").exists()


def test_a_file_that_is_not_a_database_is_a_readable_error(ws):
    from synapolis.errors import InternalError

    path = ws.paths.session_db("broken")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InternalError, match="not a database|damaged"):
        SessionStore.open(ws, "broken")


def test_start_creates_then_joins_the_only_active_session(start_agent, ws):
    a = start_agent("alice")
    assert a["created_session"] and a["status"] == "active" and a["run_token"]
    b = start_agent("bob")
    assert b["session_id"] == a["session_id"] and not b["created_session"]
    assert sessions.active_sessions(ws) == [a["session_id"]]
    import re

    assert re.match(r"^\d{8}_\d{6}_[0-9a-f]{8}$", a["session_id"])


def test_start_refuses_to_guess_between_active_sessions(start_agent):
    start_agent("alice")
    other = start_agent("bob", new_session=True)
    assert other["created_session"]
    with pytest.raises(AmbiguousIdentityError):
        start_agent("carol")
    joined = start_agent("carol", session_id=other["session_id"])
    assert joined["session_id"] == other["session_id"]


def test_start_in_an_ended_session_by_name_reopens_it(start_agent, ws):
    a = start_agent("alice")
    sessions.end_session(ws, a["session_id"], now=NOW)
    assert sessions.active_sessions(ws) == []
    again = start_agent("bob", session_id=a["session_id"])
    assert again["session_id"] == a["session_id"]
    assert sessions.read_session(ws, a["session_id"])["status"] == "active"


def test_conflict_reclaim_and_takeover(start_agent, ws, db_rows):
    first = start_agent("alice")
    sid, token = first["session_id"], first["run_token"]
    # active and fresh: the same id without the token is a conflict
    with pytest.raises(ConflictError, match="already active"):
        start_agent("alice", now=NOW + timedelta(seconds=10))
    # the matching run token reclaims at once, keeping the token
    again = start_agent("alice", run_token=token, now=NOW + timedelta(seconds=20))
    assert again["run_token"] == token and again["registration"] == "reclaimed"
    # a wrong token is refused, even for a slot that would be free
    with pytest.raises(ForbiddenError):
        start_agent("alice", run_token="not-the-token", now=NOW + timedelta(seconds=30))
    with pytest.raises(ForbiddenError):
        start_agent("alice", run_token="not-the-token", now=NOW + timedelta(hours=2))
    # stale (older than stale_after_s): free for anyone, with a new token
    later = NOW + timedelta(seconds=20 + ws.config.stale_after_s + 1)
    taken = start_agent("alice", now=later)
    assert taken["registration"] == "taken_over" and taken["run_token"] != token
    row = db_rows(sid, "SELECT * FROM agents WHERE id = 'alice'")[0]
    assert row["run_token"] == hash_token(taken["run_token"]) and row["status"] == "active"  # kept hashed
    # ... and the old token is now wrong
    with pytest.raises(ForbiddenError):
        start_agent("alice", run_token=token, now=later)


def test_stopped_agent_is_sleeping_in_registry_and_free(start_agent, ws, db_rows):
    from synapolis.identity import Who

    a = start_agent("alice")
    actions.beat(ws, Who("alice"), status="stopped", env={}, now=NOW + timedelta(seconds=5))
    assert db_rows(a["session_id"], "SELECT status FROM agents")[0]["status"] == "sleeping"
    taken = start_agent("alice", now=NOW + timedelta(seconds=6))
    assert taken["registration"] == "taken_over"


def test_identity_file_is_private_and_names_the_agent(start_agent, ws):
    a = start_agent("alice", harness="claude-code", substrate="Claude Sonnet 4.6")
    path = ws.paths.identity
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert (doc["agent_id"], doc["session_id"], doc["run_token"]) == ("alice", a["session_id"], a["run_token"])
    hb = json.loads(ws.paths.heartbeat("alice").read_text())
    assert hb["session_id"] == a["session_id"] and hb["harness"] == "claude-code"
    assert hb["substrate"] == "Claude Sonnet 4.6" and hb["status"] == "active"


def test_generated_ids(start_agent):
    a = start_agent(substrate="Claude Sonnet 4.6", conversation_id="conv-1", deterministic_id=True)
    import hashlib

    digest = hashlib.sha256(b"conv-1").hexdigest()
    assert a["agent_id"] == f"claude_sonnet_4_6_{digest[:8]}_{digest[8:12]}"
    b = start_agent(harness="Gemini CLI", conversation_id="conv-2")
    assert b["agent_id"].startswith("gemini_cli_" + hashlib.sha256(b"conv-2").hexdigest()[:8] + "_")
    c = start_agent(harness="codex")
    assert len(c["agent_id"].split("_")[-1]) == 4 and c["agent_id"].startswith("codex_")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".", "..", "a..b", "x" * 129, ".a"])
def test_malformed_agent_ids_are_refused_before_writing(start_agent, ws, bad):
    with pytest.raises(UsageError):
        start_agent(bad)
    assert not ws.paths.identity.exists()
    assert list(ws.paths.sessions.iterdir()) == []


@pytest.mark.parametrize("bad", ["", "../x", "..", "a b"])
def test_malformed_session_ids_are_refused(start_agent, ws, bad):
    with pytest.raises(UsageError):
        start_agent("alice", session_id=bad)
    assert list(ws.paths.sessions.iterdir()) == []


def test_flag_stale_marks_silent_agents(start_agent, ws, db_rows):
    a = start_agent("alice")
    start_agent("bob", now=NOW + timedelta(seconds=250))
    later = NOW + timedelta(seconds=ws.config.stale_after_s + 10)
    changed = sessions.flag_stale(ws, now=later)
    assert [(c["session_id"], c["agent_id"]) for c in changed] == [(a["session_id"], "alice")]
    rows = {r["id"]: r["status"] for r in db_rows(a["session_id"], "SELECT id, status FROM agents")}
    assert rows == {"alice": "stale", "bob": "active"}
    # acting again brings the registry back to the declared status
    from synapolis.identity import Who

    actions.beat(ws, Who("alice"), env={}, now=later)
    assert db_rows(a["session_id"], "SELECT status FROM agents WHERE id='alice'")[0]["status"] == "active"


def test_sessions_of_agent_most_recent_first(start_agent, ws):
    a = start_agent("alice")
    b = start_agent("alice", new_session=True, now=NOW + timedelta(seconds=5))
    assert sessions.sessions_of_agent(ws, "alice") == [b["session_id"], a["session_id"]]


# -- the CLI ---------------------------------------------------------------------------------------

def test_list_agents_names_the_host_of_each_agent(ws, cli):
    """§12: list-agents tells agents apart by the host their heartbeat names (the local file, or on a shared
    store the copy of an agent on another machine); an agent whose heartbeat is gone has none."""
    for agent in ("alice", "bob"):
        assert cli("start", "--agent-id", agent, "--session-id", "s1").returncode == 0
    ws.paths.heartbeat("bob").unlink()
    if ws.config.store != "sqlite":
        import psycopg

        with psycopg.connect(ws.config.store, autocommit=True) as conn:
            conn.execute("DELETE FROM heartbeats WHERE agent_id = 'bob'")
    out = cli("list-agents", "--agent-id", "alice", "--session-id", "s1", "--json")
    assert out.returncode == 0, out.stderr
    agents = {a["id"]: a for a in json.loads(out.stdout)["agents"]}
    assert agents["alice"]["host"] == os.uname().nodename and agents["bob"]["host"] is None
    text = cli("list-agents", "--agent-id", "alice", "--session-id", "s1").stdout
    assert "HOST" in text.splitlines()[0] and os.uname().nodename in text


def test_cli_start_export_and_json(cli, state_dir):
    out = cli("start", "--agent-id", "alice", "--export")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    values = dict(line[len("export "):].rstrip(";").split("=", 1) for line in lines)
    assert values["SYNAPOLIS_AGENT_ID"] == "alice" and len(values["SYNAPOLIS_RUN_TOKEN"]) == 32
    assert values["SYNAPOLIS_STATE_DIR"] == str(state_dir)
    env = {k: v for k, v in values.items()}
    # with the exported environment a second start reclaims instead of conflicting
    again = cli("start", "--json", env=env)
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert data["registration"] == "reclaimed" and data["pending_signals"] == []
    for key in ("agent_id", "session_id", "run_token", "status", "pending_signals"):
        assert key in data


def test_cli_exit_codes_for_start(cli):
    assert cli("start", "--agent-id", "alice").returncode == 0
    conflict = cli("start", "--agent-id", "alice", "--json")
    assert conflict.returncode == 3
    assert json.loads(conflict.stdout)["error"]["type"] == "ConflictError"
    assert "Traceback" not in conflict.stderr and len(conflict.stderr.strip().splitlines()) == 1
    assert cli("start", "--agent-id", "alice", "--run-token", "wrong").returncode == 7
    assert cli("start", "--agent-id", "").returncode == 2
    assert cli("start", "--agent-id", "../etc").returncode == 2
    assert cli("start", "--agent-id", "bob", "--new-session").returncode == 0
    ambiguous = cli("start", "--agent-id", "carol")
    assert ambiguous.returncode == 4 and "AmbiguousIdentityError" in ambiguous.stderr
