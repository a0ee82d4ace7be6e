"""The long-lived server's fast paths (synapolis.mcp.live.LongLived, issue 6): a pure refresh within the
window writes nothing, any change or an expired window writes, the CLI never coalesces; stores, callers and
config kept between calls stay correct when the files under them change."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from datetime import timedelta

import anyio
import pytest

from synapolis import actions, agent_call
from synapolis.identity import Who
from synapolis.mcp.live import LongLived
from synapolis.timeutil import format_ts

from conftest import clean_env, NOW, synapolis_cmd

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- helpers -------------------------------------------------------------------------------------------

def live_call(live, verb, *args, **kwargs):
    """`verb` run the way the MCP server runs it: inside `long_lived(live)`."""
    with agent_call.long_lived(live):
        return verb(*args, **kwargs)


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def heartbeat(ws, agent_id: str) -> dict:
    return json.loads(open(ws.paths.heartbeat(agent_id), "rb").read())


def disk(ws, agent_id: str, session_id: str) -> tuple:
    """Everything a refresh writes: the heartbeat file (bytes and identity), the registry row, the WAL."""
    hb = ws.paths.heartbeat(agent_id)
    st = os.stat(hb)
    wal = os.stat(str(ws.paths.session_db(session_id)) + "-wal")
    conn = sqlite3.connect(str(ws.paths.session_db(session_id)))
    try:
        row = conn.execute("SELECT status, last_heartbeat FROM agents WHERE id = ?", (agent_id,)).fetchone()
    finally:
        conn.close()
    return open(hb, "rb").read(), (st.st_ino, st.st_mtime_ns), tuple(row), (wal.st_size, wal.st_mtime_ns)


@pytest.fixture
def agent(ws, start_agent):
    """bob, started at NOW in a new session; his Who with the run token."""
    me = start_agent("bob", now=NOW)
    return Who("bob", me["session_id"], me["run_token"])


@pytest.fixture
def live():
    kept = LongLived()
    yield kept
    kept.close()


# -- the library: agent_call.as_agent(live=...)------------------------------------------------------------

def test_a_pure_refresh_within_the_window_writes_nothing(ws, agent, live):
    first = actions.read_signals(ws, agent, env={}, now=at(10))
    assert first["signals"] == []
    seq = heartbeat(ws, "bob")["seq"]
    for offset in (10.2, 10.5, 10.9):
        actions.read_signals(ws, agent, env={}, now=at(offset))  # CLI mode: no live, always writes
    assert heartbeat(ws, "bob")["seq"] == seq + 3
    with agent_call.long_lived(live):
        actions.note(ws, agent, "one", env={}, now=at(20))  # the first live call writes
    written = heartbeat(ws, "bob")
    assert written["seq"] == seq + 4 and written["beat_at"] == format_ts(at(20))
    before = disk(ws, "bob", agent.session_id)
    for offset in (20.1, 20.4, 20.99):
        answer = live_call(live, actions.read_signals, ws, agent, env={}, now=at(offset))
        assert answer["signals"] == []
        beat = live_call(live, actions.beat, ws, agent, env={}, now=at(offset))  # no change: active as before
        assert beat["heartbeat"]["seq"] == seq + 4 and beat["pending_signals"] == []
    # not a byte of the heartbeat, not the registry row, not one WAL frame (no write transaction at all)
    assert disk(ws, "bob", agent.session_id) == before


@pytest.mark.parametrize("change", [{"status": "idle"}, {"task": "reviewing"}, {"ttl_s": 120},
                                    {"note": "once"}])
def test_a_beat_with_any_change_always_writes(ws, agent, live, change):
    live_call(live, actions.beat, ws, agent, env={}, now=at(10))
    seq = heartbeat(ws, "bob")["seq"]
    answer = live_call(live, actions.beat, ws, agent, env={}, now=at(10.1), **change)
    doc = heartbeat(ws, "bob")
    assert doc["seq"] == seq + 1 == answer["heartbeat"]["seq"]
    for key, value in change.items():
        assert doc[key] == value
    row = disk(ws, "bob", agent.session_id)[2]
    assert row == (change.get("status", "active"), "2030-01-01T12:00:10.100000Z")
    # the same beat again is a pure refresh now, and coalesces (a note belongs to one beat: never)
    live_call(live, actions.beat, ws, agent, env={}, now=at(10.2), **change)
    assert heartbeat(ws, "bob")["seq"] == seq + (2 if "note" in change else 1)


def test_after_the_window_it_writes(ws, agent, live):
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10))
    seq = heartbeat(ws, "bob")["seq"]
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.5))
    assert heartbeat(ws, "bob")["seq"] == seq
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(11.01))
    assert heartbeat(ws, "bob")["seq"] == seq + 1
    assert disk(ws, "bob", agent.session_id)[2] == ("active", "2030-01-01T12:00:11.010000Z")
    # a clock that went backwards is no reason to skip a refresh either
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(5))
    assert heartbeat(ws, "bob")["seq"] == seq + 2


def test_the_window_is_at_most_a_quarter_of_the_ttl(ws, agent, live):
    live_call(live, actions.beat, ws, agent, ttl_s=2, env={}, now=at(10))
    seq = heartbeat(ws, "bob")["seq"]
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.4))
    assert heartbeat(ws, "bob")["seq"] == seq
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.6))  # past 2 s / 4
    assert heartbeat(ws, "bob")["seq"] == seq + 1


def test_another_writer_ends_the_coalescing(ws, agent, live, cli):
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10))
    mine = heartbeat(ws, "bob")["seq"]
    # another process (a hook, the CLI) beats the same agent: its file is not the one this process wrote
    done = cli("beat", "--agent-id", "bob", "--session-id", agent.session_id, "--task", "from the cli")
    assert done.returncode == 0, done.stderr
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.1))
    doc = heartbeat(ws, "bob")
    assert (doc["seq"], doc["task"], doc["beat_at"]) == (mine + 2, "from the cli", format_ts(at(10.1)))
    # the watchdog flags the registry row stale: the next call, coalescible by the file, writes the row
    conn = sqlite3.connect(str(ws.paths.session_db(agent.session_id)))
    with conn:
        conn.execute("UPDATE agents SET status = 'stale' WHERE id = 'bob'")
    conn.close()
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.2))
    assert heartbeat(ws, "bob")["seq"] == mine + 3
    assert disk(ws, "bob", agent.session_id)[2] == ("active", "2030-01-01T12:00:10.200000Z")


def test_a_coalesced_call_still_delivers_in_the_transaction_that_returns(ws, agent, live, start_agent, db_rows):
    start_agent("alice", session_id=agent.session_id, now=NOW)
    live_call(live, actions.note, ws, agent, "first", env={}, now=at(10))
    seq = heartbeat(ws, "bob")["seq"]
    actions.signal(ws, Who("alice", agent.session_id), "bob", "hello", env={}, now=at(10.1))
    got = live_call(live, actions.note, ws, agent, "second", env={}, now=at(10.2))
    assert [s["content"] for s in got["pending_signals"]] == ["hello"]
    rows = db_rows(agent.session_id,
                   "SELECT delivery_method, delivered_at FROM signal_deliveries WHERE agent_id = 'bob'")
    assert rows == [{"delivery_method": "piggyback", "delivered_at": "2030-01-01T12:00:10.200000Z"}]
    assert heartbeat(ws, "bob")["seq"] == seq  # the refresh itself was coalesced
    # read_signals is a pure query: nothing undelivered is marked, coalesced or not
    actions.signal(ws, Who("alice", agent.session_id), "bob", "again", env={}, now=at(10.3))
    assert [s["content"] for s in live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.4))["signals"]] \
        == ["hello", "again"]
    assert len(db_rows(agent.session_id, "SELECT * FROM signal_deliveries WHERE agent_id = 'bob'")) == 1
    assert live_call(live, actions.signals_pending, ws, agent, env={}, now=at(10.5))["pending_signals"][0]["content"] \
        == "again"


def test_no_piggyback_in_a_coalesced_call_marks_nothing(ws, agent, live, start_agent, db_rows):
    start_agent("alice", session_id=agent.session_id, now=NOW)
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10))
    actions.signal(ws, Who("alice", agent.session_id), "bob", "later", env={}, now=at(10.1))
    with agent_call.long_lived(live):
        answer = actions.note(ws, agent, "quiet", env={}, now=at(10.2), piggyback=False)
    assert answer["pending_signals"] == []
    assert db_rows(agent.session_id, "SELECT * FROM signal_deliveries") == []


def test_cli_calls_are_never_coalesced(ws, agent, cli):
    seq = heartbeat(ws, "bob")["seq"]
    for _ in range(3):
        done = cli("read-signals", "--agent-id", "bob", "--session-id", agent.session_id, "--json")
        assert done.returncode == 0, done.stderr
    assert heartbeat(ws, "bob")["seq"] == seq + 3
    # and the library without `live` (what the CLI and hooks call) writes every time, whatever the clock
    for offset in (10, 10.1, 10.2):
        actions.read_signals(ws, agent, env={}, now=at(offset))
    assert heartbeat(ws, "bob")["seq"] == seq + 6


def test_decision_function(ws):
    from synapolis.mcp.live import refresh_is_redundant

    doc = {"status": "active", "harness": "mcp", "seq": 3}
    last = {"at": NOW, "doc": doc, "signature": (1, 2, 3, 4), "registry": ("r", "active")}
    row = {"last_heartbeat": "r", "status": "active"}
    assert refresh_is_redundant(last, {"harness": "mcp"}, row, (1, 2, 3, 4), at(0.5), 1.0)
    assert not refresh_is_redundant(None, {}, row, (1, 2, 3, 4), at(0.5), 1.0)
    assert not refresh_is_redundant(last, {}, row, (1, 2, 3, 4), at(1.0), 1.0)
    assert not refresh_is_redundant(last, {}, row, (1, 2, 3, 4), at(-0.1), 1.0)
    assert not refresh_is_redundant(last, {"harness": "cli"}, row, (1, 2, 3, 4), at(0.5), 1.0)
    assert not refresh_is_redundant(last, {}, row, (1, 2, 9, 4), at(0.5), 1.0)
    assert not refresh_is_redundant(last, {}, row, None, at(0.5), 1.0)
    assert not refresh_is_redundant(last, {}, {"last_heartbeat": "r", "status": "stale"}, (1, 2, 3, 4), at(0.5), 1.0)
    assert not refresh_is_redundant(last, {}, None, (1, 2, 3, 4), at(0.5), 1.0)


# -- what the long-lived process keeps: stores, callers -------------------------------------------------

def test_a_kept_caller_rechecks_the_run_token(ws, agent, live):
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10))
    conn = sqlite3.connect(str(ws.paths.session_db(agent.session_id)))
    with conn:  # another process took the slot over: the token the caller presents is no longer bob's
        conn.execute("UPDATE agents SET run_token = 'someone-else' WHERE id = 'bob'")
    conn.close()
    from synapolis.errors import ForbiddenError

    with pytest.raises(ForbiddenError):
        live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.1))
    with pytest.raises(ForbiddenError):
        live_call(live, actions.note, ws, agent, "x", env={}, now=at(10.2))


def test_a_kept_store_follows_its_database(ws, agent, live, start_agent):
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(10))
    # the session's database replaced under the pool (a restore from a backup): the next call opens the new one
    db = str(ws.paths.session_db(agent.session_id))
    os.replace(db, db + ".old")
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    from synapolis.errors import NotFoundError

    with pytest.raises(NotFoundError):
        live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.1))
    again = start_agent("bob", session_id=agent.session_id, run_token=agent.run_token, now=at(10.2))
    assert again["registration"] == "joined"
    assert live_call(live, actions.read_signals, ws, agent, env={}, now=at(10.3))["signals"] == []


def test_a_verb_that_must_not_wait_is_refused_at_once_by_a_locked_store_and_changes_nothing(ws, agent, live,
                                                                                          start_agent, db_rows):
    """NoWait (how the server runs a verb on its event loop): with the session's store locked by another
    process, the verb is refused at once (BusyError, the attempt marked blocked) and has stored nothing; the
    same verb run again once the lock is gone (as the server does, on a thread) stores it once. A lock that
    waited its time inside a transaction (a file lock) is not the store's refusal: not marked."""
    from conftest import Holder

    from synapolis.errors import BusyError
    from synapolis.mcp.live import NoWait, not_waiting

    start_agent("carol", session_id=agent.session_id, now=NOW)
    live_call(live, actions.read_signals, ws, agent, env={}, now=at(1))  # a normal store in the pool too
    with Holder.store(ws.paths.session_db(agent.session_id)):
        attempt = NoWait()
        began = time.monotonic()
        with not_waiting(attempt), pytest.raises(BusyError):
            live_call(live, actions.signal, ws, agent, "carol", "once", env={}, now=at(2))
        assert time.monotonic() - began < 1.0  # busy_timeout_ms is 5000: it did not wait for it
        assert attempt.blocked
    assert db_rows(agent.session_id, "SELECT content FROM signals") == []
    sent = live_call(live, actions.signal, ws, agent, "carol", "once", env={}, now=at(3))
    assert sent["signal"]["content"] == "once"
    assert [r["content"] for r in db_rows(agent.session_id, "SELECT content FROM signals")] == ["once"]

    attempt = NoWait()
    with not_waiting(attempt), pytest.raises(BusyError):
        with live.store(ws, agent.session_id) as store, store.read():
            raise BusyError("a file lock stayed locked")
    assert not attempt.blocked

    # a read takes its lock at its first statement: a store nobody else may even read (another process in
    # exclusive locking mode) refuses that statement, and that is the store's refusal too
    exclusive = ("import sqlite3, sys, time\n"
                 "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                 "conn.execute('PRAGMA locking_mode = EXCLUSIVE')\n"
                 "conn.execute('BEGIN EXCLUSIVE')\n"
                 "conn.execute('SELECT COUNT(*) FROM signals').fetchone()\n"
                 "print('holding', flush=True)\n"
                 "time.sleep(120)\n")
    live.close()  # the kept connections of the pool would keep the other process from its exclusive lock
    with Holder(exclusive, ws.paths.session_db(agent.session_id)):
        attempt = NoWait()
        with not_waiting(attempt), pytest.raises(BusyError):
            live_call(live, actions.read_signals, ws, agent, env={}, now=at(4))
        assert attempt.blocked


