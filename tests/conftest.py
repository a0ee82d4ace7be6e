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


def configure(ws, **values):
    """Set keys of the state directory's synapolis.json; the Workspace opened again with them."""
    document = json.loads(ws.paths.config.read_text())
    document.update(values)
    ws.paths.config.write_text(json.dumps(document))
    return Workspace.open(ws.root)


@pytest.fixture
def ws(state_dir):
    """An opened, created Workspace on this test's state directory."""
    return Workspace.open(state_dir).ensure()


def console_script(name: str) -> str:
    """A console script of this install (`synapolis`, `validate-heartbeat`): the one next to the running
    interpreter, never a name looked up on PATH, which on a fresh machine finds nothing or another install."""
    from pathlib import Path

    return str(Path(sys.executable).parent / name)


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


def set_written_at(path, moment: datetime) -> None:
    """Give a file the modification time `moment` (what a reader with no memory judges a clock that runs
    ahead by): a file written at the test's `now` looks written then, whatever the machine's clock says."""
    os.utime(path, (moment.timestamp(), moment.timestamp()))


@pytest.fixture
def put_heartbeat(ws):
    """Write a raw heartbeat file (no seq bookkeeping), as if written at `written_at` (default NOW):
    put_heartbeat(agent_id, beat_at, written_at=NOW, **fields) -> path."""
    def put(agent_id: str, beat_at: str, written_at: datetime = NOW, **fields):
        path = ws.paths.heartbeats / f"{agent_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(heartbeat_doc(agent_id, beat_at, **fields)))
        set_written_at(path, written_at)
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
