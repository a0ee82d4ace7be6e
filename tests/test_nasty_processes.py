"""Nasty neighbours: a process holding a lock or the store, a FIFO where a file belongs, a writer killed
mid-write. Every verb ends in bounded time with the contract's exit code (hooks: exit 0)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import clean_env, Holder, synapolis_cmd, validate_heartbeat_cmd
from synapolis import actions, atomic, heartbeat
from synapolis.errors import BusyError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock, FIFOs and SIGKILL are POSIX")


def timed(cli, *args, **kw):
    began = time.monotonic()
    out = cli(*args, timeout=60, **kw)
    return out, time.monotonic() - began


@pytest.fixture
def session(ws):
    """alice and bob in one session, with a short busy timeout; the session id."""
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 300}))
    sid = actions.start(ws, agent_id="alice", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    return sid


def test_every_verb_on_a_locked_store_is_exit_8_and_hooks_exit_0(ws, cli, session):
    alice = ["--agent-id", "alice", "--session-id", session]
    assert cli("claim", "item", *alice).returncode == 0
    with Holder.store(ws.paths.session_db(session)):
        # (signal, ack-signals and start: tests/test_signals_processes.py)
        for args in (["beat", *alice], ["read-signals", *alice], ["whiteboard-write", "k", "v", *alice],
                     ["tired", *alice]):
            out, took = timed(cli, *args, "--json")
            assert out.returncode == 8, (args, out.stderr)
            assert json.loads(out.stdout)["error"]["type"] == "BusyError" and "Traceback" not in out.stderr
            assert took < 15, args  # busy_timeout_ms=300 plus process start-up; never a hang
        hook = subprocess.run(synapolis_cmd(ws.root, "hook", "claude-code"),
                              input=json.dumps({"session_id": "conv", "hook_event_name": "UserPromptSubmit"}),
                              capture_output=True, text=True, timeout=60, env=clean_env())
        assert hook.returncode == 0 and json.loads(hook.stdout) == {} and "locked" in hook.stderr
    # (claim and release are done outside the store and succeed: tests/test_integrity.py)
    # nothing was half-done: the claim is still alice's, the store answers again
    assert json.loads(cli("claims", "--json").stdout)["claims"][0]["claimed_by"] == "alice"
    assert cli("note", "after", *alice).returncode == 0


def test_a_stuck_lock_holder_is_busy_not_a_hang(ws, cli, session):
    # before: every blocking flock waited forever for a stopped or hung holder
    alice = ["--agent-id", "alice", "--session-id", session]
    with Holder.flock(ws.paths.lock("heartbeat.alice")):
        out, took = timed(cli, "beat", *alice, "--json")
        assert out.returncode == 8, out.stderr
        assert json.loads(out.stdout)["error"]["type"] == "BusyError"
        assert "heartbeat.alice.lock" in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert atomic.LOCK_TIMEOUT_S <= took < atomic.LOCK_TIMEOUT_S + 15
    assert cli("beat", *alice).returncode == 0
    assert heartbeat.read_heartbeat(ws.paths.heartbeat("alice")).valid


def test_locks_and_appends_give_up_after_their_timeout(ws, monkeypatch):
    monkeypatch.setattr(atomic, "LOCK_TIMEOUT_S", 0.3)
    lock = ws.paths.lock("anything")
    lock.parent.mkdir(parents=True, exist_ok=True)
    log = ws.root / "log.jsonl"
    with Holder.flock(lock), Holder.flock(log):
        for attempt in (lambda: atomic.locked(lock).__enter__(), lambda: atomic.locked(lock, timeout=0.1).__enter__(),
                        lambda: atomic.append_jsonl(log, {"a": 1})):
            began = time.monotonic()
            with pytest.raises(BusyError):
                attempt()
            assert time.monotonic() - began < 5
        with atomic.locked(lock, blocking=False) as got:
            assert got is False
    with atomic.locked(lock) as got:  # free again: taken at once
        assert got is True
    atomic.append_jsonl(log, {"a": 1})
    assert atomic.read_jsonl(log) == [{"a": 1}]


def test_a_fifo_where_a_state_file_belongs_never_blocks(ws, cli, session):
    # before: open() of a FIFO waits for a writer, so one stray FIFO hung every verb that read it
    os.mkfifo(ws.paths.heartbeats / "ghost.json")
    out, took = timed(cli, "monitor", "--json")
    assert out.returncode == 0 and took < 30, out.stderr
    ghost = [a for a in json.loads(out.stdout)["agents"] if a["agent_id"] == "ghost"]
    assert ghost[0]["effective_status"] == "invalid"
    ws.paths.identity.unlink()
    os.mkfifo(ws.paths.identity)
    out, took = timed(cli, "beat")
    assert out.returncode == 4 and took < 30, out.stderr  # no identity.json to read: NoIdentityError
    ws.paths.config.unlink()
    os.mkfifo(ws.paths.config)
    out, took = timed(cli, "beat", "--agent-id", "alice")
    assert out.returncode == 2 and "not a regular file" in out.stderr and took < 30


_WRITER = """
import sys
from synapolis import actions, monitor
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
who = Who("alice", sys.argv[2])
big = "x" * 60000
print("writing", flush=True)
i = 0
while True:
    i += 1
    try:
        (lambda: actions.note(ws, who, big, env={}),
         lambda: actions.signal(ws, who, "bob", big, env={}),
         lambda: actions.whiteboard_write(ws, who, "k", big, env={}),
         lambda: actions.claim(ws, who, "item" + str(i % 3), env={}),
         lambda: actions.release(ws, who, "item" + str(i % 3), env={}),
         lambda: monitor.run_monitor(ws),
         lambda: actions.beat(ws, who, task="t" * 4000, env={}))[i % 7]()
    except Exception as exc:
        if type(exc).__name__ not in ("RateLimitedError", "NotFoundError", "ConflictError"):
            raise
"""


def test_writers_killed_mid_write_leave_nothing_a_later_verb_chokes_on(ws, cli, session):
    rng = random.Random(7)
    for _ in range(5):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(ws.root), session], stdout=subprocess.PIPE,
                                  text=True, env=clean_env())
        assert writer.stdout.readline().strip() == "writing"
        time.sleep(rng.uniform(0.05, 0.6))  # where the kill lands: a random moment mid-write, not a wait
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    alice = ["--agent-id", "alice", "--session-id", session]
    for args in (["read-signals", "--agent-id", "bob", "--all"], ["note", "n", *alice], ["whiteboard-read"],
                 ["claim", "item1", *alice], ["watchdog"], ["status"]):
        out = cli(*args, "--json")
        assert out.returncode == 0, (args, out.stderr)
        json.loads(out.stdout)
    valid = subprocess.run(validate_heartbeat_cmd(ws.root, "--json"),
                           capture_output=True, text=True, timeout=60, env=clean_env())
    assert valid.returncode == 0, valid.stdout
    seqs = [n["seq"] for n in json.loads(cli("read-notes", "--limit", "1000", "--json").stdout)["notes"]]
    assert seqs == sorted(set(seqs))  # a torn tail never made two notes share a seq
