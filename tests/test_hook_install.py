"""`synapolis hooks install|uninstall`: merged into each harness's real settings file, nothing else touched."""

from __future__ import annotations

import copy
import json

import pytest

from synapolis import hook_install
from synapolis.errors import UsageError

EXISTING = {
    "claude-code": {
        "$schema": "https://json.schemastore.org/claude-code-settings.json",
        "permissions": {"allow": ["Bash(npm run test:*)"], "deny": ["Read(./.env)"]},
        "env": {"FOO": "bar"},
        "hooks": {
            "PostToolUse": [{"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "npx prettier --write"}]}],
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./check.sh", "timeout": 5}]}],
        },
        "model": "opus",
    },
    "gemini-cli": {
        "mcpServers": {"github": {"command": "gh-mcp", "args": []}},
        "tools": {"enableHooks": True},
        "hooks": {
            "disabled": ["secret-scanner"],
            "BeforeTool": [{"matcher": "write_file|replace",
                            "hooks": [{"name": "secret-scanner", "type": "command", "command": "./scan.sh"}]}],
            "AfterTool": [{"matcher": "run_shell_command",
                           "hooks": [{"name": "log", "type": "command", "command": "./log.sh", "timeout": 3000}]}],
        },
        "ui": {"theme": "GitHub"},
    },
    "codex": {
        "hooks": {
            "SessionStart": [{"matcher": "startup|resume", "hooks": [{"type": "command", "command": "python3 warm.py",
                                                                      "statusMessage": "Loading context"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "python3 stop.py", "timeout": 30}]}],
        },
    },
}


def settings(project, harness):
    return project / hook_install.HARNESSES[harness].settings_path


def write(project, harness, document):
    path = settings(project, harness)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=4))
    return path


def without_ours(document, harness):
    return hook_install.merge_uninstall(document, harness)[0]


@pytest.mark.parametrize("harness", sorted(hook_install.HARNESSES))
def test_install_keeps_everything_and_uninstall_restores_it(tmp_path, harness):
    original = copy.deepcopy(EXISTING[harness])
    path = write(tmp_path, harness, original)
    result = hook_install.install(harness, tmp_path)
    spec = hook_install.HARNESSES[harness]
    assert result["added"] == list(spec.events) and result["changed"]
    installed = json.loads(path.read_text())
    assert sorted(hook_install.installed_events(installed, harness)) == sorted(spec.events)
    assert without_ours(installed, harness) == original  # everything else exactly as it was
    for event in spec.events:  # the user's own groups for the same event come first, untouched
        groups = installed["hooks"][event]
        assert groups[:-1] == original.get("hooks", {}).get(event, [])
        (entry,) = groups[-1]["hooks"]
        assert entry["command"] == f"synapolis hook {harness}" and entry["type"] == "command"
        assert entry["timeout"] == (10000 if harness == "gemini-cli" else 10)
    assert hook_install.uninstall(harness, tmp_path)["removed"]
    assert json.loads(path.read_text()) == original
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("harness", sorted(hook_install.HARNESSES))
def test_install_is_idempotent(tmp_path, harness):
    path = write(tmp_path, harness, EXISTING[harness])
    hook_install.install(harness, tmp_path)
    once = path.read_bytes()
    again = hook_install.install(harness, tmp_path)
    assert again["added"] == [] and not again["changed"] and path.read_bytes() == once


def test_install_creates_a_missing_file_and_uninstall_leaves_an_empty_object(tmp_path):
    hook_install.install("codex", tmp_path)
    path = settings(tmp_path, "codex")
    assert set(json.loads(path.read_text())["hooks"]) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"}
    hook_install.uninstall("codex", tmp_path)
    assert json.loads(path.read_text()) == {}
    assert hook_install.uninstall("codex", tmp_path / "nowhere")["changed"] is False


