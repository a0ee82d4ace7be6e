"""Consensus sleep end to end: standby and consolidation, stale agents, rejoin, re-runs, bad input."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta

import pytest

from synapolis import actions, sleep
from synapolis.atomic import read_json, read_jsonl
from synapolis.errors import ForbiddenError, NoIdentityError, UsageError
from synapolis.identity import Who
from synapolis.schemas import validation_errors
from synapolis.timeutil import utcnow

from conftest import store_rows


def db_rows(ws, session_id, sql, args=()):
    return store_rows(ws, session_id, sql, args)


def registry(ws, session_id):
    return {r["id"]: r["status"] for r in db_rows(ws, session_id, "SELECT id, status FROM agents")}


def staged_count(ws, session_id):
    return db_rows(ws, session_id, "SELECT COUNT(*) AS n FROM staged_memories")[0]["n"]


def start(ws, agent_id, session_id=None, **kw):
    return actions.start(ws, agent_id=agent_id, session_id=session_id, write_identity=False, **kw)


def who(agent_id, session_id):
    return Who(agent_id=agent_id, session_id=session_id)


def ledger(ws):
    """The ledger's lines from the store (memory/ledger.jsonl, or the shared database's)."""
    from synapolis.store import store_for

    return store_for(ws).read_ledger()


# --- the CLI, as two agents would use it -----------------------------------------------------------

def test_two_agents_first_standby_second_consolidates(cli, state_dir):
    a = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)
    sid = a["session_id"]
    assert json.loads(cli("start", "--agent-id", "bob", "--json").stdout)["session_id"] == sid

    # alice is done while bob still works: standby, exit 0 at once; nothing waits for bob
    first = cli("tired", "--agent-id", "alice", "--memories", "-", "--json",
                input=json.dumps(["Tests run with uv run pytest",
                                  {"text": "DB is Postgres 15", "key": "db", "tags": ["infra"]}]))
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert (answer["outcome"], answer["active_others"], answer["staged"], answer["merged"]) == ("standby", 1, 2, 0)
    assert answer["pending_signals"] == []
    assert not (state_dir / "memory" / "ledger.jsonl").exists()
    assert json.loads((state_dir / "heartbeats" / "alice.json").read_text())["status"] == "idle"

    memories = state_dir / "bob-memories.jsonl"
    memories.write_text('"tests  run with UV run pytest"\n'
                        '{"text": "DB is Postgres 16", "key": "db"}\n'
                        '{"text": "CI needs docker", "tags": ["ci"]}\n')
    second = cli("tired", "--agent-id", "bob", "--memories", str(memories), "--json")
    assert second.returncode == 0, second.stderr
    answer = json.loads(second.stdout)
    assert (answer["outcome"], answer["active_others"], answer["staged"], answer["merged"]) == ("consolidated", 0, 3, 3)
    assert answer["session_status"] == "ended"

    lines = read_jsonl(state_dir / "memory" / "ledger.jsonl")
    assert len(lines) == 3
    by_norm = {line["norm"]: line for line in lines}
    assert by_norm["tests run with uv run pytest"]["sources"] == ["alice", "bob"]
    db = next(line for line in lines if line.get("key") == "db")
    assert db["text"] == "DB is Postgres 16" and db["sources"] == ["alice", "bob"] and db["tags"] == ["infra"]
    assert db["superseded"][0]["text"] == "DB is Postgres 15"
    assert by_norm["ci needs docker"]["sources"] == ["bob"]
    for line in lines:
        assert line["session_id"] == sid and line["merged_by"] == "bob"
        assert validation_errors("ledger", line) == []
    assert read_json(state_dir / "sessions" / sid / "session.json")["status"] == "ended"

    # the sleep_event reached alice honestly: unread, not delivered until a response carries it
    peek = json.loads(cli("read-signals", "--agent-id", "alice", "--session-id", sid, "--json").stdout)
    events = [s for s in peek["signals"] if s["type"] == "sleep_event"]
    assert len(events) == 1 and events[0]["sender"] == "bob" and events[0]["recipient"] == "*"
    conn = sqlite3.connect(state_dir / "sessions" / sid / "session.db")
    assert conn.execute("SELECT COUNT(*) FROM signal_deliveries").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0] == 0
    conn.close()


def test_text_output_says_what_happened(cli):
    sid = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "bob", "--session-id", sid)
    out = cli("tired", "--agent-id", "alice", "--session-id", sid, "--memories", "-", input='["one"]')
    assert out.returncode == 0
    assert out.stdout.startswith("standby: 1 other agent(s) still active") and "1 new memory" in out.stdout
    out = cli("tired", "--agent-id", "bob", "--session-id", sid, "--memories", "-", input='["two"]')
    assert out.returncode == 0
    assert out.stdout.startswith("consolidated:") and "2 new ledger line(s)" in out.stdout
    assert "+ one  (from alice)" in out.stdout and "+ two  (from bob)" in out.stdout
    # the broadcast is delivered to alice with her next response, after its own output
    out = cli("tired", "--agent-id", "alice", "--session-id", sid)
    assert "session had ended already" in out.stdout and "[sleep_event]" in out.stdout


@pytest.mark.parametrize("payload", ['{"text": ', '[1, 2]', '{"text": "x", "when": "now"}', '"ok"\n[]', "\x00\x01"])
def test_bad_memories_exit_2_and_nothing_is_staged(cli, state_dir, payload):
    sid = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "bob", "--session-id", sid)
    before = json.loads((state_dir / "heartbeats" / "alice.json").read_text())
    out = cli("tired", "--agent-id", "alice", "--session-id", sid, "--memories", "-", "--json", input=payload)
    assert out.returncode == 2
    assert json.loads(out.stdout)["error"]["type"] == "UsageError"
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    conn = sqlite3.connect(state_dir / "sessions" / sid / "session.db")
    assert conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0] == 0
    assert conn.execute("SELECT status FROM agents WHERE id = 'alice'").fetchone()[0] == "active"
    conn.close()
    assert json.loads((state_dir / "heartbeats" / "alice.json").read_text()) == before


def test_unreadable_memories_file_is_exit_2(cli, state_dir, tmp_path):
    sid = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    for source in (tmp_path / "missing.json", tmp_path):
        out = cli("tired", "--agent-id", "alice", "--session-id", sid, "--memories", str(source))
        assert out.returncode == 2 and "--memories" in out.stderr
    huge = tmp_path / "huge.json"
    huge.write_bytes(b"[" + b'"x",' * (sleep.MAX_INPUT_BYTES // 4) + b'"x"]')
    out = cli("tired", "--agent-id", "alice", "--session-id", sid, "--memories", str(huge))
    assert out.returncode == 2 and "larger than" in out.stderr


def test_identity_errors(cli):
    sid = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    assert cli("tired", "--agent-id", "nobody", "--session-id", sid).returncode == 4
    assert cli("tired", "--agent-id", "alice", "--session-id", sid, "--run-token", "wrong").returncode == 7
    assert cli("tired", "--agent-id", "../etc", "--session-id", sid).returncode == 2
    assert cli("tired", "--agent-id", "alice", "--session-id", "../x").returncode == 2
    assert cli("tired", "--agent-id", "alice", "--session-id", "no_such_session").returncode in (4, 6)


# --- the library, with time as a parameter ---------------------------------------------------------

def test_old_heartbeat_does_not_block_and_is_flagged_stale(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    start(ws, "carol", sid, now=now - timedelta(seconds=ws.config.stale_after_s + 60))  # crashed long ago

    first = sleep.tired(ws, who("alice", sid), memories=["a knows"], now=now)
    assert first["outcome"] == "standby" and first["active_others"] == 1   # bob, not carol
    assert first["flagged_stale"] == ["carol"]
    assert registry(ws, sid)["carol"] == "stale"

    last = sleep.tired(ws, who("bob", sid), memories=["b knows"], now=now + timedelta(seconds=1))
    assert last["outcome"] == "consolidated" and last["active_others"] == 0
    assert sorted(line["text"] for line in ledger(ws)) == ["a knows", "b knows"]
    assert registry(ws, sid) == {"alice": "idle", "bob": "idle", "carol": "stale"}


def test_restarted_agent_with_its_run_token_rejoins_at_once(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    token = start(ws, "bob", sid, now=now)["run_token"]
    actions.beat(ws, who("bob", sid), status="stopped", now=now)          # bob stops ...
    assert registry(ws, sid)["bob"] == "sleeping"
    again = start(ws, "bob", sid, run_token=token, now=now + timedelta(seconds=1))   # ... and comes back
    assert again["registration"] == "reclaimed" and again["run_token"] == token
    assert registry(ws, sid)["bob"] == "active"
    # being active again, bob holds the session open
    assert sleep.tired(ws, who("alice", sid), now=now + timedelta(seconds=2))["outcome"] == "standby"
    assert sleep.tired(ws, who("bob", sid), now=now + timedelta(seconds=3))["outcome"] == "consolidated"


def test_restarted_agent_rejoins_even_while_fresh_but_not_without_token(ws):
    from synapolis.errors import ConflictError

    now = utcnow()
    first = start(ws, "alice", new_session=True, now=now)
    sid, token = first["session_id"], first["run_token"]
    with pytest.raises(ConflictError):
        start(ws, "alice", sid, now=now + timedelta(seconds=1))           # the crash left a fresh row
    assert start(ws, "alice", sid, run_token=token, now=now + timedelta(seconds=1))["registration"] == "reclaimed"
    with pytest.raises(ForbiddenError):
        start(ws, "alice", sid, run_token="not-the-token", now=now + timedelta(seconds=2))


def test_consolidation_again_adds_nothing(ws):
    now = utcnow()
    memories = [{"text": "Use uv", "tags": ["py"]}, {"text": "db is pg", "key": "db"}]
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    first = sleep.tired(ws, who("alice", sid), memories=memories, now=now)
    assert (first["outcome"], first["merged"]) == ("consolidated", 2)
    snapshot = ledger(ws)

    # tired again in the ended session: consolidates what is staged (nothing new), exit 0
    again = sleep.tired(ws, who("alice", sid), memories=memories, now=now + timedelta(seconds=1))
    assert (again["outcome"], again["merged"], again["already_held"], again["ended_before"]) == ("consolidated", 0, 2, True)
    assert again["sleep_event"] is None

    # a new session learning the same things, spelled differently
    sid2 = start(ws, "bob", new_session=True, now=now + timedelta(seconds=2))["session_id"]
    third = sleep.tired(ws, who("bob", sid2), memories=["USE   UV", {"text": "DB IS PG", "key": "db"}],
                        now=now + timedelta(seconds=3))
    assert (third["outcome"], third["merged"], third["already_held"]) == ("consolidated", 0, 2)
    assert ledger(ws) == snapshot
    assert staged_count(ws, sid2) == 0


def test_ended_session_consolidates_what_is_staged(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    assert sleep.tired(ws, who("alice", sid), memories=["late alice"], now=now)["outcome"] == "standby"
    from synapolis.sessions import end_session

    end_session(ws, sid, now)                     # ended by someone else while bob is still active
    result = sleep.tired(ws, who("alice", sid), now=now + timedelta(seconds=1))
    assert result["outcome"] == "consolidated" and result["ended_before"] and result["active_others"] == 1
    assert [line["text"] for line in ledger(ws)] == ["late alice"]
    assert staged_count(ws, sid) == 0


def test_retried_tired_stages_once(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    first = sleep.tired(ws, who("alice", sid), memories=["x", "y"], now=now)
    second = sleep.tired(ws, who("alice", sid), memories=["x", "y", "z"], now=now + timedelta(seconds=1))
    assert (first["staged"], second["staged"]) == (2, 1)
    assert staged_count(ws, sid) == 3


@pytest.mark.sqlite_only
def test_broken_staged_row_is_left_staged_not_lost(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    conn = sqlite3.connect(ws.paths.session_db(sid))
    conn.execute("INSERT INTO staged_memories (id, agent_id, memory_data, created_at) VALUES ('junk', 'alice', '{oops', ?)",
                 (now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),))
    conn.commit()
    conn.close()
    result = sleep.tired(ws, who("alice", sid), memories=["good"], now=now)
    assert (result["outcome"], result["merged"], result["unreadable"]) == ("consolidated", 1, 1)
    assert [r["id"] for r in db_rows(ws, sid, "SELECT id FROM staged_memories")] == ["junk"]


def test_bad_memories_refused_before_any_write(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    seq = read_json(ws.paths.heartbeat("alice"))["seq"]
    for bad in ("{nope", [{"text": ""}], [None], {"text": "a dict is not a list"}, 42):
        with pytest.raises(UsageError):
            sleep.tired(ws, who("alice", sid), memories=bad, now=now)
    assert staged_count(ws, sid) == 0 and registry(ws, sid)["alice"] == "active"
    assert read_json(ws.paths.heartbeat("alice"))["seq"] == seq


def test_unregistered_caller_is_refused(ws):
    sid = start(ws, "alice", new_session=True)["session_id"]
    with pytest.raises(NoIdentityError):
        sleep.tired(ws, who("mallory", sid), memories=["x"])
    assert staged_count(ws, sid) == 0


def test_pending_signals_ride_along_unless_opted_out(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    actions.signal(ws, who("bob", sid), "alice", "before you go: push your branch", now=now)
    quiet = sleep.tired(ws, who("alice", sid), piggyback=False, now=now)
    assert quiet["pending_signals"] == []
    loud = sleep.tired(ws, who("alice", sid), now=now + timedelta(seconds=1))
    assert [s["content"] for s in loud["pending_signals"]] == ["before you go: push your branch"]
    assert loud["pending_signals"][0]["delivery_method"] == "piggyback"


def test_sleep_event_is_not_rate_limited(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    for i in range(int(ws.config.rate_limit_per_min)):
        actions.signal(ws, who("alice", sid), "bob", f"msg {i}", now=now)
    sleep.tired(ws, who("bob", sid), now=now)
    result = sleep.tired(ws, who("alice", sid), memories=["done"], now=now)
    assert result["outcome"] == "consolidated" and result["sleep_event"]


def test_heartbeat_and_registry_go_idle(ws):
    now = utcnow()
    sid = start(ws, "alice", new_session=True, now=now)["session_id"]
    start(ws, "bob", sid, now=now)
    actions.beat(ws, who("alice", sid), task="refactor", now=now)
    sleep.tired(ws, who("alice", sid), now=now + timedelta(seconds=5))
    doc = read_json(ws.paths.heartbeat("alice"))
    assert doc["status"] == "idle" and doc["task"] == "refactor" and doc["session_id"] == sid
    row = db_rows(ws, sid, "SELECT status, last_heartbeat FROM agents WHERE id = 'alice'")[0]
    assert row["status"] == "idle"
    assert row["last_heartbeat"] == (now + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
