"""The remote mode (contract §16): a sandbox that has only the server's URL and a token is a full member.

Two state directories: the team's (a real `synapolis serve` on it, SQLite or PostgreSQL) and the sandbox's,
which holds no store, only what its own CLI and hooks write. Everything runs as real processes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from conftest import SANDBOX_OWN, clean_env, refused, succeeded as ok, synapolis_cmd, validate_heartbeat_cmd
from synapolis.workspace import Workspace


def test_sandbox_agent_registers_beats_and_trades_signals_exactly_once(team):
    token = team.token("sandbox")
    started = ok(team.there(token, "start", "--json"))
    me = started["agent_id"]
    # identity.json on the sandbox, as a local start writes it: the next calls know who they are
    ident = json.loads((team.sandbox_dir / "identity.json").read_text())
    assert (ident["agent_id"], ident["session_id"]) == (me, started["session_id"])

    beat = ok(team.there(token, "beat", "--task", "port the parser", "--json"))
    assert beat["heartbeat"]["agent_id"] == me and beat["heartbeat"]["task"] == "port the parser"
    local = json.loads((team.sandbox_dir / "heartbeats" / f"{me}.json").read_text())
    assert local["seq"] == beat["heartbeat"]["seq"] and local["task"] == "port the parser"
    assert subprocess.run(validate_heartbeat_cmd(team.sandbox_dir), capture_output=True,
                          env=clean_env()).returncode == 0
    # the team sees it: the server's registry and the server's heartbeat file
    agents = ok(team.here("list-agents", "--json"))["agents"]
    assert me in [a["id"] for a in agents]
    server_beat = json.loads((team.server_dir / "heartbeats" / f"{me}.json").read_text())
    assert server_beat["task"] == "port the parser"

    # the server's side signals the sandbox: delivered once, then never again
    ok(team.here("start", "--agent-id", "boss", "--json"))
    sent = ok(team.here("signal", "--agent-id", "boss", me, "rebase on main", "--json"))["signal"]
    first = ok(team.there(token, "signals-pending", "--json"))
    assert [s["id"] for s in first["pending_signals"]] == [sent["id"]]
    assert first["pending_signals"][0]["content"] == "rebase on main"
    again = ok(team.there(token, "signals-pending", "--json"))
    assert again["pending_signals"] == []

    # the sandbox signals back: the server's agent reads it once
    back = ok(team.there(token, "signal", "boss", "done rebasing", "--json"))["signal"]
    assert back["sender"] == me
    read = ok(team.here("signals-pending", "--agent-id", "boss", "--json"))["pending_signals"]
    assert [s["content"] for s in read] == ["done rebasing"]

    # the same text as beside the store
    text = ok(team.there(token, "beat", "--status", "idle"))
    assert text.startswith(f"beat {me} seq=") and "status=idle" in text
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_sandbox_claude_code_hook_delivers_a_signal_sent_on_the_server(team):
    token = team.token("sandbox-hooks")
    event = {"session_id": "conv-remote-1", "cwd": str(team.sandbox_dir.parent)}
    start = team.there(token, "hook", "claude-code", input=json.dumps({**event, "hook_event_name": "SessionStart"}))
    assert start.returncode == 0, start.stderr
    context = json.loads(start.stdout)["hookSpecificOutput"]["additionalContext"]
    agent = context.split("you are agent ")[1].split()[0]
    # registered on the server, beating locally too
    assert agent in [a["id"] for a in ok(team.here("list-agents", "--json"))["agents"]]
    assert (team.sandbox_dir / "heartbeats" / f"{agent}.json").is_file()

    ok(team.here("start", "--agent-id", "boss", "--json"))
    ok(team.here("signal", "--agent-id", "boss", agent, "stop touching utils.py"))
    post = {**event, "hook_event_name": "PostToolUse", "tool_name": "Bash"}
    delivered = team.there(token, "hook", "claude-code", input=json.dumps(post))
    assert delivered.returncode == 0, delivered.stderr
    assert "stop touching utils.py" in json.loads(delivered.stdout)["hookSpecificOutput"]["additionalContext"]
    quiet = team.there(token, "hook", "claude-code", input=json.dumps(post))
    assert quiet.returncode == 0 and json.loads(quiet.stdout) == {}, quiet.stderr
    stopped = team.there(token, "hook", "claude-code", input=json.dumps({**event, "hook_event_name": "Stop"}))
    assert stopped.returncode == 0
    statuses = {a["id"]: a["status"] for a in ok(team.here("list-agents", "--json"))["agents"]}
    assert statuses[agent] == "idle"
    assert json.loads((team.sandbox_dir / "heartbeats" / f"{agent}.json").read_text())["status"] == "idle"
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_away_is_exit_8_naming_the_host_and_a_hook_still_answers(team):
    away = f"http://127.0.0.1:{_closed_port()}"
    began = time.monotonic()
    beat = team.there("any-token", "beat", "--agent-id", "solo", server=away)
    line = refused(beat, 8, "BusyError")
    assert "127.0.0.1" in line and time.monotonic() - began < 15
    # the local heartbeat was written first: a local reader sees the agent
    assert (team.sandbox_dir / "heartbeats" / "solo.json").is_file()
    hook = team.there("any-token", "hook", "claude-code", server=away,
                      input=json.dumps({"session_id": "c", "hook_event_name": "PostToolUse"}))
    assert hook.returncode == 0 and json.loads(hook.stdout) == {}
    assert "127.0.0.1" in hook.stderr
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_a_server_that_never_answers_is_bounded(team):
    # a socket that accepts connections and never answers: busy_timeout_ms plus the connect timeout
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        team.sandbox_dir.mkdir(parents=True)
        (team.sandbox_dir / "synapolis.json").write_text(json.dumps({"busy_timeout_ms": 200}))
        began = time.monotonic()
        hook = team.there("t", "hook", "claude-code", server=url, env={"SYNAPOLIS_HOOK_TIMEOUT_S": "1.5"},
                          input=json.dumps({"session_id": "c", "hook_event_name": "UserPromptSubmit"}))
        assert hook.returncode == 0 and json.loads(hook.stdout) == {}
        assert time.monotonic() - began < 5
        began = time.monotonic()
        refused(team.there("t", "beat", "--agent-id", "solo", server=url), 8, "BusyError")
        assert time.monotonic() - began < 0.2 + 10 + 3


def test_a_refused_token_is_exit_7_naming_the_variable_never_the_token(team):
    secret = "syn_not-a-token-of-this-server-0123456789"
    beat = team.there(secret, "beat", "--agent-id", "solo")
    line = refused(beat, 7, "ForbiddenError")
    assert "SYNAPOLIS_TOKEN" in line and secret not in beat.stdout + beat.stderr
    as_json = team.there(secret, "signals-pending", "--agent-id", "solo", "--json")
    assert as_json.returncode == 7 and json.loads(as_json.stdout)["error"]["type"] == "ForbiddenError"
    assert secret not in as_json.stdout + as_json.stderr
    hook = team.there(secret, "hook", "claude-code",
                      input=json.dumps({"session_id": "c", "hook_event_name": "PostToolUse"}))
    assert hook.returncode == 0 and json.loads(hook.stdout) == {} and secret not in hook.stderr
    assert "SYNAPOLIS_TOKEN" in hook.stderr
    # the config names the variable: that name is the one told
    team.sandbox_dir.mkdir(parents=True, exist_ok=True)
    (team.sandbox_dir / "synapolis.json").write_text(json.dumps({"server": team.url, "token_env": "TEAM_TOKEN"}))
    env = clean_env({"TEAM_TOKEN": secret})
    by_config = subprocess.run(synapolis_cmd(team.sandbox_dir, "beat", "--agent-id", "solo"), capture_output=True,
                               text=True, env=env, timeout=60)
    assert "TEAM_TOKEN" in refused(by_config, 7, "ForbiddenError")
    assert secret not in by_config.stdout + by_config.stderr
    # nothing registered on the server
    assert "solo" not in [a["id"] for a in ok(team.here("list-agents", "--json"))["agents"]]


def test_the_config_keys_instead_of_the_environment(team):
    token = team.token("by-config")
    team.sandbox_dir.mkdir(parents=True)
    (team.sandbox_dir / "synapolis.json").write_text(json.dumps({"server": team.url, "token_env": "TEAM_TOKEN"}))
    run = subprocess.run(synapolis_cmd(team.sandbox_dir, "start", "--agent-id", "conf", "--json"),
                         capture_output=True, text=True, env=clean_env({"TEAM_TOKEN": token}), timeout=60)
    assert ok(run)["agent_id"] == "conf"
    assert "conf" in [a["id"] for a in ok(team.here("list-agents", "--json"))["agents"]]
    assert team.sandbox_holds() <= SANDBOX_OWN | {"synapolis.json"}


def test_a_pinned_token_is_its_agent_and_a_read_only_token_only_reads(team):
    pinned = team.token("pinned", "--agent", "builder")
    other = team.there(pinned, "start", "--agent-id", "someone-else", "--json")
    assert other.returncode == 7 and json.loads(other.stdout)["error"]["type"] == "ForbiddenError"
    assert ok(team.there(pinned, "start", "--json"))["agent_id"] == "builder"
    refused(team.there(pinned, "beat", "--agent-id", "intruder"), 7, "ForbiddenError")
    # its harness's hooks act as that same agent, from the registration `start` made on the sandbox
    hooked = team.there(pinned, "hook", "claude-code",
                        input=json.dumps({"session_id": "pinned-conv", "hook_event_name": "SessionStart"}))
    assert hooked.returncode == 0 and "you are agent builder " in hooked.stdout, hooked.stderr
    assert [a["id"] for a in ok(team.here("list-agents", "--json"))["agents"]].count("builder") == 1
    reader = team.token("reader", "--read-only")
    refused(team.there(reader, "beat", "--agent-id", "builder"), 7, "ForbiddenError")
    refused(team.there(reader, "signal", "--agent-id", "builder", "*", "hi"), 7, "ForbiddenError")
    assert "builder" in [a["id"] for a in ok(team.there(reader, "list-agents", "--json"))["agents"]]


def test_verbs_that_work_beside_the_store_are_refused_and_create_nothing(team):
    token = team.token("sandbox")
    for args in (["monitor"], ["tokens", "create", "x"], ["init"], ["escalate"]):
        refused(team.there(token, *args), 2, "UsageError")
    assert not any(name in team.sandbox_holds() for name in ("sessions", "claims", "synapolis.json"))


def test_server_wins_over_a_store_in_the_config(team, tmp_path):
    token = team.token("sandbox")
    team.sandbox_dir.mkdir(parents=True)
    (team.sandbox_dir / "synapolis.json").write_text(json.dumps({"store": "postgresql://nowhere.invalid/db"}))
    assert ok(team.there(token, "start", "--agent-id", "winner", "--json"))["agent_id"] == "winner"
    assert Workspace.open(team.sandbox_dir).config.store.startswith("postgresql://")  # untouched


def test_doctor_checks_the_server_and_the_token_never_printing_it(team, tmp_path):
    token = team.token("sandbox-doctor")
    project = tmp_path / "project"
    project.mkdir()
    good = team.there(token, "doctor", "--project-dir", project, "--json")
    report = json.loads(good.stdout)
    by_check = {f["check"]: f for f in report["findings"]}
    assert by_check["server"]["status"] == "ok" and by_check["server token"]["status"] == "ok"
    assert by_check["server token"]["token"] == "sandbox-doctor" and "store" not in by_check
    assert token not in good.stdout + good.stderr
    bad = team.there(token + "x", "doctor", "--project-dir", project, "--json")
    assert bad.returncode == 1
    failed = {f["check"]: f for f in json.loads(bad.stdout)["findings"]}["server token"]
    assert failed["status"] == "fail" and "SYNAPOLIS_TOKEN" in failed["message"]
    assert token not in bad.stdout + bad.stderr
    away = team.there(token, "doctor", "--project-dir", project, "--json", server=f"http://127.0.0.1:{_closed_port()}")
    assert away.returncode == 1
    assert {f["check"]: f for f in json.loads(away.stdout)["findings"]}["server"]["status"] == "fail"
    reader = team.there(team.token("doctor-reader", "--read-only"), "doctor", "--project-dir", project, "--json")
    assert {f["check"]: f for f in json.loads(reader.stdout)["findings"]}["server token"]["read_only"] is True
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_claims_notes_whiteboard_and_tired_through_the_server(team):
    token = team.token("sandbox")
    me = ok(team.there(token, "start", "--json"))["agent_id"]
    held = ok(team.there(token, "claim", "src/parser.py", "--json"))["claim"]
    assert held["claimed_by"] == me
    # the team's side sees the claim and its fencing token
    check = team.here("claim-check", "src/parser.py", "--token", str(held["token"]))
    assert check.returncode == 0, check.stderr
    stale = team.there(token, "claim-check", "src/parser.py", "--token", str(held["token"] + 1))
    assert stale.returncode != 0 and "Traceback" not in stale.stderr
    assert ok(team.there(token, "release", "src/parser.py", "--json"))["event"] == "released"
    ok(team.there(token, "note", "parser ported"))
    notes = ok(team.here("read-notes", "--json"))["notes"]
    assert notes[-1]["text"] == "parser ported"
    ok(team.there(token, "whiteboard-write", "plan", "ship friday"))
    assert ok(team.here("whiteboard-read", "plan", "--json"))["entry"]["value"] == "ship friday"
    tired = ok(team.there(token, "tired", "--json"))
    assert tired["agent_id"] == me and tired["outcome"] in ("standby", "consolidated")
    # a URL that names something else than a synapolis serve: a usage error, not "busy"
    refused(team.there(token, "beat", server=team.url + "/mcp"), 2, "UsageError")
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()