# -- the server ------------------------------------------------------------------------------------------

def _server_calls(state_dir, fast: bool, calls: int) -> tuple[int, float]:
    """(heartbeat seq growth, seconds taken) over `calls` back-to-back read_signals of one in-process server."""
    from mcp import Client

    from synapolis.mcp.server import create_server

    out = {}

    async def main():
        async with Client(create_server(state_dir, {}, fast=fast), mode="legacy") as client:
            started = await client.call_tool("start_session", {"agent_id": "rt"})
            assert not started.is_error
            first = (await client.call_tool("beat", {"task": "x"})).structured_content["heartbeat"]["seq"]
            began = time.monotonic()
            for _ in range(calls):
                answer = await client.call_tool("read_signals", {})
                assert not answer.is_error, answer.content
            last = (await client.call_tool("beat", {})).structured_content["heartbeat"]["seq"]
            out.update(growth=last - first, seconds=time.monotonic() - began)

    anyio.run(main)
    return out["growth"], out["seconds"]


def test_the_server_coalesces_back_to_back_calls(state_dir):
    growth, seconds = _server_calls(state_dir, True, 20)
    # one write per started second at most (never one per call), whatever the machine's speed
    assert growth <= int(seconds) + 1 < 21


def test_the_baseline_server_never_coalesces(tmp_path):
    growth, _seconds = _server_calls(tmp_path / "state", False, 5)
    assert growth == 6


