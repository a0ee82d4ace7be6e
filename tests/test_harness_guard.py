"""The guard in the real harnesses (contract §14): agent B's model asks to write a file agent A holds; the
harness runs synapolis's installed pre-tool hook, refuses the tool call, and the refusal (naming A and the
signal command) is what B's model reads in its next request. With guard.mode warn, the write happens and
the reason reaches the model as context. With guard.auto_claim, two real Claude Code sessions on one
repository: the second one's write of the first one's file is refused until the first ends.

Each harness runs headless against tests/conftest.py's ScriptedModel (a local stand-in for its model API
that answers with the tool calls of a script), with the binaries of tests/test_harness_binaries.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from conftest import ScriptedModel, clean_env, configure, console_script, require_harness
from synapolis import actions, claims
from synapolis.harness import install as hook_install
from synapolis.workspace import Workspace


@pytest.fixture
def repo(tmp_path):
    """A project (a git work tree) with its state directory inside, agent A (alice) holding src/api/."""
    project = tmp_path / "project"
    (project / "src" / "api").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    ws = Workspace.open(project / "state").ensure()
    actions.start(ws, agent_id="alice", env={}, write_identity=False)
    claims.claim(ws, "src/api/**", "alice", ttl_s=3600)
    return project, ws


def harness_env(home, state_dir, **more) -> dict:
    # synapolis on PATH, as a teammate who installed it has it: the project's hook files run the portable
    # `synapolis` (hooks install --scope project)
    path = os.pathsep.join([os.path.dirname(console_script("synapolis")), os.environ.get("PATH", "")])
    env = clean_env(HOME=str(home), SYNAPOLIS_STATE_DIR=str(state_dir), PATH=path, **more)
    env.pop("CLAUDE_PROJECT_DIR", None)
    return env


# -- Claude Code ------------------------------------------------------------------------------------

def run_claude(project, home, state_dir, model, *args, timeout=180) -> subprocess.CompletedProcess:
    env = harness_env(home, state_dir, ANTHROPIC_API_KEY="sk-ant-stand-in", ANTHROPIC_BASE_URL=model.url)
    return subprocess.run([require_harness("claude"), "-p", "go", "--permission-mode", "acceptEdits", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("mode", ["deny", "warn"])
def test_claude_code_refuses_the_write_and_its_model_reads_who_to_ask(repo, tmp_path, mode):
    project, ws = repo
    configure(ws, guard={"mode": mode})
    hook_install.install("claude-code", project)
    target = project / "src" / "api" / "users.py"
    model = ScriptedModel("anthropic", [("Write", {"file_path": str(target), "content": "x = 1\n"})])
    try:
        run_claude(project, tmp_path / "home", ws.paths.root, model)
    finally:
        model.close()
    (after,) = model.with_result(1)
    text = json.loads(json.dumps(after))
    assert "alice" in text and 'synapolis signal alice' in text and "src/api/users.py" in text, text[-3000:]
    assert target.exists() == (mode == "warn")


def test_auto_claim_two_claude_code_sessions_second_is_refused_until_the_first_ends(repo, tmp_path):
    project, ws = repo
    configure(ws, guard={"auto_claim": True})
    hook_install.install("claude-code", project)
    target = project / "src" / "app.py"
    hold = threading.Event()
    first = ScriptedModel("anthropic", [("Write", {"file_path": str(target), "content": "first = 1\n"})], hold=hold)
    env = harness_env(tmp_path / "home1", ws.paths.root, ANTHROPIC_API_KEY="sk-ant-stand-in", ANTHROPIC_BASE_URL=first.url)
    one = subprocess.Popen([require_harness("claude"), "-p", "go", "--permission-mode", "acceptEdits"], cwd=project,
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from conftest import wait_until

        # the first session wrote the file and now waits for its model: working, between tool calls
        wait_until(lambda: first.with_result(1), deadline_s=120, what="the first session's write")
        assert target.read_text() == "first = 1\n"
        (held,) = [c for c in claims.list_claims(Workspace.open(ws.paths.root)) if c["item"] == "src/app.py"]
        owner = held["claimed_by"]
        assert held["state"] == "held" and owner.startswith("claude_code_")

        calls = [("Read", {"file_path": str(target)}), ("Write", {"file_path": str(target), "content": "second = 2\n"})]
        second = ScriptedModel("anthropic", calls)
        try:
            run_claude(project, tmp_path / "home2", ws.paths.root, second)
        finally:
            second.close()
        (refusal,) = second.with_result(2)
        assert owner in refusal and f"synapolis signal {owner}" in refusal
        assert target.read_text() == "first = 1\n"
    finally:
        hold.set()
        one.wait(timeout=120)
        first.close()
    # the first session ended (SessionEnd): its auto-claim is released, and the second one's write goes through
    (record,) = [c for c in claims.list_claims(Workspace.open(ws.paths.root)) if c["item"] == "src/app.py"]
    assert record["state"] == "released"
    third = ScriptedModel("anthropic", calls)
    try:
        run_claude(project, tmp_path / "home2", ws.paths.root, third)
    finally:
        third.close()
    assert target.read_text() == "second = 2\n"


# -- Gemini CLI -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["deny", "warn"])
def test_gemini_cli_refuses_the_write_and_its_model_reads_who_to_ask(repo, tmp_path, mode):
    project, ws = repo
    configure(ws, guard={"mode": mode})
    hook_install.install("gemini-cli", project)
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    (tmp_path / "tmp").mkdir()
    target = project / "src" / "api" / "users.py"
    model = ScriptedModel("gemini", [("write_file", {"file_path": str(target), "content": "x = 1\n"})])
    env = harness_env(home, ws.paths.root, GEMINI_API_KEY="stand-in", GOOGLE_GEMINI_BASE_URL=model.url,
                      GEMINI_CLI_HOME=str(home), TMPDIR=str(tmp_path / "tmp"),
                      GEMINI_CLI_SYSTEM_SETTINGS_PATH=str(tmp_path / "etc-gemini" / "settings.json"))
    for name in ("GEMINI_CLI_TRUST_WORKSPACE", "GEMINI_CLI_TRUSTED_FOLDERS_PATH", "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"):
        env.pop(name, None)
    try:
        subprocess.run([require_harness("gemini"), "-p", "go", "--approval-mode", "auto_edit", "-m", "gemini-2.5-pro"], cwd=project, env=env,
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    finally:
        model.close()
    (after,) = model.with_result(1)
    assert "alice" in after and "synapolis signal alice" in after and "src/api/users.py" in after, after[-3000:]
    # refused: the tool's error; warned: the write happened and AfterTool's context carries the reason
    assert ("Tool execution blocked" in after) == (mode == "deny") and target.exists() == (mode == "warn")
    assert ("<hook_context>synapolis: src/api/users.py" in after) == (mode == "warn")


# -- Codex ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["deny", "warn"])
def test_codex_refuses_the_patch_and_its_model_reads_who_to_ask(repo, tmp_path, mode):
    project, ws = repo
    configure(ws, guard={"mode": mode})
    # a patch that adds a free file and one alice holds: the whole patch is refused (deny)
    patch = "*** Begin Patch\n*** Add File: src/free.py\n+ok = 1\n*** Add File: src/api/users.py\n+x = 1\n*** End Patch\n"
    model = ScriptedModel("openai", [("apply_patch", patch)])
    home = tmp_path / "codex-home"
    home.mkdir()
    # gpt-5.5: a model Codex 0.171 knows, so it offers its freeform apply_patch tool
    (home / "config.toml").write_text(
        f'model = "gpt-5.5"\nmodel_provider = "standin"\n\n[model_providers.standin]\nname = "standin"\n'
        f'base_url = "{model.url}/v1"\nwire_api = "responses"\nenv_key = "STANDIN_KEY"\n\n'
        f'[projects.{json.dumps(str(project))}]\ntrust_level = "trusted"\n')
    env = harness_env(tmp_path, ws.paths.root, CODEX_HOME=str(home), STANDIN_KEY="stand-in")
    hook_install.install("codex", project, trust=True, env=env)
    try:
        subprocess.run([require_harness("codex"), "exec", "--dangerously-bypass-approvals-and-sandbox", "go"],
                       cwd=project, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    finally:
        model.close()
    (after,) = model.with_result(1)
    assert "alice" in after and "synapolis signal alice" in after and "src/api/users.py" in after, after[-3000:]
    assert (project / "src" / "api" / "users.py").exists() == (mode == "warn")
    assert (project / "src" / "free.py").exists() == (mode == "warn")
