"""The guard through the team server (contract §14, §16): a sandbox's pre-tool hook asks the server, which holds the
claims, and refuses an edit of a path another live agent holds, in each harness's own shape; the server away lets
the tool run (one line on stderr) within the hook's bound.

Two state directories as in tests/test_remote.py: the team's, with a real `synapolis serve` on it (SQLite or
PostgreSQL), and a sandbox's clone of the project, which has only the server's URL and a token.
"""

from __future__ import annotations

import json
import socket
import time

from conftest import SANDBOX_OWN, succeeded as ok


def hook(team, token, harness, event, **env):
    done = team.there(token, "hook", harness, input=json.dumps(event), env=env)
    assert done.returncode == 0, done.stderr
    return (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr


def held_by_bob(team):
    """bob, on the team's machine, holds src/api/** (a pattern) live."""
    ok(team.here("start", "--agent-id", "bob"))
    ok(team.here("claim", "src/api/**", "--agent-id", "bob"))


def sandbox_file(team, rel):
    path = team.sandbox_dir.parent / rel  # the sandbox's project: its state directory's parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


def test_a_sandbox_edit_of_a_path_held_on_the_server_is_refused_in_each_harness_shape(team):
    held_by_bob(team)
    token = team.token("sandbox")
    hook(team, token, "claude-code", {"session_id": "conv-1", "hook_event_name": "SessionStart"})
    held, free = sandbox_file(team, "src/api/users.py"), sandbox_file(team, "src/cli.py")
    out, _ = hook(team, token, "claude-code", {"session_id": "conv-1", "hook_event_name": "PreToolUse",
                                               "tool_name": "Edit", "tool_input": {"file_path": held}})
    decision = out["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny"
    assert "src/api/users.py is claimed by bob" in decision["permissionDecisionReason"]
    assert "synapolis signal bob" in decision["permissionDecisionReason"]
    # a free path, and a path relative to the harness's cwd outside the project: the tool runs
    out, _ = hook(team, token, "claude-code", {"session_id": "conv-1", "hook_event_name": "PreToolUse",
                                               "tool_name": "Write", "tool_input": {"file_path": free}})
    assert out == {}
    out, _ = hook(team, token, "claude-code", {"session_id": "conv-1", "hook_event_name": "PreToolUse",
                                               "tool_name": "Write", "tool_input": {"file_path": "/etc/x/src/api/a.py"}})
    assert out == {}
    # Gemini CLI and Codex (a patch) through the same server
    out, _ = hook(team, token, "gemini-cli", {"session_id": "g-1", "hook_event_name": "BeforeTool",
                                              "tool_name": "write_file", "tool_input": {"file_path": held}})
    assert out["decision"] == "deny" and "claimed by bob" in out["reason"]
    patch = "*** Begin Patch\n*** Update File: src/api/users.py\n@@\n-a\n+b\n*** End Patch\n"
    out, _ = hook(team, token, "codex", {"session_id": "x-1", "hook_event_name": "PreToolUse", "cwd":
                                         str(team.sandbox_dir.parent), "tool_name": "apply_patch",
                                         "tool_input": {"command": patch}})
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    # Copilot CLI, both payload forms; opencode
    out, _ = hook(team, token, "copilot", {"sessionId": "cp-1", "timestamp": 1, "cwd": str(team.sandbox_dir.parent),
                                           "toolName": "edit", "toolArgs": {"path": held, "old_str": "a"}},
                  SYNAPOLIS_HOOK_EVENT="preToolUse")
    assert out["permissionDecision"] == "deny" and "claimed by bob" in out["permissionDecisionReason"]
    out, _ = hook(team, token, "opencode", {"session_id": "oc-1", "hook_event_name": "PreToolUse",
                                            "cwd": str(team.sandbox_dir.parent), "tool_name": "write",
                                            "tool_input": {"filePath": "src/api/new.py", "content": "x"}})
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_the_holder_itself_may_edit_and_the_decision_is_the_servers(team):
    token = team.token("sandbox")
    start, _ = hook(team, token, "claude-code", {"session_id": "mine", "hook_event_name": "SessionStart"})
    me = [a["id"] for a in ok(team.here("list-agents", "--json"))["agents"] if a["id"].startswith("claude_code")]
    assert len(me) == 1
    ok(team.here("claim", "src/core.py", "--agent-id", me[0]))  # held by the sandbox's own agent
    path = sandbox_file(team, "src/core.py")
    event = {"session_id": "mine", "hook_event_name": "PreToolUse", "tool_name": "Edit",
             "tool_input": {"file_path": path}}
    assert hook(team, token, "claude-code", event)[0] == {}
    # another conversation of the sandbox is another agent: refused
    other = dict(event, session_id="someone-else")
    assert hook(team, token, "claude-code", other)[0]["hookSpecificOutput"]["permissionDecision"] == "deny"
    # the person at the server releases: the edit goes through at once
    ok(team.here("release", "src/core.py", "--agent-id", me[0]))
    assert hook(team, token, "claude-code", other)[0] == {}


def test_server_away_or_refusing_lets_the_tool_run_with_one_line_in_bounded_time(team):
    held_by_bob(team)
    token = team.token("sandbox")
    path = sandbox_file(team, "src/api/users.py")
    event = {"session_id": "c", "hook_event_name": "PreToolUse", "tool_name": "Edit", "tool_input": {"file_path": path}}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    done = team.there(token, "hook", "claude-code", input=json.dumps(event), server=f"http://127.0.0.1:{port}")
    assert done.returncode == 0 and done.stdout.strip() in ("", "{}")
    assert "guard:" in done.stderr and "127.0.0.1" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert time.monotonic() - began < 10
    # a server that accepts and never answers: still the hook's bound (4 s), the tool runs
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        began = time.monotonic()
        done = team.there(token, "hook", "claude-code", input=json.dumps(event),
                          server=f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert done.returncode == 0 and done.stdout.strip() in ("", "{}")
        assert time.monotonic() - began < 4 + 3
    refused = team.there(token + "x", "hook", "claude-code", input=json.dumps(event))
    assert refused.returncode == 0 and refused.stdout.strip() in ("", "{}")
    assert "SYNAPOLIS_TOKEN" in refused.stderr and token not in refused.stderr
    # a read-only token may not act as the conversation: the tool runs, and the line says why
    reader = team.token("reader", "--read-only")
    done = team.there(reader, "hook", "claude-code", input=json.dumps(event))
    assert done.returncode == 0 and done.stdout.strip() in ("", "{}") and "guard:" in done.stderr


def test_guard_mode_off_in_the_sandbox_asks_nobody_and_warn_on_the_server_warns(team):
    held_by_bob(team)
    token = team.token("sandbox")
    path = sandbox_file(team, "src/api/users.py")
    event = {"session_id": "w", "hook_event_name": "PreToolUse", "tool_name": "Edit", "tool_input": {"file_path": path}}
    config = json.loads((team.server_dir / "synapolis.json").read_text())
    (team.server_dir / "synapolis.json").write_text(json.dumps(dict(config, guard={"mode": "warn"})))
    out, _ = hook(team, token, "claude-code", event)
    assert "permissionDecision" not in out["hookSpecificOutput"]
    assert "claimed by bob" in out["hookSpecificOutput"]["additionalContext"]
    team.sandbox_dir.mkdir(parents=True, exist_ok=True)
    (team.sandbox_dir / "synapolis.json").write_text(json.dumps({"guard": {"mode": "off"}}))
    away = team.there(token, "hook", "claude-code", input=json.dumps(event), server="http://127.0.0.1:9")
    assert away.stdout.strip() in ("", "{}") and away.stderr == ""  # off: no call at all, nothing to say


def test_a_commit_refused_in_a_sandbox_is_on_the_servers_event_record(team, ws):
    # git's pre-commit hook runs `guard --staged --commit`: through the server the refusal used to be recorded
    # nowhere (the sandbox has no store) and told to nobody, so the team's page never showed it
    from synapolis import guard_events

    held_by_bob(team)
    token = team.token("sandbox")
    me = ok(team.there(token, "start", "--json"))["agent_id"]
    done = team.there(token, "guard", sandbox_file(team, "src/api/users.py"), "--commit")
    assert done.returncode == 3 and "held by bob" in done.stdout, done.stderr
    events = guard_events.recent(ws, 10)
    assert [(e["kind"], e["agent_id"], e["paths"], e["holders"], e["via"]) for e in events] == \
        [("commit refused", me, ["src/api/users.py"], ["bob"], "git commit")]
    # a read-only token asks as nobody and is refused alike, but writes nothing, not even an event
    reader = team.token("reader", "--read-only")
    assert team.there(reader, "guard", "src/api/users.py", "--commit").returncode == 3
    # without --commit (a person asking) nothing is recorded either
    assert team.there(token, "guard", "src/api/users.py").returncode == 3
    assert len(guard_events.recent(ws, 10)) == 1
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_a_sandbox_on_a_case_insensitive_file_system_is_refused_a_path_held_with_capitals(team, monkeypatch):
    # the sandbox made each path project-relative with its own case folding (lower case on macOS or Windows),
    # and the server on a file system that heeds case compared `src/api.py` with bob's `src/Api.py`: no overlap,
    # the edit went through. Only case-kept paths travel; the server folds as its own file system does
    from synapolis import project
    from synapolis.harness import hooks
    from synapolis.workspace import Workspace

    ok(team.here("start", "--agent-id", "bob"))
    ok(team.here("claim", "src/Api.py", "--agent-id", "bob"))
    token = team.token("sandbox")
    env = {"SYNAPOLIS_SERVER": team.url, "SYNAPOLIS_TOKEN": token, "SYNAPOLIS_STATE_DIR": str(team.sandbox_dir)}
    sandbox = Workspace.open(team.sandbox_dir, env=env)
    # this process plays a sandbox whose file system ignores case (project.ignores_case's answer, cached)
    monkeypatch.setitem(project._ROOTS, sandbox.files.root, (str(team.sandbox_dir.parent), True))
    held = sandbox_file(team, "src/Api.py")
    event = {"session_id": "conv-ci", "hook_event_name": "PreToolUse", "tool_name": "Edit",
             "tool_input": {"file_path": held}}
    result = hooks.handle("claude-code", json.dumps(event), state_dir=str(team.sandbox_dir), env=env)
    assert result["output"]["hookSpecificOutput"]["permissionDecision"] == "deny", result["problems"]
    assert "claimed by bob" in result["output"]["hookSpecificOutput"]["permissionDecisionReason"]


def test_a_server_from_before_guard_commit_still_guards_a_newer_sandbox(team):
    # A server older than `guard --commit` through the server refuses a `commit` it does not know ("guard takes
    # no commit", exit 2): the sandbox sends it only with --commit, and then asks again without it, so the
    # refusal stands (unrecorded there) instead of the guard failing and git letting the commit through.
    # The older server is the real one behind a proxy that answers `commit` as the older one did.
    import urllib.request
    from http.server import BaseHTTPRequestHandler

    from conftest import LocalServer, respond

    seen = []

    class OlderServer(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            call = json.loads(body or b"{}")
            seen.append(sorted((call.get("kwargs") or {}).keys()))
            if "commit" in (call.get("kwargs") or {}):
                error = {"type": "UsageError", "message": "guard takes no commit", "exit_code": 2}
                return respond(self, 400, "application/json", json.dumps({"error": error}).encode())
            ask = urllib.request.Request(team.url + self.path, data=body, method="POST",
                                         headers={"authorization": self.headers["authorization"],
                                                  "content-type": "application/json"})
            try:
                with urllib.request.urlopen(ask, timeout=30) as answer:
                    respond(self, answer.status, "application/json", answer.read())
            except urllib.error.HTTPError as refused:
                respond(self, refused.code, "application/json", refused.read())

        def log_message(self, *args):
            pass

    held_by_bob(team)
    token = team.token("sandbox")
    older = LocalServer(OlderServer)
    try:
        ok(team.there(token, "start", "--json", server=older.url))
        plain = team.there(token, "guard", "src/api/users.py", server=older.url)
        assert plain.returncode == 3 and "held by bob" in plain.stdout, plain.stderr
        committed = team.there(token, "guard", "src/api/users.py", "--commit", server=older.url)
        assert committed.returncode == 3 and "held by bob" in committed.stdout, committed.stderr
    finally:
        older.close()
    assert ["commit"] not in seen[:2] and seen[-2:] == [["commit"], []], seen
