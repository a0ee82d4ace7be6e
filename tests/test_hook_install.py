"""`synapolis hooks install|uninstall`: merged into each harness's real settings file, nothing else touched."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from synapolis.harness import install as hook_install, settings as harness_settings
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
        "hooksConfig": {"enabled": True, "disabled": ["secret-scanner"]},
        "hooks": {
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


@pytest.fixture(autouse=True)
def _isolated_home(harness_home):
    """Every install here reads (and with --trust writes) a harness's user config: never the real one."""
    return harness_home


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
        # the committed project file runs the portable `synapolis` (issue 30: never this machine's path)
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
    assert set(json.loads(path.read_text())["hooks"]) == {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"}
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


def test_our_entries_with_a_machines_path_are_made_portable_in_the_project_file(tmp_path):
    # an earlier install that wrote one machine's virtualenv into the committed file (issue 30)
    document = {"hooks": {e: [{"hooks": [{"type": "command", "command": "/home/me/.venv/bin/synapolis hook codex",
                                          "timeout": 10}]}] for e in hook_install.HARNESSES["codex"].events}}
    path = write(tmp_path, "codex", document)
    result = hook_install.install("codex", tmp_path)
    assert result["added"] == [] and sorted(result["updated"]) == sorted(hook_install.HARNESSES["codex"].events)
    after = json.loads(path.read_text())
    commands = [h["command"] for groups in after["hooks"].values() for g in groups for h in g["hooks"]]
    assert commands == ["synapolis hook codex"] * len(commands)  # updated in place, none added
    before = path.read_bytes()
    again = hook_install.install("codex", tmp_path)
    assert not again["changed"] and path.read_bytes() == before


@pytest.mark.parametrize("command, harness, ours", [
    ("synapolis hook claude-code", "claude-code", True),
    ("/usr/local/bin/synapolis hook claude-code", "claude-code", True),
    ('"C:\\Tools\\synapolis.exe" hook codex', "codex", True),
    ("synapolis --state-dir /srv/state hook gemini-cli", "gemini-cli", True),
    ("'/home/u/my venv/bin/synapolis' --state-dir '/srv/my state' hook codex", "codex", True),
    ("/usr/bin/python3 -m synapolis hook codex", "codex", True),
    ("synapolis hook", "codex", False),
    ("unbalanced 'quote synapolis hook codex", "codex", False),
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


def test_gemini_with_hooks_switched_off_gets_a_note(tmp_path, harness_home):
    write(tmp_path, "gemini-cli", {"hooksConfig": {"enabled": False}})
    notes = hook_install.install("gemini-cli", tmp_path)["notes"]
    assert any("hooksConfig.enabled is false" in n for n in notes)
    write(tmp_path, "gemini-cli", {"tools": {"enableHooks": True}})
    notes = hook_install.install("gemini-cli", tmp_path)["notes"]
    assert any("tools.enableHooks is not a Gemini CLI setting" in n for n in notes)
    assert any("trusted folder" in n for n in notes)  # and the trust step is named


def test_install_into_a_missing_or_non_folder_project_dir_is_exit_2_and_nothing_is_made(cli, tmp_path):
    missing = tmp_path / "no-such-project"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a project")
    for project in (missing, a_file):  # (uninstall there has nothing to take out: exit 0, as test above)
        done = cli("hooks", "install", "claude-code", "--project-dir", project, "--json")
        assert done.returncode == 2, (project, done.stderr)
        assert json.loads(done.stdout)["error"]["type"] == "UsageError"
        assert str(project) in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not missing.exists() and a_file.read_text() == "not a project"
    with pytest.raises(UsageError, match="does not exist"):
        hook_install.install("codex", missing)


def test_unknown_harness_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        hook_install.install("vim", tmp_path)


# -- the command written: the absolute path of this synapolis, quoted for the shell --------------------------

def test_the_command_is_this_interpreters_console_script_and_runs_without_it_on_path(tmp_path):
    command = hook_install.hook_command("claude-code")
    script = Path(sys.executable).parent / "synapolis"
    assert shlex.split(command) == [str(script), "hook", "claude-code"]
    event = json.dumps({"session_id": "c-path", "hook_event_name": "SessionStart", "cwd": str(tmp_path)})
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SYNAPOLIS_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(["/bin/sh", "-c", command], input=event, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and "you are agent" in json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]


def test_a_path_with_spaces_and_quotes_is_quoted_for_the_shell(tmp_path, monkeypatch):
    venv = tmp_path / "it's a venv" / "bin"
    venv.mkdir(parents=True)
    fake_python = venv / "python"
    fake_python.symlink_to(sys.executable)
    launcher = venv / "synapolis"
    launcher.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m synapolis \"$@\"\n")
    launcher.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake_python))
    command = hook_install.hook_command("codex")
    assert shlex.split(command)[0] == str(launcher)
    event = json.dumps({"session_id": "c-quote", "hook_event_name": "Stop", "cwd": str(tmp_path)})
    env = {"PATH": "/usr/bin:/bin", "SYNAPOLIS_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(["/bin/sh", "-c", command], input=event, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "not found" not in done.stderr


def test_without_a_console_script_the_interpreter_runs_the_module(tmp_path, monkeypatch):
    import sysconfig

    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(bare / "python"))
    monkeypatch.setattr(sysconfig, "get_path", lambda *a, **k: str(tmp_path / "nowhere"))
    assert shlex.split(hook_install.hook_command("gemini-cli")) == [str(bare / "python"), "-m", "synapolis",
                                                                     "hook", "gemini-cli"]
    assert hook_install.is_our_command(hook_install.hook_command("gemini-cli"), "gemini-cli")


