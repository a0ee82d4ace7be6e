"""GitHub Copilot CLI's hooks (contract §16): `hooks install copilot`, both payload forms Copilot documents, delivery
at agentStop (the one event whose answer Copilot's command hooks feed the model), and through the team server.

The payloads are the ones of Copilot's CLI hooks reference (docs.github.com, "GitHub Copilot CLI hooks
reference"): camelCase events send camelCase fields and no event name; PascalCase events the VS Code form.
The real Copilot CLI (`@github/copilot`, $SYNAPOLIS_TEST_COPILOT) runs without a GitHub sign-in in its offline
BYOK mode (COPILOT_OFFLINE with COPILOT_PROVIDER_BASE_URL at a local stand-in for an OpenAI-compatible API):
it runs the installed hooks, and its guard and delivery are checked against it too.
"""

from __future__ import annotations

import json
import subprocess

from conftest import clean_env, held_project, require_harness, start_server, stop, synapolis_cmd, tool_call_stand_in
from synapolis.workspace import Workspace


def hook(state_dir, payload: dict, event: str | None = None, env: dict | None = None):
    extra = dict(env or {})
    if event:
        extra["SYNAPOLIS_HOOK_EVENT"] = event  # what the installed file's `env` sets for a camelCase event
    done = subprocess.run(synapolis_cmd(state_dir, "hook", "copilot"), input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60, env=clean_env(extra))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def agents(state_dir) -> dict:
    out = subprocess.run(synapolis_cmd(state_dir, "list-agents", "--json"), capture_output=True, text=True,
                         env=clean_env(), timeout=60)
    return {a["id"]: a for a in json.loads(out.stdout)["agents"]}


def camel(kind: str, **fields) -> dict:
    return {"sessionId": "copilot-conv-1", "timestamp": 1764844800000, "cwd": "/work/project", **fields}


def pascal(name: str, **fields) -> dict:
    return {"hook_event_name": name, "session_id": "copilot-conv-2", "timestamp": "2026-12-04T10:00:00.000Z",
            "cwd": "/work/project", **fields}


def test_install_writes_version_1_with_every_event_and_uninstall_takes_only_ours(tmp_path, cli):
    project = tmp_path / "repo"
    project.mkdir()
    done = cli("hooks", "install", "copilot", "--project-dir", project, "--json")
    assert done.returncode == 0, done.stderr
    path = project / ".github" / "hooks" / "synapolis.json"
    document = json.loads(path.read_text())
    assert document["version"] == 1
    assert list(document["hooks"]) == ["sessionStart", "userPromptSubmitted", "preToolUse", "postToolUse",
                                       "agentStop", "sessionEnd"]
    for event, entries in document["hooks"].items():
        (entry,) = entries
        assert entry["type"] == "command" and entry["bash"].endswith("synapolis hook copilot")
        assert entry["env"] == {"SYNAPOLIS_HOOK_EVENT": event} and entry["timeoutSec"] == 10
    again = cli("hooks", "install", "copilot", "--project-dir", project, "--json")
    assert json.loads(again.stdout)["changed"] is False
    # a person's own entry in the same file survives uninstall
    document["hooks"]["preToolUse"].append({"type": "command", "bash": "./lint.sh"})
    path.write_text(json.dumps(document))
    doctor = json.loads(cli("doctor", "--project-dir", project, "--json").stdout)
    mine = [f for f in doctor["findings"] if f["check"] == "harness:copilot"]
    assert mine and all(f["status"] == "ok" for f in mine), mine
    removed = json.loads(cli("hooks", "uninstall", "copilot", "--project-dir", project, "--json").stdout)
    assert removed["changed"] is True and len(removed["removed"]) == 6
    assert json.loads(path.read_text())["hooks"] == {"preToolUse": [{"type": "command", "bash": "./lint.sh"}]}
    # a file with nothing but ours is removed whole
    cli("hooks", "install", "copilot", "--project-dir", project)
    document = json.loads(path.read_text())
    document["hooks"]["preToolUse"] = document["hooks"]["preToolUse"][1:]
    path.write_text(json.dumps(document))
    cli("hooks", "uninstall", "copilot", "--project-dir", project)
    assert not path.exists()


