"""Shared fixtures: a fresh state directory per test, the CLI as a real process, raw heartbeat files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from synapolis.timeutil import format_ts
from synapolis.workspace import Workspace

# a fixed "now" for decision tests: time is a parameter, nobody sleeps
NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def ago(seconds: float, now: datetime = NOW) -> str:
    """The RFC 3339 stamp `seconds` before `now` (negative: in the future)."""
    return format_ts(now - timedelta(seconds=seconds))


@pytest.fixture
def state_dir(tmp_path):
    """A state directory path of this test's own (not created: verbs that write create it)."""
    return tmp_path / "state"


@pytest.fixture
def ws(state_dir):
    """An opened, created Workspace on this test's state directory."""
    return Workspace.open(state_dir).ensure()


def _cli_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPOLIS_")}
    env.update(extra or {})
    return env


@pytest.fixture
def cli(state_dir):
    """Run `python -m synapolis --state-dir <this test's state dir> ARGS...`; a CompletedProcess (text)."""
    def run(*args, input=None, env=None, timeout=60, state=None):
        cmd = [sys.executable, "-m", "synapolis", "--state-dir", str(state or state_dir), *map(str, args)]
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=_cli_env(env))
    return run


def heartbeat_doc(agent_id: str, beat_at: str, **fields) -> dict:
    """A schema-valid heartbeat document; `fields` override or add keys (None removes one)."""
    doc = {"schema_version": 1, "agent_id": agent_id, "harness": "test", "status": "active",
           "beat_at": beat_at, "seq": 1}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.fixture
def put_heartbeat(ws):
    """Write a raw heartbeat file (no seq bookkeeping): put_heartbeat(agent_id, beat_at, **fields) -> path."""
    def put(agent_id: str, beat_at: str, **fields):
        path = ws.paths.heartbeats / f"{agent_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(heartbeat_doc(agent_id, beat_at, **fields)))
        return path
    return put


# -- signal protocol helpers (tests/test_sessions.py, test_signals.py, test_delivery.py, ...) -----

@pytest.fixture
def start_agent(ws):
    """start_agent(agent_id, **kw) -> actions.start's answer, with no environment and `now=NOW` by default."""
    from synapolis import actions

    def start(agent_id=None, **kw):
        kw.setdefault("env", {})
        kw.setdefault("now", NOW)
        return actions.start(ws, agent_id=agent_id, **kw)
    return start


@pytest.fixture
def db_rows(ws):
    """db_rows(session_id, sql, *args) -> rows (as dicts) read straight from that session's session.db."""
    import sqlite3

    def rows(session_id, sql, *args):
        conn = sqlite3.connect(str(ws.paths.session_db(session_id)))
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, args).fetchall()]
        finally:
            conn.close()
    return rows


@pytest.fixture
def backlog(state_dir):
    """backlog(count, to="bob", content=...) -> (ws, session_id): alice and bob registered (no rate limit),
    then `count` signals from alice to `to` stored in one transaction, none delivered."""
    from synapolis import actions, signals
    from synapolis.store import SessionStore

    def make(count: int, to: str = "bob", content=lambda i: f"signal {i}"):
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 10 ** 6}))
        ws = Workspace.open(state_dir).ensure()
        sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]
        actions.start(ws, agent_id="bob", session_id=sid, env={}, now=NOW)
        with SessionStore.open(ws, sid) as store, store.write() as conn:
            for i in range(count):
                signals.send(conn, caller="alice", recipient=to, content=content(i), config=ws.config,
                             now=NOW + timedelta(microseconds=i), rate_limited=False)
        return ws, sid
    return make
