"""`synapolis mcp`'s front (synapolis/mcp/front.py, issue 29): the handshake and the fixed lists answered from a
snapshot before the SDK has loaded. The snapshot is what the real server answers today; over raw JSON-RPC the
front and the server it replaced (the SDK answering everything) give the same answers to the same requests,
in both protocol eras and on the unusual paths; a discovery probe followed by `initialize` on the same
connection is served; and the real Claude Code sees synapolis's tools in its first request to the model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import clean_env, harness_binary, synapolis_cmd
from synapolis.mcp import front, snapshot
from synapolis.mcp.snapshot import Wire, envelope

MODERN = "2026-07-28"
CLIENT = {"name": "front-test", "version": "1"}


def init(version="2025-06-18", **params):
    return {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT, **params}


def request(request_id, method, params=None):
    return {"jsonrpc": "2.0", "id": request_id, "method": method, **({} if params is None else {"params": params})}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
BAD_SIGNAL = {"name": "signal", "arguments": {"to": "../x", "content": "c", "agent_id": "alice"}}

SCRIPTS = {
    "legacy": [request(1, "initialize", init()), INITIALIZED, request(2, "tools/list"),
               request(3, "resources/templates/list"), request(4, "resources/list"), request(5, "prompts/list"),
               request(6, "ping"), request(7, "tools/list", {"cursor": "elsewhere"}),
               request(8, "tools/call", BAD_SIGNAL), request("nine", "tools/list", {"_meta": {"progressToken": 3}}),
               request(10, "tools/list", envelope(MODERN)), request(11, "initialize", init())],
    "legacy, a version the server does not speak": [request(1, "initialize", init("1999-01-01")), INITIALIZED,
                                                      request(2, "tools/list")],
    "legacy, a request before initialize": [request(1, "tools/list"), request(2, "initialize", init()),
                                            request(3, "tools/list")],
    "legacy, an initialize the SDK refuses": [request(1, "initialize", {"protocolVersion": "2025-06-18",
                                                                        "capabilities": {},
                                                                        "clientInfo": {"name": "no version"}}),
                                              request(2, "initialize", init()), request(3, "tools/list")],
    "modern": [request(1, "tools/list", envelope(MODERN)), request(2, "server/discover", envelope(MODERN)),
               request(3, "resources/templates/list", envelope(MODERN)), request(4, "tools/call",
                                                                                 {**BAD_SIGNAL, **envelope(MODERN)}),
               request(5, "initialize", init()), request(6, "tools/list", envelope("2099-01-01")),
               request(7, "tools/list"), request(8, "prompts/list", envelope(MODERN)),
               request(9, "ping", envelope(MODERN))],
    "modern, a malformed envelope first": [request(1, "tools/list", {"_meta": {front.VERSION_KEY: MODERN}}),
                                           request(2, "tools/list", envelope(MODERN)),
                                           request(3, "server/discover", envelope(MODERN))],
    "modern, discovery then lists": [request(1, "server/discover", envelope(MODERN)),
                                     request(2, "resources/list", envelope(MODERN)),
                                     request(3, "tools/list", envelope(MODERN)), request(4, "initialize", init())],
}


def run_script(cmd, script) -> dict:
    """Each request's answer (the whole message but its id), by id; every request answered before the next."""
    wire = Wire(cmd, env=clean_env(), timeout=60)
    answers = {}
    try:
        for message in script:
            if "id" in message:
                answer = wire.ask(message["method"], message.get("params"), request_id=message["id"])
                answers[message["id"]] = {k: v for k, v in answer.items() if k != "id"}
            else:
                wire.send(message)
    finally:
        assert wire.close() == 0
    # nothing else that answers a request: the front drops the SDK's answer to the request it replayed
    assert [m for m in wire.passed if m.get("id") is not None] == [], wire.passed
    return answers


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_front_answers_as_the_sdk_alone_did(state_dir, name):
    ours = run_script(synapolis_cmd(state_dir, "mcp"), SCRIPTS[name])
    theirs = run_script(snapshot.sdk_only(state_dir), SCRIPTS[name])
    assert ours == theirs


def test_initialize_after_a_discovery_probe_is_served(state_dir):
    """Claude Code probes with server/discover, and when that takes over 3 s sends initialize on the same
    connection: the SDK alone refused it (its era was set by the probe); the front serves it, and the
    connection then works in the handshake era."""
    script = [request("probe", "server/discover", envelope(MODERN)), request(1, "initialize", init()),
              INITIALIZED, request(2, "tools/list"), request(3, "tools/call", BAD_SIGNAL)]
    ours = run_script(synapolis_cmd(state_dir, "mcp"), script)
    assert ours["probe"]["result"]["supportedVersions"] == [MODERN]
    assert ours[1]["result"]["protocolVersion"] == "2025-06-18"
    assert len(ours[2]["result"]["tools"]) == len(front.load_snapshot()["handshake"]["2025-06-18"]["tools/list"]["tools"])
    assert ours[3]["result"]["isError"] and " (exit " in ours[3]["result"]["content"][0]["text"]  # the SDK's tool
    theirs = run_script(snapshot.sdk_only(state_dir), script)
    assert theirs[1]["error"]["message"].startswith("connection is serving the 2026-07-28 protocol")


