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


# -- MCP clients ---------------------------------------------------------------------------------

def ts_sdk1_check(result, output_schema) -> None:
    """Check a tool result the way a TypeScript MCP SDK 1.x client does before the model sees it
    (`Client.callTool`): a tool with an output schema must return structured content unless the result is
    an error, and structured content, when present, must match the schema even on an error. Raises
    AssertionError with the message such a client would show the model instead of the result."""
    import jsonschema

    if not output_schema:
        return
    structured = result.structured_content
    if structured is None:
        assert result.is_error, "-32602 Tool has an output schema but did not return structured content"
        return
    validator = jsonschema.validators.validator_for(output_schema)(output_schema)
    problems = [e.message for e in validator.iter_errors(structured)]
    assert not problems, f"-32602 Structured content does not match the tool's output schema: {problems}"
