"""Signals with real processes: many concurrent senders, SIGKILL mid-send, a locked store, --follow."""

from __future__ import annotations

import json
import multiprocessing
import signal as signals_module
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import clean_env, synapolis_cmd, wait_until
from synapolis import actions
from synapolis.timeutil import utcnow
from synapolis.identity import Who
from synapolis.workspace import Workspace

SENDERS = 8
PER_SENDER = 500


def _set_config(state_dir, **values):
    path = state_dir / "synapolis.json"
    doc = json.loads(path.read_text())
    doc.update(values)
    path.write_text(json.dumps(doc))


def _send_many(state_dir, session_id, agent_id, count, barrier, errors):
    ws = Workspace.open(state_dir)
    who = Who(agent_id, session_id)
    barrier.wait(timeout=60)
    for i in range(count):
        try:
            actions.signal(ws, who, "sink", f"{agent_id}:{i}", env={})
        except Exception as exc:  # noqa: BLE001 - counted, the test asserts there are none
            errors.put(f"{agent_id}:{i}: {type(exc).__name__}: {exc}")


@pytest.mark.sqlite_only  # SQLite's file itself (PostgreSQL: tests/test_store_postgres.py)
def test_eight_processes_five_hundred_signals_each(ws, start_agent, db_rows):
    _set_config(ws.root, rate_limit_per_min=100000)
    sid = start_agent("sink")["session_id"]
    names = [f"sender{i}" for i in range(SENDERS)]
    for name in names:
        start_agent(name)
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(SENDERS), ctx.Queue()
    procs = [ctx.Process(target=_send_many, args=(str(ws.root), sid, n, PER_SENDER, barrier, errors)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * SENDERS
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert problems == []
    rows = db_rows(sid, "SELECT sequence, id, sender, content FROM signals ORDER BY sequence")
    assert len(rows) == SENDERS * PER_SENDER
    assert len({r["id"] for r in rows}) == len(rows)
    contents = [r["content"] for r in rows]
    assert sorted(contents) == sorted(f"{n}:{i}" for n in names for i in range(PER_SENDER))
    sequences = [r["sequence"] for r in rows]
    assert all(b > a for a, b in zip(sequences, sequences[1:]))
    for name in names:  # each sender's signals are stored in the order it sent them
        mine = [int(r["content"].split(":")[1]) for r in rows if r["sender"] == name]
        assert mine == list(range(PER_SENDER))
    assert db_rows(sid, "PRAGMA integrity_check")[0]["integrity_check"] == "ok"


_LOOP_SENDER = r"""
import os, sys
from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace
state_dir, session_id, log = sys.argv[1:4]
ws = Workspace.open(state_dir)
i = 0
with open(log, "a") as out:
    while True:
        sent = actions.signal(ws, Who("killer", session_id), "sink", f"{i}:" + "z" * 60000, env={}, piggyback=False)
        out.write(sent["signal"]["id"] + "\n"); out.flush()
        i += 1
"""


@pytest.mark.sqlite_only  # SQLite's file itself (PostgreSQL: tests/test_store_postgres.py)
def test_sigkill_mid_send_leaves_a_sound_store(ws, start_agent, db_rows, tmp_path):
    _set_config(ws.root, rate_limit_per_min=100000)
    sid = start_agent("sink")["session_id"]
    start_agent("killer")
    log = tmp_path / "sent.log"
    log.touch()
    # a library sender in a loop, killed at an arbitrary point of its work
    proc = subprocess.Popen([sys.executable, "-c", _LOOP_SENDER, str(ws.root), sid, str(log)], env=clean_env())
    wait_until(lambda: len(log.read_text().splitlines()) >= 40 or proc.poll() is not None, 30,
               "the sender to log 40 signals")
    proc.send_signal(signals_module.SIGKILL)
    proc.wait(timeout=10)
    logged = [line for line in log.read_text().splitlines() if len(line) == 64]
    assert len(logged) >= 40
    # CLI senders, some killed mid-flight: every one that exited 0 must be stored
    popen = [subprocess.Popen(synapolis_cmd(ws.root, "signal", "sink", f"cli {n} " + "q" * 30000, "--agent-id", "killer",
                                       "--session-id", sid, "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
             for n in range(8)]
    for n, p in enumerate(popen):
        if n % 2:
            time.sleep(0.05 * n)  # where the kill lands: a later moment for each sender, not a wait
            p.send_signal(signals_module.SIGKILL)
    confirmed = []
    for p in popen:
        out, _err = p.communicate(timeout=60)
        if p.returncode == 0:
            confirmed.append(json.loads(out)["signal"]["id"])
    assert len(confirmed) >= 4
    conn = sqlite3.connect(str(ws.paths.session_db(sid)))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = {r[0] for r in conn.execute("SELECT id FROM signals")}
    finally:
        conn.close()
    assert set(logged) <= stored and set(confirmed) <= stored
    # and the store still works for everyone
    out = subprocess.run(synapolis_cmd(ws.root, "read-signals", "--agent-id", "sink", "--limit", "1", "--json"),
                         capture_output=True, text=True, env=clean_env(), timeout=60)
    assert out.returncode == 0 and len(json.loads(out.stdout)["signals"]) == 1


_HOLDER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE agents SET harness = harness")
print("holding", flush=True)
time.sleep(60)
"""


@pytest.mark.sqlite_only  # SQLite's file itself (PostgreSQL: tests/test_store_postgres.py)
def test_a_locked_store_is_exit_8_within_the_busy_timeout(ws, start_agent):
    _set_config(ws.root, busy_timeout_ms=300)
    # registered on the machine's clock, which the CLI processes below read: two live agents, so
    # identity.json names nobody for list-agents (a registry stamp from the future would not be live)
    sid = start_agent("alice", now=utcnow())["session_id"]
    start_agent("bob", now=utcnow())
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(ws.paths.session_db(sid))],
                              stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert holder.stdout.readline().strip() == "holding"
        for args in (["signal", "bob", "x", "--agent-id", "alice"], ["ack-signals", "--all", "--agent-id", "bob"],
                     ["start", "--agent-id", "carol"]):
            began = time.monotonic()
            out = subprocess.run(synapolis_cmd(ws.root, *args, "--json"), capture_output=True, text=True, env=clean_env(),
                                 timeout=30)
            took = time.monotonic() - began
            assert out.returncode == 8, (args, out.stderr)
            assert json.loads(out.stdout)["error"]["type"] == "BusyError"
            assert "Traceback" not in out.stderr and "busy_timeout_ms=300" in out.stderr
            assert took < 10  # never a hang (process start-up included)
        # WAL readers are not blocked by the writer
        listed = subprocess.run(synapolis_cmd(ws.root, "list-agents", "--session-id", sid, "--json", "--no-piggyback"),
                                capture_output=True, text=True, env=clean_env(), timeout=30)
        assert listed.returncode == 0 and len(json.loads(listed.stdout)["agents"]) == 2
    finally:
        holder.kill()
        holder.wait(timeout=10)
    ok = subprocess.run(synapolis_cmd(ws.root, "signal", "bob", "x", "--agent-id", "alice"), capture_output=True,
                        env=clean_env(), timeout=30)
    assert ok.returncode == 0


class _Lines:
    """Lines of a child's stdout, read by a thread, so a wait has a deadline and never blocks forever."""

    def __init__(self, stream):
        import queue
        import threading

        self._queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            self._queue.put(line)

    def next(self, timeout: float) -> str:
        import queue

        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no line before the deadline") from None


def _interrupt(follower) -> None:
    """Ctrl-C for a `read-signals --follow` process; killed if it has not ended within 10 s."""
    follower.send_signal(signals_module.SIGINT)
    try:
        follower.wait(timeout=10)
    except subprocess.TimeoutExpired:
        follower.kill()


def test_follow_streams_new_signals(ws, start_agent, db_rows):
    sid = start_agent("alice")["session_id"]
    start_agent("bob")
    actions.signal(ws, Who("alice", sid), "bob", "before", env={})
    follower = subprocess.Popen(synapolis_cmd(ws.root, "read-signals", "--follow", "--json", "--agent-id", "bob"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        lines = _Lines(follower.stdout)
        first = json.loads(lines.next(30))
        assert first["content"] == "before"
        # watching started before the first line was printed (follow_signals): no wait for the observer
        began = time.monotonic()
        actions.signal(ws, Who("alice", sid), "bob", "during", env={})
        actions.signal(ws, Who("alice", sid), "*", "to all", env={})
        actions.signal(ws, Who("alice", sid), "alice", "not for bob", env={})
        got = [json.loads(lines.next(30))["content"] for _ in range(2)]
        assert got == ["during", "to all"]
        assert time.monotonic() - began < 4.5  # noticed by the watcher, not by the 5 s safety re-check
        # following is a pure query: nothing was marked delivered
        assert db_rows(sid, "SELECT * FROM signal_deliveries WHERE agent_id = 'bob'") == []
    finally:
        _interrupt(follower)
    assert follower.returncode == 0
    assert "Traceback" not in follower.stderr.read()


def test_concurrent_first_starts_share_one_session(ws):
    procs = [subprocess.Popen(synapolis_cmd(ws.root, "start", "--agent-id", f"agent{i}", "--json"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env()) for i in range(4)]
    sessions = set()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        sessions.add(json.loads(out)["session_id"])
    assert len(sessions) == 1


def test_follow_prints_every_unread_signal_when_the_first_page_is_cut_by_its_budget(ws, start_agent):
    # four 40,000-character signals: read-signals' first page holds two (PAGE_BUDGET_CHARS); --follow used to
    # start from the newest sequence after that page and never print the other two, unread as they are
    sid = start_agent("alice")["session_id"]
    start_agent("bob")
    for i in range(4):
        actions.signal(ws, Who("alice", sid), "bob", "x" * 40_000 + f" big {i}", env={})
    follower = subprocess.Popen(synapolis_cmd(ws.root, "read-signals", "--follow", "--json", "--agent-id", "bob"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        lines = _Lines(follower.stdout)
        got = [json.loads(lines.next(30))["content"][-5:] for _ in range(4)]
        assert got == ["big 0", "big 1", "big 2", "big 3"]
        actions.signal(ws, Who("alice", sid), "bob", "after", env={})
        assert json.loads(lines.next(30))["content"] == "after"  # and then each new one, as before
    finally:
        _interrupt(follower)
    assert "Traceback" not in follower.stderr.read()
