"""Consensus sleep across real processes: a simultaneous `tired`, a crash mid-consolidation, a locked store."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from conftest import clean_env, synapolis_cmd
from synapolis import actions
from synapolis.atomic import read_json, read_jsonl
from synapolis.workspace import Workspace

AGENTS = [f"agent{i}" for i in range(5)]
SPAWN = multiprocessing.get_context("spawn")


def memories_of(agent: str, index: int) -> list:
    # every agent knows the shared fact (spelled its own way), one keyed value, and two of its own
    shared = ["The build uses Make", "the build  uses make", "THE BUILD USES MAKE", " the build uses Make ",
              "The Build Uses Make"][index]
    return [shared, {"text": f"port is {8000 + index}", "key": "port", "tags": [agent]},
            f"{agent} fixed bug {index}", {"text": f"{agent} owns module {index}", "tags": ["owner"]}]


def setup_session(state_dir: Path) -> tuple[Workspace, str]:
    ws = Workspace.open(state_dir).ensure()
    sid = None
    for agent in AGENTS:
        sid = actions.start(ws, agent_id=agent, session_id=sid, new_session=sid is None, write_identity=False)["session_id"]
    return ws, sid


def _tired_worker(state_dir, agent, index, session_id, barrier, results):
    from synapolis import sleep
    from synapolis.errors import SynapolisError
    from synapolis.identity import Who

    ws = Workspace.open(state_dir)
    barrier.wait(30)
    began = time.monotonic()
    try:
        answer = sleep.tired(ws, Who(agent, session_id), memories=memories_of(agent, index))
        results.put((agent, "ok", answer, time.monotonic() - began))
    except SynapolisError as exc:
        results.put((agent, exc.type_name, exc.message, time.monotonic() - began))


def check_round(state_dir: Path, sid: str, answers: dict) -> None:
    outcomes = sorted(a["outcome"] for a in answers.values())
    assert outcomes == ["consolidated"] + ["standby"] * 4
    last = next(a for a in answers.values() if a["outcome"] == "consolidated")
    assert last["active_others"] == 0 and last["consolidated"] == 20
    assert all(a["staged"] == 4 for a in answers.values())
    lines = read_jsonl(state_dir / "memory" / "ledger.jsonl")
    norms = [line["norm"] for line in lines]
    assert len(norms) == len(set(norms))                            # nothing doubled
    shared = [line for line in lines if line["norm"] == "the build uses make"]
    assert len(shared) == 1 and shared[0]["sources"] == AGENTS      # one line, everyone as a source
    ports = [line for line in lines if line.get("key") == "port"]
    assert len(ports) == 1 and set(ports[0]["sources"]) == set(AGENTS)
    for index, agent in enumerate(AGENTS):                          # nothing lost
        assert f"{agent} fixed bug {index}" in norms and f"{agent} owns module {index}" in norms
    assert len(lines) == 1 + 1 + 2 * len(AGENTS)
    assert read_json(state_dir / "sessions" / sid / "session.json")["status"] == "ended"
    conn = sqlite3.connect(state_dir / "sessions" / sid / "session.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM signals WHERE type = 'sleep_event'").fetchone()[0] == 1
        assert {r[0] for r in conn.execute("SELECT status FROM agents")} == {"idle"}
    finally:
        conn.close()


@pytest.mark.parametrize("round_", range(3))
def test_five_processes_tired_at_once_exactly_one_consolidates(tmp_path, round_):
    state_dir = tmp_path / "state"
    ws, sid = setup_session(state_dir)
    barrier = SPAWN.Barrier(len(AGENTS))
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_tired_worker, args=(str(state_dir), agent, i, sid, barrier, results))
             for i, agent in enumerate(AGENTS)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    failures = [g for g in got if g[1] != "ok"]
    assert failures == []                                           # no BusyError: nobody waited past the timeout
    busy_s = ws.config.busy_timeout_ms / 1000
    # a hang detector, not a benchmark: each call is one short transaction behind at most four others
    assert max(g[3] for g in got) < busy_s + 10
    check_round(state_dir, sid, {g[0]: g[2] for g in got})


def test_five_cli_processes_tired_at_once(tmp_path):
    state_dir = tmp_path / "state"
    _ws, sid = setup_session(state_dir)
    env = clean_env()
    procs = [subprocess.Popen(synapolis_cmd(state_dir, "tired", "--agent-id", agent, "--session-id", sid,
                                            "--memories", "-", "--json"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
             for agent in AGENTS]
    answers = {}
    for index, (agent, proc) in enumerate(zip(AGENTS, procs)):
        out, err = proc.communicate(json.dumps(memories_of(agent, index)), timeout=60)
        assert proc.returncode == 0, err
        answers[agent] = json.loads(out)
    check_round(state_dir, sid, answers)


def _crash_after_ledger_append(state_dir, agent, session_id):
    """Consolidate, but die by SIGKILL right after the ledger append, before the database commit."""
    from synapolis import sleep
    from synapolis.identity import Who
    from synapolis.store.local import ledger  # where the local store's ledger append lives (issue 34)

    original = ledger.append_to_ledger

    def append_then_die(*args, **kwargs):
        original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    ledger.append_to_ledger = append_then_die
    sleep.tired(Workspace.open(state_dir), Who(agent, session_id), memories=["last words", "The build uses Make"])


def test_crash_between_ledger_append_and_commit_then_retry(tmp_path):
    state_dir = tmp_path / "state"
    ws = Workspace.open(state_dir).ensure()
    sid = actions.start(ws, agent_id="alice", new_session=True, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, write_identity=False)
    from synapolis import sleep
    from synapolis.identity import Who

    assert sleep.tired(ws, Who("alice", sid), memories=["the build uses make", "alice note"])["outcome"] == "standby"

    proc = SPAWN.Process(target=_crash_after_ledger_append, args=(str(state_dir), "bob", sid))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    ledger = state_dir / "memory" / "ledger.jsonl"
    written = read_jsonl(ledger)
    assert sorted(line["norm"] for line in written) == ["alice note", "last words", "the build uses make"]
    # the database rolled back: everything still staged, the session not ended, the store not locked
    conn = sqlite3.connect(state_dir / "sessions" / sid / "session.db")
    assert conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM signals").fetchone()[0] == 0
    conn.close()
    assert read_json(state_dir / "sessions" / sid / "session.json")["status"] == "active"

    # bob's retry (a fresh process) merges the same memories: the ledger skips all it holds
    env = clean_env()
    out = subprocess.run(synapolis_cmd(state_dir, "tired", "--agent-id", "bob", "--session-id", sid,
                                       "--memories", "-", "--json"),
                         input='["last words", "The build uses Make"]', capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert (answer["outcome"], answer["merged"], answer["already_held"]) == ("consolidated", 0, 3)
    assert read_jsonl(ledger) == written
    assert read_json(state_dir / "sessions" / sid / "session.json")["status"] == "ended"


def _hold_write_lock(db_path, holding, release):
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    holding.set()
    release.wait(30)
    conn.execute("ROLLBACK")
    conn.close()


def test_locked_store_is_busy_exit_8_and_stages_nothing(tmp_path):
    state_dir = tmp_path / "state"
    ws = Workspace.open(state_dir).ensure()
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 300}))
    ws = Workspace.open(state_dir)
    sid = actions.start(ws, agent_id="alice", new_session=True, write_identity=False)["session_id"]
    holding, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(target=_hold_write_lock, args=(str(ws.paths.session_db(sid)), holding, release))
    holder.start()
    try:
        assert holding.wait(30)
        env = clean_env()
        out = subprocess.run(synapolis_cmd(state_dir, "tired", "--agent-id", "alice", "--session-id", sid,
                                           "--memories", "-", "--json"),
                             input='["kept for later"]', capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 8, out.stderr
        assert json.loads(out.stdout)["error"]["type"] == "BusyError"
    finally:
        release.set()
        holder.join(30)
    conn = sqlite3.connect(ws.paths.session_db(sid))
    assert conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0] == 0
    conn.close()
    assert not ws.paths.memory_ledger.exists()