def test_doctor_fails_a_copilot_file_missing_an_event(tmp_path, cli):
    project = tmp_path / "repo"
    project.mkdir()
    cli("hooks", "install", "copilot", "--project-dir", project)
    path = project / ".github" / "hooks" / "synapolis.json"
    document = json.loads(path.read_text())
    del document["hooks"]["agentStop"]
    path.write_text(json.dumps(document))
    doctor = cli("doctor", "--project-dir", project, "--json")
    assert doctor.returncode == 1
    failed = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "harness:copilot"]
    assert failed[0]["status"] == "fail" and "agentStop" in failed[0]["message"]


def test_camel_case_payloads_register_beat_and_deliver_once_at_agent_stop(state_dir, cli):
    assert hook(state_dir, camel("sessionStart", source="new", initialPrompt="fix it"), "sessionStart") == {}
    (me,) = [a for a in agents(state_dir) if a.startswith("copilot")]
    assert agents(state_dir)[me]["harness"] == "copilot"
    cli("start", "--agent-id", "lead")
    sent = json.loads(cli("signal", "--agent-id", "lead", me, "rebase before you push", "--json").stdout)["signal"]
    # postToolUse: Copilot feeds a command hook's answer to nothing here, so nothing is delivered on it
    tool = camel("postToolUse", toolName="bash", toolArgs={"command": "ls"},
                 toolResult={"resultType": "success", "textResultForLlm": "a.py"})
    assert hook(state_dir, tool, "postToolUse") == {}
    stop_event = camel("agentStop", transcriptPath="/tmp/t.jsonl", stopReason="end_turn")
    answer = hook(state_dir, stop_event, "agentStop")
    assert answer["decision"] == "block" and "rebase before you push" in answer["reason"]
    assert sent["id"][:12] in answer["reason"]
    assert agents(state_dir)[me]["status"] == "active"  # another turn follows
    # exactly once: the next stop has nothing to show, and the agent is idle
    assert hook(state_dir, stop_event, "agentStop") == {}
    assert agents(state_dir)[me]["status"] == "idle"
    assert hook(state_dir, camel("userPromptSubmitted", prompt="go on"), "userPromptSubmitted") == {}
    assert agents(state_dir)[me]["status"] == "active"
    assert hook(state_dir, camel("preToolUse", toolName="edit", toolArgs={"path": "a.py"}), "preToolUse") == {}
    assert hook(state_dir, camel("sessionEnd", reason="complete"), "sessionEnd") == {}
    assert agents(state_dir)[me]["effective_status"] == "stopped"