def test_a_config_edit_applies_to_the_next_call(state_dir, ws):
    from mcp import Client

    from synapolis.mcp.server import create_server

    async def main():
        server = create_server(state_dir, {})
        async with Client(server, mode="legacy") as client:
            await client.call_tool("start_session", {"agent_id": "rt"})
            config = json.loads(open(ws.paths.config).read())
            os.utime(ws.paths.config, ns=(time.time_ns() - 10**10,) * 2)  # an old file: kept by signature
            first = await client.call_tool("signal", {"to": "*", "content": "one"})
            assert not first.is_error
            config["rate_limit_per_min"] = 1
            with open(ws.paths.config, "w") as handle:  # an in-place edit
                json.dump(config, handle)
            second = await client.call_tool("signal", {"to": "*", "content": "two"})  # the bucket's last token
            assert not second.is_error
            limited = await client.call_tool("signal", {"to": "*", "content": "three"})
            assert limited.is_error and limited.content[0].text.startswith("RateLimitedError (exit 5)")

    anyio.run(main)


def test_stdio_that_is_not_a_pipe_is_served_by_the_sdk(state_dir, tmp_path):
    """A regular file on stdin (no pipe): the SDK's own stdio serves it. (Its end of input ends the server at
    once, cancelling what is in flight, so only the handshake, answered in order, is asserted.)"""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        + "\n")
    answers = tmp_path / "answers.jsonl"
    env = clean_env()
    with open(requests) as stdin, open(answers, "w") as stdout:
        done = subprocess.run(synapolis_cmd(state_dir, "mcp"),
                              stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    replies = {m.get("id"): m for m in map(json.loads, answers.read_text().splitlines())}
    assert replies[1]["result"]["serverInfo"]["name"] == "synapolis"
    assert "Traceback" not in done.stderr
