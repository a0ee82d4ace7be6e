"""The real harnesses agree with synapolis about its hooks. Codex's own `hooks/list` (app-server) reports
the same per-hook hash and trust status that `doctor` computes, before and after `hooks install --trust`.
Gemini CLI, pointed at a local stand-in for the model API, runs the installed SessionStart hook and
sends its context to the model in a trusted folder with hooks on, and not otherwise, as doctor says.

Claude Code, pointed at a stand-in for the Messages API, passes a hook's context whole up to exactly
10,000 UTF-16 code units and cuts it past that, and delivers synapolis's signals whole or not at all.

Needs the binaries from npm (`@openai/codex`, `@google/gemini-cli`, `@anthropic-ai/claude-code`):
$SYNAPOLIS_TEST_CODEX, $SYNAPOLIS_TEST_GEMINI and $SYNAPOLIS_TEST_CLAUDE, the pinned versions that
.ci/setup.d/50-harnesses.sh installs under .ci/cache when npm is there, or `codex` / `gemini` / `claude`
on PATH (conftest.harness_binary); each test is skipped without its binary.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import CodexAppServer, ModelStandIn, console_script, harness_binary
from synapolis.harness import doctor
from synapolis.harness import install as hook_install, settings as harness_settings

CODEX = harness_binary("codex")
GEMINI = harness_binary("gemini")
needs_codex = pytest.mark.skipif(not CODEX, reason="no Codex binary (set SYNAPOLIS_TEST_CODEX or put codex on PATH)")
needs_gemini = pytest.mark.skipif(not GEMINI, reason="no Gemini CLI (set SYNAPOLIS_TEST_GEMINI or put gemini on PATH)")
CLAUDE = harness_binary("claude")
needs_claude = pytest.mark.skipif(not CLAUDE, reason="no Claude Code (set SYNAPOLIS_TEST_CLAUDE or put claude on PATH)")


def codex_hooks_list(project, codex_home) -> dict:
    """Codex's own view of the project's hooks: one `hooks/list` over `codex app-server`'s JSON-RPC."""
    with CodexAppServer(CODEX, codex_home, project) as codex:
        listed = codex.ask("hooks/list", {"cwds": [str(project)]})
    (entry,) = listed["result"]["data"]
    return {h["key"]: h for h in entry["hooks"]}


@needs_codex
def test_codex_itself_agrees_on_hashes_and_trust(tmp_path, harness_home, monkeypatch):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(codex_home))
    (codex_home / "config.toml").write_text(f'[projects.{json.dumps(str(project))}]\ntrust_level = "trusted"\n')
    hook_install.install("codex", project)
    hooks_file = project / ".codex" / "hooks.json"
    ours = harness_settings.codex_hooks(hooks_file, json.loads(hooks_file.read_text()),
                                        lambda c: hook_install.is_our_command(c, "codex"))
    seen = codex_hooks_list(project, codex_home)
    assert {k: seen[k]["currentHash"] for k in seen} == {h["key"]: h["hash"] for h in ours}
    assert {h["trustStatus"] for h in seen.values()} == {"untrusted"}
    assert any("never trusted" in f["message"] for f in doctor.check_harness(project, "codex"))

    hook_install.install("codex", project, trust=True)
    assert {h["trustStatus"] for h in codex_hooks_list(project, codex_home).values()} == {"trusted"}
    assert not [f for f in doctor.check_harness(project, "codex") if f["status"] == "fail"]

    document = json.loads(hooks_file.read_text())
    document["hooks"]["PostToolUse"][-1]["hooks"][0]["timeout"] = 9
    hooks_file.write_text(json.dumps(document))
    seen = codex_hooks_list(project, codex_home)
    assert sorted(h["trustStatus"] for h in seen.values()) == ["modified", "trusted", "trusted", "trusted", "trusted"]
    assert any("PostToolUse" in f["message"] and "changed since" in f["message"]
               for f in doctor.check_harness(project, "codex"))




@pytest.fixture
def model():
    stand_in = ModelStandIn()
    yield stand_in
    stand_in.close()