def test_pascal_case_payloads_are_the_same_conversation_events(state_dir, cli):
    assert hook(state_dir, pascal("SessionStart", source="startup")) == {}
    (me,) = [a for a in agents(state_dir) if a.startswith("copilot")]
    cli("start", "--agent-id", "lead")
    cli("signal", "--agent-id", "lead", me, "the VS Code form works too")
    hook(state_dir, pascal("PostToolUse", tool_name="bash", tool_input={"command": "ls"},
                           tool_result={"result_type": "success", "text_result_for_llm": "ok"}))
    answer = hook(state_dir, pascal("Stop", transcript_path="/tmp/t.jsonl", stop_reason="end_turn"))
    assert answer["decision"] == "block" and "the VS Code form works too" in answer["reason"]
    # garbage and a missing event name: an empty answer, exit 0, a line on stderr
    done = subprocess.run(synapolis_cmd(state_dir, "hook", "copilot"), input='{"sessionId": "x"}',
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "hook_event_name" in done.stderr


def test_copilot_hooks_through_the_team_server(state_dir, cli, tmp_path):
    Workspace.open(state_dir).ensure()
    token = json.loads(cli("tokens", "create", "copilot-cloud", "--json").stdout)["token"]
    proc, url = start_server(state_dir)
    try:
        sandbox = tmp_path / "sandbox" / "state"
        env = {"SYNAPOLIS_SERVER": url, "SYNAPOLIS_TOKEN": token}
        hook(sandbox, camel("sessionStart", source="new"), "sessionStart", env)
        (me,) = [a for a in agents(state_dir) if a.startswith("copilot")]
        cli("start", "--agent-id", "lead")
        cli("signal", "--agent-id", "lead", me, "from the team's machine")
        answer = hook(sandbox, camel("agentStop", transcriptPath="/t", stopReason="end_turn"), "agentStop", env)
        assert "from the team's machine" in answer["reason"]
        assert (sandbox / "heartbeats" / f"{me}.json").is_file()
        assert not (sandbox / "sessions").exists() and not (sandbox / "claims").exists()
    finally:
        stop(proc)


def test_pre_tool_use_refuses_an_edit_of_a_held_path_in_both_payload_forms(tmp_path, state_dir, cli):
    cli("start", "--agent-id", "bob")
    cli("claim", "src/api/**", "--agent-id", "bob")
    held = str(tmp_path / "src" / "api" / "users.py")  # the project: the state directory's parent
    for args in ({"path": held, "old_str": "a", "new_str": "b"}, json.dumps({"path": held, "file_text": "x"})):
        answer = hook(state_dir, camel("preToolUse", cwd=str(tmp_path), toolName="edit", toolArgs=args), "preToolUse")
        assert answer["permissionDecision"] == "deny"
        assert "src/api/users.py is claimed by bob" in answer["permissionDecisionReason"]
    answer = hook(state_dir, pascal("PreToolUse", cwd=str(tmp_path), tool_name="Create",
                                    tool_input={"path": "src/api/new.py", "file_text": "x"}))
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "src/api/new.py is claimed by bob" in answer["hookSpecificOutput"]["permissionDecisionReason"]
    # a free path, a tool that writes no file: the tool runs
    assert hook(state_dir, camel("preToolUse", cwd=str(tmp_path), toolName="edit",
                                 toolArgs={"path": "README.md"}), "preToolUse") == {}
    assert hook(state_dir, pascal("PreToolUse", cwd=str(tmp_path), tool_name="bash",
                                  tool_input={"command": "rm -rf src/api"})) == {}


def run_copilot(copilot, project, home, state_dir, edit_path: str) -> tuple:
    """The real `copilot -p` in `project`, offline, its model a stand-in asking for an `edit` of `edit_path` (lead
    broadcasts a signal just before, which agentStop then delivers): (the finished process, the stand-in)."""
    def broadcast():
        subprocess.run(synapolis_cmd(state_dir, "signal", "--agent-id", "lead", "*", "MARKER-33 rebase now"),
                       capture_output=True, env=clean_env(), timeout=60)

    model = tool_call_stand_in("edit", {"path": edit_path, "old_str": "one", "new_str": "two"}, before=broadcast)
    try:
        done = subprocess.run([copilot, "-p", "change one to two in src/held.py"], cwd=project, capture_output=True,
                              text=True, timeout=240, stdin=subprocess.DEVNULL, env=clean_env({
                                  "HOME": str(home), "COPILOT_HOME": str(home / ".copilot"), "COPILOT_OFFLINE": "true",
                                  "COPILOT_PROVIDER_BASE_URL": model.url + "/v1", "COPILOT_PROVIDER_API_KEY": "stand-in",
                                  "COPILOT_MODEL": "m", "COPILOT_ALLOW_ALL": "true", "COPILOT_AUTO_UPDATE": "false",
                                  "SYNAPOLIS_STATE_DIR": str(state_dir)}))
    finally:
        model.close()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, model


def test_the_real_copilot_cli_runs_the_hooks_the_guard_refuses_and_a_signal_reaches_the_model(tmp_path, state_dir,
                                                                                               cli):
    copilot = require_harness("copilot")
    project = tmp_path  # the state directory's parent: the project the claims are relative to
    held = held_project(project, cli, "copilot")
    cli("start", "--agent-id", "lead")
    home = tmp_path / "home"
    home.mkdir()
    done, model = run_copilot(copilot, project, home, state_dir, str(held))
    assert held.read_text() == "one\n"  # refused: the edit never ran
    assert "src/held.py is claimed by bob" in done.stdout + "".join(model.bodies)
    (me,) = [a for a in agents(state_dir) if a.startswith("copilot")]
    # agentStop delivered lead's broadcast: the turn went on with it as its prompt, once
    with_signal = [b for b in model.bodies if "MARKER-33 rebase now" in b]
    assert with_signal and me in with_signal[0], model.bodies[-1][-2000:]
    assert json.loads(cli("signals-pending", "--agent-id", me, "--json").stdout)["pending_signals"] == []
    # the VS Code form (PascalCase events) refuses the same edit
    hooks_file = project / ".github" / "hooks" / "synapolis.json"
    command = json.loads(hooks_file.read_text())["hooks"]["preToolUse"][0]["bash"]
    hooks_file.write_text(json.dumps({"version": 1, "hooks": {"PreToolUse": [
        {"type": "command", "bash": command, "timeoutSec": 10}]}}))
    done, model = run_copilot(copilot, project, home, state_dir, str(held))
    assert held.read_text() == "one\n"
    assert "src/held.py is claimed by bob" in done.stdout + "".join(model.bodies)