def test_uninstall_takes_only_our_entry_out_of_a_shared_group(tmp_path):
    theirs = {"type": "command", "command": "./audit.sh"}
    document = {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [
        theirs, {"type": "command", "command": "/opt/venv/bin/synapolis hook claude-code", "timeout": 3}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "synapolis hook gemini-cli"}]}]}}
    path = write(tmp_path, "claude-code", document)
    assert hook_install.uninstall("claude-code", tmp_path)["removed"] == ["PostToolUse"]
    after = json.loads(path.read_text())
    assert after["hooks"]["PostToolUse"] == [{"matcher": "*", "hooks": [theirs]}]
    # another harness's entry (however it got there) is not ours to remove here
    assert after["hooks"]["Stop"] == document["hooks"]["Stop"]


def test_an_existing_entry_with_another_path_counts_as_installed(tmp_path):
    document = {"hooks": {e: [{"hooks": [{"type": "command", "command": "/home/u/.local/bin/synapolis hook codex"}]}]
                          for e in hook_install.HARNESSES["codex"].events}}
    path = write(tmp_path, "codex", document)
    before = path.read_bytes()
    assert hook_install.install("codex", tmp_path)["added"] == []
    assert path.read_bytes() == before


@pytest.mark.parametrize("command, harness, ours", [
    ("synapolis hook claude-code", "claude-code", True),
    ("/usr/local/bin/synapolis hook claude-code", "claude-code", True),
    ('"C:\\Tools\\synapolis.exe" hook codex', "codex", True),
    ("synapolis --state-dir /srv/state hook gemini-cli", "gemini-cli", True),
    ("synapolis hook gemini-cli", "claude-code", False),
    ("synapolis hook claude-codex", "claude-code", False),
    ("echo notsynapolis hook claude-code", "claude-code", False),
    ("./synapolis-wrapper.sh", "claude-code", False),
    (None, "claude-code", False),
])
def test_which_commands_are_ours(command, harness, ours):
    assert hook_install.is_our_command(command, harness) is ours


@pytest.mark.parametrize("content", ["{broken", "[1, 2]", '{"hooks": []}', '{"hooks": {"Stop": {"x": 1}}}', "\xff\xfe"])
def test_broken_settings_exit_2_and_stay_untouched(cli, tmp_path, content):
    path = settings(tmp_path, "claude-code")
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode("latin-1"))
    for verb in ("install", "uninstall"):
        done = cli("hooks", verb, "claude-code", "--project-dir", tmp_path, "--json")
        if verb == "uninstall" and content == '{"hooks": {"Stop": {"x": 1}}}':
            assert done.returncode == 0  # nothing of ours in it: nothing to take out, nothing written
        else:
            assert done.returncode == 2, done.stderr
            assert json.loads(done.stdout)["error"]["type"] == "UsageError"
            assert str(path) in done.stderr and "Traceback" not in done.stderr
        assert path.read_bytes() == content.encode("latin-1")


def test_the_cli_reports_what_it_did(cli, tmp_path):
    write(tmp_path, "gemini-cli", EXISTING["gemini-cli"])
    done = cli("hooks", "install", "gemini-cli", "--project-dir", tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["added"] == list(hook_install.HARNESSES["gemini-cli"].events)
    assert answer["settings_file"] == str(settings(tmp_path, "gemini-cli"))
    done = cli("hooks", "install", "gemini-cli", "--project-dir", tmp_path)
    assert "already installed" in done.stdout
    done = cli("hooks", "uninstall", "gemini-cli", "--project-dir", tmp_path)
    assert done.returncode == 0 and "removed hooks" in done.stdout
    assert json.loads(settings(tmp_path, "gemini-cli").read_text()) == EXISTING["gemini-cli"]
    assert cli("hooks", "install", "cursor", "--project-dir", tmp_path).returncode == 2


def test_gemini_with_hooks_switched_off_gets_a_note(tmp_path):
    write(tmp_path, "gemini-cli", {"tools": {"enableHooks": False}})
    assert "enableHooks" in hook_install.install("gemini-cli", tmp_path)["notes"][0]


def test_unknown_harness_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        hook_install.install("vim", tmp_path)
