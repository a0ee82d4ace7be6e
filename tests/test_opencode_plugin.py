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
import sys

import pytest

from conftest import clean_env, held_project, require_harness, synapolis_cmd, tool_call_stand_in

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
    const output = step.hook === "tool.execute.before" ? { args: step.args ?? {} }
      : { title: "", output: step.output, metadata: {} };
    try {
      await hooks[step.hook]({ tool: step.tool, sessionID: step.sessionID, callID: step.callID ?? "c1" }, output);
      outputs.push(output.output ?? null);
    } catch (error) {
      outputs.push({ thrown: String(error.message) });  // how opencode is told to refuse the tool call
    }
  }
}
console.log(JSON.stringify(outputs));
"""


def drive(tmp_path, project, state_dir, steps, env=None) -> list:
    plugin = project / ".opencode" / "plugin" / "synapolis.js"
    as_module = tmp_path / "synapolis-plugin.mjs"  # Node takes a .js outside a "type": "module" package as CommonJS
    as_module.write_text(plugin.read_text())
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER)
    done = subprocess.run([NODE, str(driver), str(as_module), json.dumps(steps), str(project)], capture_output=True,
                          text=True, timeout=120, env=clean_env({"SYNAPOLIS_STATE_DIR": str(state_dir), **(env or {})}))
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


def signal_from_lead(state_dir, text):
    """`before` for the stand-in: lead broadcasts `text`, so it arrives while the tool runs."""
    return lambda: subprocess.run(synapolis_cmd(state_dir, "signal", "--agent-id", "lead", "*", text),
                                  capture_output=True, env=clean_env(), timeout=60)


def run_opencode(opencode, tmp_path, project, model, state_dir, prompt):
    """The real `opencode run PROMPT` in `project`, its model the stand-in (the provider in opencode.json)."""
    (project / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json", "model": "standin/m",
        "provider": {"standin": {"npm": "@ai-sdk/openai-compatible", "name": "standin",
                                 "options": {"baseURL": model.url + "/v1", "apiKey": "stand-in"},
                                 "models": {"m": {"name": "m"}}}}}))
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    done = subprocess.run([opencode, "run", prompt], cwd=project, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL,
                          # PWD too: opencode takes its directory from it, not from the process's cwd
                          env=clean_env({"HOME": str(home), "PWD": str(project), "SYNAPOLIS_STATE_DIR": str(state_dir)}))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_the_real_opencode_runs_the_plugin_and_a_signal_reaches_the_model(tmp_path, cli, state_dir):
    opencode = require_harness("opencode")
    project = tmp_path / "app"
    project.mkdir()
    # opencode finds the project (and its opencode.json) by its git repository
    subprocess.run(["git", "init", "-q", str(project)], check=True, capture_output=True)
    cli("hooks", "install", "opencode", "--project-dir", project)
    cli("start", "--agent-id", "lead")
    model = tool_call_stand_in("bash", {"command": "echo hi", "description": "say hi"},
                               before=signal_from_lead(state_dir, "MARKER-31 rebase now"))
    try:
        run_opencode(opencode, tmp_path, project, model, state_dir, "say hi")
    finally:
        model.close()
    (me,) = [a for a in agents(cli) if a.startswith("opencode")]
    # the bash tool's result the model was sent next carries the signal, once, and nothing sent before it
    with_signal = [b for b in model.bodies if "MARKER-31 rebase now" in b]
    assert len(with_signal) == 1 and me in with_signal[0], model.bodies
    assert agents(cli)[me]["status"] == "idle"  # session.idle after the run
    pending = json.loads(cli("signals-pending", "--agent-id", me, "--json").stdout)["pending_signals"]
    assert pending == []  # delivered by the hook, not left waiting


def test_the_plugin_refuses_an_edit_of_a_held_path_by_throwing_and_warns_into_the_result(tmp_path, cli, state_dir):
    project = tmp_path  # the project holds the state directory (contract §14: its root is state/'s parent)
    (project / "src").mkdir(parents=True)
    cli("init")
    cli("hooks", "install", "opencode", "--project-dir", project)
    cli("start", "--agent-id", "bob")
    cli("claim", "src/held.py", "--agent-id", "bob")
    session = "ses_guard"
    outputs = drive(tmp_path, project, state_dir, [
        {"event": {"type": "session.created", "properties": {"info": {"id": session}}}},
        {"hook": "tool.execute.before", "tool": "edit", "sessionID": session,
         "args": {"filePath": str(project / "src" / "held.py"), "oldString": "a", "newString": "b"}},
        {"hook": "tool.execute.before", "tool": "apply_patch", "sessionID": session,
         "args": {"patchText": "*** Begin Patch\n*** Add File: src/held.py\n+x\n*** End Patch"}},
        {"hook": "tool.execute.before", "tool": "write", "sessionID": session,
         "args": {"filePath": "src/free.py", "content": "x"}},
        {"hook": "tool.execute.before", "tool": "bash", "sessionID": session, "args": {"command": "ls"}},
    ])
    assert "src/held.py is claimed by bob" in outputs[0]["thrown"] and "synapolis signal bob" in outputs[0]["thrown"]
    assert "claimed by bob" in outputs[1]["thrown"]
    assert outputs[2:] == [None, None]  # a free path, a tool that writes no file: it runs
    # guard.mode warn: the tool runs, and the reason is added to that very tool call's result
    config = json.loads((state_dir / "synapolis.json").read_text())
    (state_dir / "synapolis.json").write_text(json.dumps(dict(config, guard={"mode": "warn"})))
    outputs = drive(tmp_path, project, state_dir, [
        {"hook": "tool.execute.before", "tool": "write", "sessionID": session, "callID": "w1",
         "args": {"filePath": "src/held.py", "content": "x"}},
        {"hook": "tool.execute.after", "tool": "write", "sessionID": session, "callID": "w1", "output": "Wrote file"},
    ])
    assert outputs[0] is None and outputs[1].startswith("Wrote file\n\n") and "claimed by bob" in outputs[1]


def test_a_plugin_committed_in_one_clone_runs_from_another_clone_elsewhere(tmp_path, cli, state_dir):
    """The installing machine's path is no teammate's: the plugin runs $SYNAPOLIS_BIN, else `synapolis` on PATH."""
    installed_in = tmp_path / "alice" / "app"
    installed_in.mkdir(parents=True)
    cli("hooks", "install", "opencode", "--project-dir", installed_in)
    text = (installed_in / ".opencode" / "plugin" / "synapolis.js").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("const INSTALLED = "))
    # the clone on a teammate's machine: the same file, where the installer's path does not exist
    clone = tmp_path / "bob" / "work" / "app"
    (clone / ".opencode" / "plugin").mkdir(parents=True)
    (clone / ".opencode" / "plugin" / "synapolis.js").write_text(
        text.replace(line, 'const INSTALLED = ["/nonexistent/alice/venv/bin/synapolis"];'))
    bindir = tmp_path / "bob" / "bin"
    bindir.mkdir()
    real = os.path.join(os.path.dirname(sys.executable), "synapolis")
    (bindir / "synapolis").symlink_to(real)
    created = [{"event": {"type": "session.created", "properties": {"info": {"id": "ses_on_path"}}}}]
    drive(tmp_path, clone, state_dir, created, env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    assert [a for a in agents(cli) if a.startswith("opencode")], "synapolis on PATH ran"
    # $SYNAPOLIS_BIN wins over PATH (a synapolis in a virtualenv nobody put on PATH)
    before = set(agents(cli))
    drive(tmp_path, clone, state_dir, [{"event": {"type": "session.created", "properties": {"info": {"id": "ses_bin"}}}}],
          env={"SYNAPOLIS_BIN": real, "PATH": "/usr/bin:/bin"})
    assert len(set(agents(cli)) - before) == 1
    # none at all: the plugin does nothing, and opencode's tool results are left as they were
    before = set(agents(cli))
    outputs = drive(tmp_path, clone, state_dir, [
        {"event": {"type": "session.created", "properties": {"info": {"id": "ses_none"}}}},
        {"hook": "tool.execute.after", "tool": "read", "sessionID": "ses_none", "output": "file text"}],
        env={"PATH": "/usr/bin:/bin"})
    assert outputs == ["file text"] and set(agents(cli)) == before


def test_the_real_opencode_is_refused_an_edit_of_a_held_path(tmp_path, cli, state_dir):
    opencode = require_harness("opencode")
    project = tmp_path  # the state directory's parent: the project the claims are relative to
    held = held_project(project, cli, "opencode")
    model = tool_call_stand_in("edit", {"filePath": str(held), "oldString": "one", "newString": "two"})
    try:
        run_opencode(opencode, tmp_path, project, model, state_dir, "change one to two in src/held.py")
    finally:
        model.close()
    assert held.read_text() == "one\n"  # the edit never ran
    # the model was told why, in the tool's result: the holder and the command to ask them
    told = [b for b in model.bodies if "src/held.py is claimed by bob" in b]
    assert len(told) == 1 and "synapolis signal bob" in told[0], model.bodies[-1][-3000:]
