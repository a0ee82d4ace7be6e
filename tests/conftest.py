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


# -- the team server (synapolis serve) ------------------------------------------------------------

class Served:
    """A running `synapolis serve` process: its base URL, its state directory, a way to make tokens."""

    def __init__(self, proc, url, state_dir, cli):
        self.proc, self.url, self.state_dir, self._cli = proc, url, state_dir, cli

    def token(self, name, *extra) -> str:
        made = self._cli("tokens", "create", name, *extra, "--json")
        assert made.returncode == 0, made.stderr
        return json.loads(made.stdout)["token"]


def start_server(state_dir, *args, timeout=30, env=None):
    """Start `synapolis serve --port 0 ARGS` on `state_dir`; (process, base URL) once it listens.
    Everything it says on stderr collects in `process.said` (drained, so it never blocks on a full pipe)."""
    import re
    import threading
    import time

    cmd = [sys.executable, "-m", "synapolis", "--state-dir", str(state_dir), "serve", "--port", "0", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_cli_env(env))
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(r"listening on (https?://\S+)", line)
        if found:
            proc.said = seen
            threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True).start()
            return proc, found.group(1)
    proc.kill()
    proc.wait()
    raise AssertionError(f"synapolis serve did not start: {''.join(seen)}")


@pytest.fixture
def served(state_dir, cli):
    """A `synapolis serve` on this test's state directory (loopback, any free port), stopped afterwards."""
    Workspace.open(state_dir).ensure()
    proc, url = start_server(state_dir)
    try:
        yield Served(proc, url, state_dir, cli)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mcp_http_client(url: str, token: str | None, mode: str = "legacy", **client_options):
    """The MCP SDK's client over streamable HTTP to `url`/mcp, with `token` as its bearer header."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = streamable_http_client(url + "/mcp", http_client=create_mcp_http_client(headers=headers))
    return Client(transport, mode=mode, **client_options)


# -- MCP tool calls and pushes, whatever the transport (tests/test_mcp*.py) -------------------------

DEADLINE_S = 10  # generous bound for "promptly" on a loaded 2-core machine; typical is ~20 ms


async def ok(client, tool, **args) -> dict:
    """Call a tool that must succeed; its structured result (which always carries pending_signals)."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    data = result.structured_content
    assert "pending_signals" in data and json.loads(result.content[0].text) == data
    return data


_SCHEMAS: dict = {}


async def output_schema(client, tool):
    if not _SCHEMAS:
        _SCHEMAS.update({t.name: t.output_schema for t in (await client.list_tools()).tools})
    return _SCHEMAS.get(tool)


async def fails(client, tool, type_name, exit_code, **args) -> str:
    """Call a tool that must fail with the contract's error; its one-line message, which is what a
    TypeScript SDK 1.x client shows the model too (no structured content breaking the output schema)."""
    result = await client.call_tool(tool, args)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert text.startswith(f"{type_name} (exit {exit_code}): "), text
    assert "\n" not in text and "Traceback" not in text
    ts_sdk1_check(result, await output_schema(client, tool))
    return text


class Inbox:
    """Collects `notifications/resources/updated` URIs and lets a test wait for one."""

    def __init__(self):
        import anyio

        self.uris: list[str] = []
        self._event = anyio.Event()

    async def __call__(self, message):
        if getattr(message, "method", None) == "notifications/resources/updated":
            self.uris.append(message.params.uri)
            self._event.set()

    async def wait_for(self, uri, deadline_s: float = DEADLINE_S):
        import anyio

        with anyio.fail_after(deadline_s):
            while uri not in self.uris:
                await self._event.wait()
                self._event = anyio.Event()
