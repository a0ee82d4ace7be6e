"""opencode (contract §16): `hooks install opencode` writes a plugin file, and that very file, loaded by a real
JavaScript runtime (Node here; opencode runs plugins on Bun, with the same ESM and node:child_process), runs
`synapolis hook opencode` on opencode's events: it registers the session's agent, beats, delivers a signal into
the tool output the model reads next, exactly once, and goes idle and stopped with the session.

The plugin is called with the shapes opencode's plugin reference gives: `event({event: {type, properties}})`
for session.created / session.idle / session.deleted, `tool.execute.before(input, output)` and
`tool.execute.after(input, output)` with `input.sessionID`, `input.tool` and `output.output`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import ModelStandIn, clean_env, require_harness, synapolis_cmd

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None and not os.environ.get("CI"), reason="needs node")

DRIVER = """
const plugin = (await import(process.argv[2])).SynapolisPlugin;
const steps = JSON.parse(process.argv[3]);
const hooks = await plugin({ directory: process.argv[4] });
const outputs = [];
for (const step of steps) {
  if (step.event) await hooks.event({ event: step.event });
  else {
    const output = { title: "", output: step.output, metadata: {} };
    await hooks[step.hook]({ tool: step.tool, sessionID: step.sessionID, callID: "c1" }, output);
    outputs.push(output.output);
  }
}
console.log(JSON.stringify(outputs));
"""


def drive(tmp_path, project, state_dir, steps) -> list:
    plugin = project / ".opencode" / "plugin" / "synapolis.js"
    as_module = tmp_path / "synapolis-plugin.mjs"  # Node takes a .js outside a "type": "module" package as CommonJS
    as_module.write_text(plugin.read_text())
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER)
    done = subprocess.run([NODE, str(driver), str(as_module), json.dumps(steps), str(project)], capture_output=True,
                          text=True, timeout=120, env=clean_env({"SYNAPOLIS_STATE_DIR": str(state_dir)}))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def agents(cli) -> dict:
    return {a["id"]: a for a in json.loads(cli("list-agents", "--json").stdout)["agents"]}


def test_install_uninstall_and_doctor(tmp_path, cli):
    project = tmp_path / "app"
    project.mkdir()
    made = json.loads(cli("hooks", "install", "opencode", "--project-dir", project, "--json").stdout)
    plugin = project / ".opencode" / "plugin" / "synapolis.js"
    assert made["changed"] and plugin.is_file() and "synapolis" in plugin.read_text()
    assert json.loads(cli("hooks", "install", "opencode", "--project-dir", project, "--json").stdout)["changed"] is False
    doctor = json.loads(cli("doctor", "--project-dir", project, "--json").stdout)
    mine = [f for f in doctor["findings"] if f["check"] == "harness:opencode"]
    assert len(mine) == 2 and all(f["status"] == "ok" for f in mine), mine
    assert json.loads(cli("hooks", "uninstall", "opencode", "--project-dir", project, "--json").stdout)["changed"]
    assert not plugin.exists()
    # a plugin of someone else's at that name is never overwritten
    plugin.write_text("export const Other = async () => ({});\n")
    refused = cli("hooks", "install", "opencode", "--project-dir", project)
    assert refused.returncode == 2 and plugin.read_text().startswith("export const Other")
    assert cli("hooks", "uninstall", "opencode", "--project-dir", project).returncode == 0 and plugin.exists()


def test_the_plugin_registers_delivers_into_the_tool_output_once_and_goes_idle(tmp_path, cli, state_dir):
    project = tmp_path / "app"
    project.mkdir()
    cli("hooks", "install", "opencode", "--project-dir", project)
    session = "ses_opencode_1"
    drive(tmp_path, project, state_dir, [{"event": {"type": "session.created",
                                                     "properties": {"info": {"id": session}}}}])
    (me,) = [a for a in agents(cli) if a.startswith("opencode")]
    assert agents(cli)[me]["harness"] == "opencode" and agents(cli)[me]["status"] == "active"
    cli("start", "--agent-id", "lead")
    cli("signal", "--agent-id", "lead", me, "use the new config loader")
    outputs = drive(tmp_path, project, state_dir, [
        {"hook": "tool.execute.before", "tool": "bash", "sessionID": session, "output": None},
        {"hook": "tool.execute.after", "tool": "bash", "sessionID": session, "output": "file listing"},
        {"hook": "tool.execute.after", "tool": "read", "sessionID": session, "output": "file text"},
        {"event": {"type": "session.idle", "properties": {"sessionID": session}}},
    ])
    assert outputs[1].startswith("file listing\n\n") and "use the new config loader" in outputs[1]
    assert outputs[2] == "file text"  # exactly once
    assert agents(cli)[me]["status"] == "idle"
    drive(tmp_path, project, state_dir, [{"event": {"type": "session.deleted",
                                                     "properties": {"info": {"id": session}}}}])
    assert agents(cli)[me]["effective_status"] == "stopped"


def openai_stand_in(state_dir) -> ModelStandIn:
    """A local stand-in for an OpenAI-compatible chat API, streaming: the first turn with tools asks for one
    `bash` call (and, just before, has `lead` broadcast a signal, so it arrives while the tool runs); the
    turn after the tool's result answers "done"; a turn without tools (opencode's title) answers a title."""

    def chunk(delta, finish=None):
        return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

    def respond(raw: bytes):
        request = json.loads(raw)
        if not request.get("tools"):
            out = chunk({"role": "assistant", "content": "a title"}) + chunk({}, "stop")
        elif not any(m.get("role") == "tool" for m in request.get("messages", [])):
            subprocess.run(synapolis_cmd(state_dir, "signal", "--agent-id", "lead", "*", "MARKER-31 rebase now"),
                           capture_output=True, env=clean_env(), timeout=60)
            call = {"index": 0, "id": "call_1", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": "echo hi", "description": "say hi"})}}
            out = chunk({"role": "assistant", "tool_calls": [call]}) + chunk({}, "tool_calls")
        else:
            out = chunk({"role": "assistant", "content": "done"}) + chunk({}, "stop")
        return 200, "text/event-stream", (out + "data: [DONE]\n\n").encode()

    return ModelStandIn(respond)


def test_the_real_opencode_runs_the_plugin_and_a_signal_reaches_the_model(tmp_path, cli, state_dir):
    opencode = require_harness("opencode")
    project = tmp_path / "app"
    project.mkdir()
    # opencode finds the project (and its opencode.json) by its git repository
    subprocess.run(["git", "init", "-q", str(project)], check=True, capture_output=True)
    cli("hooks", "install", "opencode", "--project-dir", project)
    cli("start", "--agent-id", "lead")
    model = openai_stand_in(state_dir)
    try:
        (project / "opencode.json").write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json", "model": "standin/m",
            "provider": {"standin": {"npm": "@ai-sdk/openai-compatible", "name": "standin",
                                     "options": {"baseURL": model.url + "/v1", "apiKey": "stand-in"},
                                     "models": {"m": {"name": "m"}}}}}))
        home = tmp_path / "home"
        home.mkdir()
        done = subprocess.run([opencode, "run", "say hi"], cwd=project, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL,
                              # PWD too: opencode takes its directory from it, not from the process's cwd
                              env=clean_env({"HOME": str(home), "PWD": str(project),
                                             "SYNAPOLIS_STATE_DIR": str(state_dir)}))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    finally:
        model.close()
    (me,) = [a for a in agents(cli) if a.startswith("opencode")]
    # the bash tool's result the model was sent next carries the signal, once, and nothing sent before it
    with_signal = [b for b in model.bodies if "MARKER-31 rebase now" in b]
    assert len(with_signal) == 1 and me in with_signal[0], model.bodies
    assert agents(cli)[me]["status"] == "idle"  # session.idle after the run
    pending = json.loads(cli("signals-pending", "--agent-id", me, "--json").stdout)["pending_signals"]
    assert pending == []  # delivered by the hook, not left waiting