def run_gemini(project, home, state_dir, model) -> tuple[int, str]:
    """One headless Gemini CLI turn in `project`: its exit code, and everything the model was sent."""
    env = {**os.environ, "GEMINI_API_KEY": "stand-in", "GOOGLE_GEMINI_BASE_URL": model.url,
           "GEMINI_CLI_HOME": str(home), "SYNAPOLIS_STATE_DIR": str(state_dir)}
    env.pop("GEMINI_CLI_TRUST_WORKSPACE", None)
    done = subprocess.run([GEMINI, "-p", "hello"], cwd=project, env=env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return done.returncode, "\n".join(model.bodies)


@needs_gemini
@pytest.mark.parametrize("case", ["trusted", "switched_off", "untrusted"])
def test_gemini_runs_the_installed_hooks_exactly_when_doctor_says_so(tmp_path, harness_home, monkeypatch, model, case):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    monkeypatch.setenv("GEMINI_CLI_HOME", str(home))
    (home / ".gemini" / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    rule = "DO_NOT_TRUST" if case == "untrusted" else "TRUST_FOLDER"
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): rule}))
    hook_install.install("gemini-cli", project)
    if case == "switched_off":
        settings = project / ".gemini" / "settings.json"
        settings.write_text(json.dumps({**json.loads(settings.read_text()), "hooksConfig": {"enabled": False}}))
    code, sent = run_gemini(project, home, tmp_path / "state", model)
    ran = "synapolis: you are agent" in sent
    # headless Gemini CLI refuses an untrusted folder outright (exit 55); otherwise it reaches the model
    assert (code == 55) == (case == "untrusted") and bool(sent) == (case != "untrusted")
    failed = [f for f in doctor.check_harness(project, "gemini-cli") if f["status"] == "fail"]
    assert ran == (case == "trusted") and bool(failed) == (case != "trusted"), (case, failed)
    assert (tmp_path / "state" / "heartbeats").is_dir() == ran


def run_claude(project, home, state_dir, model, *args) -> str:
    """One `claude -p` turn in `project`: everything the model was sent, joined (JSON-escaped as sent)."""
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-stand-in", "ANTHROPIC_BASE_URL": model.url,
           "SYNAPOLIS_STATE_DIR": str(state_dir),
           # synapolis on PATH, as a teammate has it: the project's settings run the portable `synapolis`
           "PATH": os.pathsep.join([os.path.dirname(console_script("synapolis")), os.environ.get("PATH", "")])}
    subprocess.run([CLAUDE, "-p", "hello", *args], cwd=project, env=env, capture_output=True, timeout=120,
                   stdin=subprocess.DEVNULL)
    assert model.bodies, "claude never called the model stand-in"
    return "\n".join(json.loads(json.dumps(b)) for b in model.bodies)


def claude_project(tmp_path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".claude").mkdir()
    home = tmp_path / "claude-home"
    home.mkdir()
    return project, home


@needs_claude
@pytest.mark.parametrize("units, whole", [(10_000, True), (10_001, False)])
def test_claude_code_counts_a_hooks_context_in_utf16_units_up_to_10000(tmp_path, model, units, whole):
    project, home = claude_project(tmp_path)
    emitter = project / "emit.py"
    # '<<', 4,990 emoji (9,980 units but only 4,990 characters), '>>', x's, and a marker: `units` in all
    emitter.write_text("import json\n"
                       f"text = '<<' + chr(0x1F600) * 4990 + '>>' + 'x' * {units - 9988} + 'TAIL'\n"
                       "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'SessionStart', "
                       "'additionalContext': text}}))\n")
    settings = {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": f"python3 {emitter}"}]}]}}
    (project / ".claude" / "settings.json").write_text(json.dumps(settings))
    sent = run_claude(project, home, tmp_path / "state", model)
    assert ("xTAIL" in sent) == whole


@needs_claude
def test_claude_code_gets_synapolis_signals_whole_or_not_at_all(tmp_path, model):
    import uuid

    from synapolis import actions
    from synapolis.harness import hooks
    from synapolis.identity import Who
    from synapolis.workspace import Workspace

    project, home = claude_project(tmp_path)
    hook_install.install("claude-code", project)
    state_dir = tmp_path / "state"
    conversation = str(uuid.uuid4())
    start = json.dumps({"session_id": conversation, "hook_event_name": "SessionStart", "cwd": str(project)})
    me = hooks.handle("claude-code", start, state_dir=state_dir, env={})["agent_id"]
    ws = Workspace.open(state_dir)
    actions.start(ws, agent_id="bob", env={}, write_identity=False)
    fits = actions.signal(ws, Who("bob"), me, "\U0001F680" * 4000 + "FITS-END", env={})["signal"]
    sent = run_claude(project, home, state_dir, model, "--session-id", conversation)
    assert "synapolis: you are agent " + me in sent and "FITS-END" in sent  # 8,000+ units, shown whole
    too_big = actions.signal(ws, Who("bob"), me, "\U0001F680" * 5100 + "BIG-END", env={})["signal"]
    model.bodies.clear()
    sent = run_claude(project, home, state_dir, model, "--resume", conversation)
    assert "BIG-END" not in sent and too_big["id"][:12] in sent and "not shown here" in sent
    state = json.loads((state_dir / "hooks" / f"{hooks.agent_id_for('claude-code', conversation, env={})}.json").read_text())
    pending = actions.signals_pending(ws, Who(me, session_id=state["session_id"], run_token=state["run_token"]),
                                      env={})["pending_signals"]
    assert [s["id"] for s in pending] == [too_big["id"]] and fits["id"] not in [s["id"] for s in pending]
