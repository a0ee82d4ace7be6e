"""`hooks install --scope project|local|user` (issue 30 item 7): the committed project file stays portable (no
machine's path in it), what is this machine's goes where the harness keeps local or user settings, and doctor
finds the entries in whichever file they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synapolis.harness import doctor
from synapolis.harness import install as hook_install

from conftest import clean_env, console_script

HARNESSES = sorted(hook_install.HARNESSES)


def _cli(*args, env=None):
    return subprocess.run([console_script("synapolis"), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=clean_env(env or {}, HOME=os.environ["HOME"], PATH=os.environ["PATH"]))


def _commands(path: Path) -> list[str]:
    document = json.loads(path.read_text())
    return [h["command"] for groups in document.get("hooks", {}).values() for g in groups for h in g["hooks"]]


@pytest.fixture
def project(tmp_path, harness_home):
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("harness", HARNESSES)
def test_the_committed_project_file_names_no_machines_path(project, harness):
    done = _cli("hooks", "install", harness, "--project-dir", project, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    path = project / hook_install.HARNESSES[harness].settings_path
    assert answer["scope"] == "project" and Path(answer["settings_file"]) == path
    text = path.read_text()
    assert commands_are(path, f"synapolis hook {harness}")
    for private in (sys.prefix, os.environ["HOME"], str(Path(sys.executable).parent), "/"):
        assert f'"{private}' not in text.replace('"/hooks', "")  # no absolute path of this machine in the file


def commands_are(path: Path, command: str) -> bool:
    found = _commands(path)
    return bool(found) and all(c == command for c in found)


def test_local_scope_for_claude_code_is_settings_local_json_with_this_machines_path(project):
    done = _cli("hooks", "install", "claude-code", "--scope", "local", "--project-dir", project)
    assert done.returncode == 0, done.stderr
    local = project / ".claude" / "settings.local.json"
    assert commands_are(local, hook_install.hook_command("claude-code"))
    assert hook_install.hook_command("claude-code").startswith(str(Path(sys.executable).parent))
    assert not (project / ".claude" / "settings.json").exists()  # the committed file is not touched
    assert "keep it out of git" in done.stdout


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("scope", ["local", "user"])
def test_user_files_of_each_harness(project, harness, scope, harness_home):
    done = _cli("hooks", "install", harness, "--scope", scope, "--project-dir", project, "--json")
    assert done.returncode == 0, done.stderr
    written = Path(json.loads(done.stdout)["settings_file"])
    expected = {"claude-code": harness_home / ".claude" / "settings.json",
                "gemini-cli": harness_home / ".gemini" / "settings.json",
                "codex": harness_home / ".codex" / "hooks.json"}[harness]
    if scope == "local" and harness == "claude-code":
        expected = project / ".claude" / "settings.local.json"
    assert written == expected and commands_are(written, hook_install.hook_command(harness))
    assert not (project / hook_install.HARNESSES[harness].settings_path).exists()
    # doctor finds them there: every event installed, the command runs
    found = [f for f in doctor.check_harness(project, harness) if "mcp" not in f["message"].lower()]
    first = found[0]
    assert first["status"] == "ok" and str(written) in first["message"], found
    assert any(f["status"] == "ok" and "the hooks run" in f["message"] for f in found), found
    # and uninstall of that scope takes them out, nothing else
    gone = _cli("hooks", "uninstall", harness, "--scope", scope, "--project-dir", project)
    assert gone.returncode == 0 and _commands(written) == []


def test_user_scope_follows_the_harness_home_variables(project, tmp_path):
    homes = {"CLAUDE_CONFIG_DIR": tmp_path / "claude-config", "GEMINI_CLI_HOME": tmp_path / "gemini-home",
             "CODEX_HOME": tmp_path / "codex-home"}
    files = {"claude-code": homes["CLAUDE_CONFIG_DIR"] / "settings.json",
             "gemini-cli": homes["GEMINI_CLI_HOME"] / ".gemini" / "settings.json",
             "codex": homes["CODEX_HOME"] / "hooks.json"}
    env = {k: str(v) for k, v in homes.items()}
    for harness, path in files.items():
        done = _cli("hooks", "install", harness, "--scope", "user", "--project-dir", project, env=env)
        assert done.returncode == 0, done.stderr
        assert commands_are(path, hook_install.hook_command(harness)), harness


def test_doctor_warns_when_two_files_run_the_hooks(project):
    assert _cli("hooks", "install", "claude-code", "--project-dir", project).returncode == 0
    both = _cli("hooks", "install", "claude-code", "--scope", "local", "--project-dir", project)
    assert "also run(s) synapolis hooks" in both.stdout
    found = doctor.check_harness(project, "claude-code")
    assert any(f["status"] == "warn" and "each event runs the hook once per file" in f["message"] for f in found)
    # the project's portable command and the local absolute one both run synapolis
    assert sum(f["status"] == "ok" and "the hooks run" in f["message"] for f in found) == 2


def test_a_portable_command_not_on_path_is_a_doctor_failure_that_points_at_local_scope(project):
    assert _cli("hooks", "install", "claude-code", "--project-dir", project).returncode == 0
    found = doctor.check_harness(project, "claude-code", env={**os.environ, "PATH": "/usr/bin:/bin"})
    (bad,) = [f for f in found if f["status"] == "fail"]
    assert "is not on PATH" in bad["message"] and "--scope local" in bad["fix"]


def test_a_bad_scope_is_exit_2(project):
    done = _cli("hooks", "install", "codex", "--scope", "global", "--project-dir", project)
    assert done.returncode == 2 and "Traceback" not in done.stderr