# -- each file written is valid for the harness's own published schema (tests/schemas/README.md) ------------

SCHEMAS = {"claude-code": "claude-code-settings.json", "codex": "codex-hooks.json",
           "gemini-cli": "gemini-cli-settings.schema.json"}


def schema_errors(harness, document) -> list[str]:
    import jsonschema

    schema = json.loads((Path(__file__).parent / "schemas" / SCHEMAS[harness]).read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.mark.parametrize("harness", sorted(hook_install.HARNESSES))
@pytest.mark.parametrize("start", ["missing", "existing"])
def test_the_settings_file_written_is_valid_for_the_harness_schema(tmp_path, harness, start):
    if start == "existing":
        assert schema_errors(harness, EXISTING[harness]) == []
        write(tmp_path, harness, EXISTING[harness])
    hook_install.install(harness, tmp_path)
    document = json.loads(settings(tmp_path, harness).read_text())
    assert schema_errors(harness, document) == []
    # the schema is not a rubber stamp: what Gemini CLI removed, and a hook without its command, fail it
    broken = copy.deepcopy(document)
    next(iter(broken["hooks"].values()))[-1]["hooks"][0].pop("command")
    if harness == "gemini-cli":
        broken = {**document, "tools": {"enableHooks": True}}
    assert schema_errors(harness, broken)


# -- Codex: the trust step, and --trust ---------------------------------------------------------------------

def codex_config(home):
    return home / ".codex" / "config.toml"


def test_codex_install_names_the_steps_left_and_never_trusts_unasked(tmp_path, harness_home):
    result = hook_install.install("codex", tmp_path)
    notes = " ".join(result["notes"])
    assert "trusted project" in notes and "Trust all and continue" in notes and "--trust" in notes
    assert result["trusted"] == [] and not codex_config(harness_home).exists()


def test_codex_trust_writes_exactly_the_hashes_codex_computes_and_keeps_the_rest(tmp_path, harness_home):
    codex_config(harness_home).parent.mkdir()
    original = ('# my settings\nmodel = "gpt-5"\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n\n'
                '[hooks.state."/elsewhere/.codex/hooks.json:stop:0:0"]\nenabled = false\n')
    codex_config(harness_home).write_text(original)
    result = hook_install.install("codex", tmp_path, trust=True)
    assert len(result["trusted"]) == 5
    text = codex_config(harness_home).read_text()
    assert text.startswith(original)  # appended, nothing of the user's touched
    import tomllib

    states = tomllib.loads(text)["hooks"]["state"]
    document = json.loads(settings(tmp_path, "codex").read_text())
    ours = harness_settings.codex_hooks(settings(tmp_path, "codex"), document,
                                        lambda c: hook_install.is_our_command(c, "codex"))
    assert {h["key"]: h["hash"] for h in ours} == {k: v["trusted_hash"] for k, v in states.items() if "trusted_hash" in v}
    assert states["/elsewhere/.codex/hooks.json:stop:0:0"] == {"enabled": False}
    # trusting again changes nothing; after an edit only the changed hook's line is rewritten
    assert hook_install.install("codex", tmp_path, trust=True)["trusted"] == []
    document["hooks"]["Stop"][-1]["hooks"][0]["timeout"] = 7
    settings(tmp_path, "codex").write_text(json.dumps(document))
    assert [k.rsplit(":", 3)[1] for k in hook_install.install("codex", tmp_path, trust=True)["trusted"]] == ["stop"]
    assert codex_config(harness_home).read_text().count("[hooks.state.") == 6


def test_codex_trust_refuses_a_layout_it_cannot_edit_safely(tmp_path, harness_home):
    codex_config(harness_home).parent.mkdir()
    inline = 'hooks = { state = {} }\n'  # an inline table: a [hooks.state."..."] header would be invalid TOML
    codex_config(harness_home).write_text(inline)
    with pytest.raises(UsageError, match="will not edit safely"):
        hook_install.install("codex", tmp_path, trust=True)
    assert codex_config(harness_home).read_text() == inline


def test_trust_is_only_for_codex_and_the_cli_says_so(cli, tmp_path):
    done = cli("hooks", "install", "claude-code", "--trust", "--project-dir", tmp_path)
    assert done.returncode == 2 and "--trust is for codex" in done.stderr and "Traceback" not in done.stderr
    done = cli("hooks", "install", "codex", "--project-dir", tmp_path)
    assert done.returncode == 0 and "note: Codex runs each project hook only after you trust it" in done.stdout


def test_an_entry_with_a_state_dir_keeps_it_when_pointed_at_this_synapolis(tmp_path):
    path = write(tmp_path, "claude-code", {"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": "synapolis --state-dir '/srv/my state' hook claude-code"}]}]}})
    hook_install.install("claude-code", tmp_path)
    (entry,) = json.loads(path.read_text())["hooks"]["Stop"][0]["hooks"]
    assert shlex.split(entry["command"]) == [*hook_install.PORTABLE_PROGRAM, "--state-dir", "/srv/my state", "hook",
                                             "claude-code"]