def test_the_snapshot_is_what_the_server_answers(tmp_path):
    stored = front.load_snapshot()
    assert stored is not None, ("synapolis/mcp/static.json is missing or stale for these sources: "
                                "run `python -m synapolis.mcp.snapshot` and commit it")
    assert snapshot.take(tmp_path / "state") == stored, "run `python -m synapolis.mcp.snapshot` and commit it"


def test_a_stale_or_broken_snapshot_is_not_used(tmp_path, monkeypatch):
    copy = tmp_path / "mcp"
    shutil.copytree(front.HERE, copy)
    monkeypatch.setattr(front, "HERE", str(copy))
    assert front.load_snapshot(front.SNAPSHOT) is not None
    tools = copy / "tools.py"
    tools.write_text(tools.read_text() + "\n# a tool changed since the snapshot\n")
    assert front.load_snapshot(front.SNAPSHOT) is None
    broken = tmp_path / "static.json"
    broken.write_text('{"fingerprint": ')
    assert front.load_snapshot(str(broken)) is None


def test_a_client_that_only_lists_leaves_at_once_and_a_pending_call_is_served(state_dir):
    lines = [request(1, "initialize", init()), INITIALIZED, request(2, "tools/list")]
    done = subprocess.run(synapolis_cmd(state_dir, "mcp"), input="".join(json.dumps(m) + "\n" for m in lines),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert [json.loads(line)["id"] for line in done.stdout.splitlines()] == [1, 2]
    # a call sent before the SDK has loaded waits for it, in order, however the input ends
    proc = subprocess.Popen(synapolis_cmd(state_dir, "mcp"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in [*lines, request(3, "tools/call", BAD_SIGNAL)]))
    proc.stdin.write(json.dumps(request(4, "tools/list"))[:20])  # half a line: the SDK's reader finishes it
    proc.stdin.flush()
    answers = {}
    while 3 not in answers:
        message = json.loads(proc.stdout.readline())
        answers[message["id"]] = message
    proc.stdin.write(json.dumps(request(4, "tools/list"))[20:] + "\n")
    proc.stdin.flush()
    message = json.loads(proc.stdout.readline())
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert message["id"] == 4 and message["result"] == answers[2]["result"]
    assert answers[3]["result"]["isError"]


def test_a_broken_config_is_one_line_and_its_exit_code(state_dir):
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "synapolis.json").write_text("{broken")
    done = subprocess.run(synapolis_cmd(state_dir, "mcp"), input="", capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("synapolis: UsageError: config ") and len(done.stderr.splitlines()) == 1


CLAUDE = harness_binary("claude")


@pytest.mark.skipif(not CLAUDE and os.environ.get("CI") != "true", reason="no Claude Code (SYNAPOLIS_TEST_CLAUDE)")
def test_claude_code_print_mode_has_the_tools_in_its_first_turn(tmp_path, state_dir):
    from test_harness_binaries import ModelStandIn, claude_project

    assert CLAUDE, "Claude Code is needed in CI"
    project, home = claude_project(tmp_path)
    config = tmp_path / "mcp.json"
    command = synapolis_cmd(state_dir, "mcp")
    config.write_text(json.dumps({"mcpServers": {"synapolis": {"command": command[0], "args": command[1:]}}}))
    model = ModelStandIn()
    try:
        env = {**clean_env(), "HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-stand-in", "ANTHROPIC_BASE_URL": model.url}
        subprocess.run([CLAUDE, "-p", "hello", "--mcp-config", str(config), "--strict-mcp-config"], cwd=project,
                       env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert model.bodies, "claude never called the model stand-in"
        first = model.bodies[0]
    finally:
        model.close()
    tools = front.load_snapshot()["modern"][MODERN]["tools/list"]["tools"]
    missing = [t["name"] for t in tools if f"mcp__synapolis__{t['name']}" not in first]
    assert not missing, f"the first request to the model lacks synapolis's {missing}"


CODEX = harness_binary("codex")


@pytest.mark.skipif(not CODEX and os.environ.get("CI") != "true", reason="no Codex (SYNAPOLIS_TEST_CODEX)")
def test_codex_exec_with_the_documented_entry_has_synapolis_in_its_first_turn(tmp_path, state_dir):
    """docs/MCP.md's Codex entry (`required = true`): Codex waits for the server before its first turn, which
    then offers synapolis's tools (Codex 0.171 defers them behind the namespace `mcp__synapolis`, described
    by the server's instructions). Without `required`, the same Codex started its turn without them."""
    from test_harness_binaries import ModelStandIn

    assert CODEX, "Codex is needed in CI"
    home, project = tmp_path / "codex-home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    command = synapolis_cmd(state_dir, "mcp")
    model = ModelStandIn()
    (home / "config.toml").write_text(
        f'openai_base_url = "{model.url}/v1"\n\n[mcp_servers.synapolis]\ncommand = {json.dumps(command[0])}\n'
        f"args = {json.dumps(command[1:])}\nrequired = true\nstartup_timeout_sec = 30\n")
    try:
        env = {**clean_env(), "CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-stand-in"}
        subprocess.run([CODEX, "exec", "--skip-git-repo-check", "hello"], cwd=project, env=env,
                       capture_output=True, timeout=180, stdin=subprocess.DEVNULL)
        assert model.bodies, "codex never called the model stand-in"
        first = model.bodies[0]
    finally:
        model.close()
    instructions = front.load_snapshot()["modern"][MODERN]["server/discover"]["instructions"]
    assert "mcp__synapolis" in first and instructions[:60] in first
