"""`synapolis doctor`: every check, broken on purpose, reports a finding with its fix (exit 1); a good set-up is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from pathlib import Path

import pytest

from conftest import clean_env, synapolis_cmd
from synapolis import schemas
from synapolis.harness import doctor
from synapolis.harness import install as hook_install, settings as harness_settings


@pytest.fixture
def home(harness_home):
    """An empty home directory, so the user's own ~/.codex and ~/.gemini do not leak into the checks."""
    return harness_home


@pytest.fixture
def bin_dir(tmp_path):
    path = tmp_path / "bin"
    path.mkdir()
    return path


def fake_crontab(bin_dir, stdout="", rc=0):
    script = bin_dir / "crontab"
    # shell built-ins only: the tests run it with a PATH that holds nothing else
    lines = " ".join(f"'{line}'" for line in stdout.splitlines())
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines}\nexit {rc}\n")
    script.chmod(0o755)
    return script


def by_check(report, name):
    return [f for f in report["findings"] if f["check"] == name]


def statuses(report, name):
    return [f["status"] for f in by_check(report, name)]


def trust_project(home, project):
    """What the user does once per project: trust it in Codex and in Gemini CLI."""
    codex = home / ".codex"
    codex.mkdir(exist_ok=True)
    with open(codex / "config.toml", "a") as handle:
        handle.write(f'\n[projects.{json.dumps(str(project))}]\ntrust_level = "trusted"\n')
    gemini = home / ".gemini"
    gemini.mkdir(exist_ok=True)
    (gemini / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))


def good_setup(state_dir, project):
    """A state directory and a project with every harness wired up (hooks and MCP) and trusted."""
    subprocess.run(synapolis_cmd(state_dir, "init"), check=True, capture_output=True, timeout=60)
    trust_project(Path(os.environ["HOME"]), project)
    for harness in hook_install.HARNESSES:
        hook_install.install(harness, project, trust=harness == "codex")
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"synapolis": {"command": "synapolis", "args": ["mcp"]}}}))
    gemini = project / ".gemini" / "settings.json"
    document = json.loads(gemini.read_text())
    document["mcpServers"] = {"synapolis": {"command": "/opt/venv/bin/synapolis", "args": ["mcp"]}}
    gemini.write_text(json.dumps(document))
    (project / ".codex" / "config.toml").write_text('[mcp_servers.synapolis]\ncommand = "synapolis"\nargs = ["mcp"]\n')


def run_cli(state_dir, project, bin_dir, home, *args):
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}/usr/bin:/bin")
    env["HOME"] = str(home)
    return subprocess.run(synapolis_cmd(state_dir, "doctor", "--project-dir", project, *args), capture_output=True,
                          text=True, env=env, timeout=60)


# -- the whole command -------------------------------------------------------------------------------

def test_a_good_setup_is_clean_and_exits_0(tmp_path, state_dir, bin_dir, home):
    project = tmp_path / "project"
    project.mkdir()
    good_setup(state_dir, project)
    fake_crontab(bin_dir, f"# m h dom mon dow command\n7 * * * * /opt/synapolis/scripts/synapolis-watchdog {state_dir}")
    done = run_cli(state_dir, project, bin_dir, home, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, [f for f in report["findings"] if f["status"] != "ok"]
    assert report["ok"] and report["counts"]["fail"] == report["counts"]["warn"] == 0
    assert {f["check"] for f in report["findings"]} >= {"state_dir", "local_fs", "schemas", "config", "temp_files",
                                                       "cron", "harness:claude-code", "harness:gemini-cli",
                                                       "harness:codex"}
    text = run_cli(state_dir, project, bin_dir, home)
    assert text.returncode == 0 and "0 problem(s), 0 warning(s)" in text.stdout


def test_problems_exit_1_and_each_comes_with_its_fix(tmp_path, state_dir, bin_dir, home):
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text("{not json")
    done = run_cli(state_dir, project, bin_dir, home)  # no crontab on this PATH, no hooks, broken config
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "FAIL  config" in done.stdout and "WARN  cron" in done.stdout and "WARN  harness:claude-code" in done.stdout
    report = json.loads(run_cli(state_dir, project, bin_dir, home, "--json").stdout)
    failed = [f for f in report["findings"] if f["status"] == "fail"]
    assert failed and all(f["fix"] for f in failed) and not report["ok"]


# -- the state directory -------------------------------------------------------------------------------

def test_missing_state_dir_is_a_warning_with_init_as_the_fix(state_dir):
    (finding,) = doctor.check_writable(state_dir)
    assert finding["status"] == "warn" and "init" in finding["fix"]
    assert not state_dir.exists()  # doctor only reads


def test_state_dir_that_is_a_file_fails(tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("x")
    assert [f["status"] for f in doctor.check_writable(blocker)] == ["fail"]
    # and a state dir that cannot be created because its parent is a file
    assert [f["status"] for f in doctor.check_writable(blocker / "inner")] == ["fail"]


def test_a_file_where_a_folder_belongs_fails(state_dir):
    state_dir.mkdir()
    (state_dir / "heartbeats").write_text("oops")
    (finding,) = doctor.check_writable(state_dir)
    assert finding["status"] == "fail" and "heartbeats" in finding["message"]


def test_read_only_state_dir_fails(state_dir):
    state_dir.mkdir()
    try:
        frozen = subprocess.run(["chattr", "+i", str(state_dir)], capture_output=True, timeout=10).returncode == 0
    except OSError:
        frozen = False
    if not frozen:
        pytest.skip("cannot make a directory read-only here (chattr +i)")
    try:
        (finding,) = doctor.check_writable(state_dir)
        assert finding["status"] == "fail" and "chmod" in finding["fix"]
    finally:
        subprocess.run(["chattr", "-i", str(state_dir)], capture_output=True, timeout=10)


def test_network_filesystems_fail_and_local_ones_pass(tmp_path, state_dir):
    mounts = tmp_path / "mounts"
    target = str(state_dir.parent.resolve())
    escaped = target.replace(" ", "\\040")
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/export {escaped} nfs4 rw,vers=4.2 0 0\n")
    (finding,) = doctor.check_local_fs(state_dir, mounts)
    assert finding["status"] == "fail" and "nfs4" in finding["message"] and "local disk" in finding["fix"]
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\n//nas/share {escaped} cifs rw 0 0\n")
    assert doctor.check_local_fs(state_dir, mounts)[0]["status"] == "fail"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {escaped} tmpfs rw 0 0\n")
    assert doctor.check_local_fs(state_dir, mounts)[0]["status"] == "ok"
    # a deeper mount that does not hold the state directory does not count
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/x {escaped}-other nfs rw 0 0\n")
    assert doctor.check_local_fs(state_dir, mounts)[0]["status"] == "ok"
    assert doctor.check_local_fs(state_dir, tmp_path / "no-such-file")[0]["status"] == "ok"


def test_mount_points_with_spaces_are_unescaped(tmp_path):
    folder = tmp_path / "my state"
    folder.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nsrv:/e {str(folder.resolve()).replace(' ', chr(92) + '040')} nfs rw 0 0\n")
    assert doctor.filesystem_of(folder / "state", mounts) == (str(folder.resolve()), "nfs")


# -- schemas and config ----------------------------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"stale_after_s": -5}', "stale_after_s"),
    ('{"stale_after_sec": 300}', "unknown key"),
    ('{"escalation": {"notify_cmd": 42}}', "notify_cmd"),
])
def test_broken_config_fails(state_dir, content, words):
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text(content)
    config = by_check({"findings": doctor.check_config_and_schemas(state_dir)}, "config")
    assert [f["status"] for f in config] == ["fail"] and words in config[0]["message"]


def test_a_valid_config_and_the_shipped_schemas_pass(state_dir):
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text('{"stale_after_s": 120, "escalation": {"notify_cmd": ["true"]}}')
    assert [f["status"] for f in doctor.check_config_and_schemas(state_dir)] == ["ok", "ok"]


def test_a_missing_or_broken_schema_fails(tmp_path, state_dir, monkeypatch):
    fake = tmp_path / "standards"
    fake.mkdir()
    for name in schemas.SCHEMA_FILES.values():
        (fake / name).write_text('{"type": "object"}')
    (fake / schemas.SCHEMA_FILES["heartbeat"]).write_text('{"type": 12}')
    (fake / schemas.SCHEMA_FILES["config"]).unlink()
    monkeypatch.setattr(schemas, "standards_dir", lambda: fake)
    schemas.load_schema.cache_clear()
    schemas.validator.cache_clear()
    try:
        (finding,) = by_check({"findings": doctor.check_config_and_schemas(state_dir)}, "schemas")
    finally:
        schemas.load_schema.cache_clear()
        schemas.validator.cache_clear()
    assert finding["status"] == "fail"
    assert "config.schema.json is missing" in finding["message"] and "heartbeat.schema.json" in finding["message"]


# -- temp files ---------------------------------------------------------------------------------------

def test_old_stray_temp_files_fail_and_young_ones_do_not(state_dir):
    (state_dir / "heartbeats").mkdir(parents=True)
    young = state_dir / "heartbeats" / ".tmp-alice.json.123.abcd.tmp"
    young.write_text("{")
    assert doctor.check_temp_files(state_dir)[0]["status"] == "ok"  # a writer may be mid-write
    old = state_dir / ".tmp-heartbeat-monitor.json.9.ffff.tmp"
    old.write_text("{")
    stamp = time.time() - 2 * 3600
    os.utime(old, (stamp, stamp))
    (finding,) = doctor.check_temp_files(state_dir)
    assert finding["status"] == "fail" and finding["paths"] == [str(old)] and "watchdog" in finding["fix"]


# -- cron -----------------------------------------------------------------------------------------------

def test_cron_line_checks(state_dir, bin_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(bin_dir))
    (finding,) = doctor.check_cron(state_dir)
    assert finding["status"] == "warn" and "no `crontab`" in finding["message"] and "watchdog" in finding["fix"]
    fake_crontab(bin_dir, "no crontab for root", rc=1)
    (finding,) = doctor.check_cron(state_dir)
    assert finding["status"] == "warn" and "crontab -" in finding["fix"] and str(state_dir) in finding["fix"]
    fake_crontab(bin_dir, f"# 7 * * * * synapolis-watchdog {state_dir}\n0 1 * * * backup.sh")
    assert doctor.check_cron(state_dir)[0]["status"] == "warn"  # commented out does not count
    fake_crontab(bin_dir, "7 * * * * synapolis-watchdog /somewhere/else/state")
    assert doctor.check_cron(state_dir)[0]["status"] == "warn"
    fake_crontab(bin_dir, f"7 * * * * synapolis --state-dir {state_dir} watchdog")
    assert doctor.check_cron(state_dir)[0]["status"] == "ok"


def test_a_hanging_crontab_is_a_finding_not_a_hang(state_dir, bin_dir, monkeypatch):
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setattr(doctor, "CRONTAB_TIMEOUT_S", 0.5)
    script = bin_dir / "crontab"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    started = time.monotonic()
    (finding,) = doctor.check_cron(state_dir)
    assert finding["status"] == "fail" and time.monotonic() - started < 10


# -- harnesses ------------------------------------------------------------------------------------------

def test_no_harness_wired_is_a_warning(tmp_path):
    assert [f["status"] for f in doctor.check_harnesses(tmp_path)] == ["warn"]


@pytest.mark.parametrize("harness", sorted(hook_install.HARNESSES))
def test_missing_partial_and_broken_hook_entries(tmp_path, home, harness):
    spec = hook_install.HARNESSES[harness]
    path = tmp_path / spec.settings_path
    path.parent.mkdir(parents=True)
    check = f"harness:{harness}"
    (finding,) = doctor.check_harness(tmp_path, harness)  # set up, but not for synapolis: a warning
    assert finding["status"] == "warn" and f"hooks install {harness}" in finding["fix"]
    hook_install.install(harness, tmp_path)
    assert doctor.check_harness(tmp_path, harness)[0]["status"] == "ok"
    document = json.loads(path.read_text())
    dropped = spec.events[1]
    del document["hooks"][dropped]
    path.write_text(json.dumps(document))
    finding = doctor.check_harness(tmp_path, harness)[0]
    assert finding["status"] == "fail" and dropped in finding["message"] and finding["check"] == check
    path.write_text("{oops")
    (finding,) = doctor.check_harness(tmp_path, harness)
    assert finding["status"] == "fail" and "not valid JSON" in finding["message"]


@pytest.mark.parametrize("harness, file, content", [
    ("claude-code", ".mcp.json", {"mcpServers": {"swarm": {"command": "synapolis", "args": ["mcp"]}}}),
    ("gemini-cli", ".gemini/settings.json", {"mcpServers": {"s": {"command": "python", "args": ["-m", "synapolis", "mcp"]}}}),
    ("codex", ".codex/config.toml", '[mcp_servers.synapolis]\ncommand = "/opt/bin/synapolis"\nargs = ["mcp"]\n'),
])
def test_mcp_entries_are_found_in_the_file_each_harness_reads(tmp_path, home, harness, file, content):
    hook_install.install(harness, tmp_path)
    assert statuses({"findings": doctor.check_harness(tmp_path, harness)}, f"harness:{harness}")[-1] == "warn"
    path = tmp_path / file
    if isinstance(content, dict):
        existing = json.loads(path.read_text()) if path.exists() else {}
        existing.update(content)
        path.write_text(json.dumps(existing))
    else:
        path.write_text(content)
    (mcp,) = [f for f in doctor.check_harness(tmp_path, harness) if "MCP" in f["message"]]
    assert mcp["status"] == "ok"


def test_mcp_entries_in_the_wrong_file_do_not_count(tmp_path, home):
    hook_install.install("claude-code", tmp_path)
    settings = tmp_path / ".claude" / "settings.json"
    document = json.loads(settings.read_text())
    document["mcpServers"] = {"synapolis": {"command": "synapolis", "args": ["mcp"]}}  # Claude Code reads .mcp.json
    settings.write_text(json.dumps(document))
    assert doctor.check_harness(tmp_path, "claude-code")[-1]["status"] == "warn"


def test_codex_feature_switch_that_turns_hooks_off_fails(tmp_path, home):
    hook_install.install("codex", tmp_path)
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text("[features]\nhooks = false\n")
    findings = doctor.check_harness(tmp_path, "codex")
    assert any(f["status"] == "fail" and "features" in f["message"] for f in findings)


# -- Gemini CLI: the switch, the disabled list, trusted folders ----------------------------------------------

GEMINI_SCHEMA = Path(__file__).parent / "schemas" / "gemini-cli-settings.schema.json"


def gemini_schema_errors(document) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(GEMINI_SCHEMA.read_text()))
    return [e.message for e in validator.iter_errors(document)]


def fails(findings, *words) -> bool:
    return any(f["status"] == "fail" and all(w in f["message"] for w in words) for f in findings)


def test_gemini_hooks_really_off_fail_and_the_fix_writes_the_valid_key(tmp_path, home):
    trust_project(home, tmp_path)
    hook_install.install("gemini-cli", tmp_path)
    settings = tmp_path / ".gemini" / "settings.json"
    assert not fails(doctor.check_harness(tmp_path, "gemini-cli"), "hooksConfig")
    document = json.loads(settings.read_text())
    document["hooksConfig"] = {"enabled": False}
    settings.write_text(json.dumps(document))
    (finding,) = [f for f in doctor.check_harness(tmp_path, "gemini-cli") if "hooksConfig.enabled" in f["message"]]
    assert finding["status"] == "fail" and str(settings) in finding["message"]
    # the fix, applied as written, is a settings file Gemini's own schema accepts, and doctor is content
    fix = finding["fix"]
    document.update(json.loads("{" + fix[fix.index('"hooksConfig"'):fix.rindex("}") + 1] + "}"))
    settings.write_text(json.dumps(document))
    assert gemini_schema_errors(document) == []
    assert not fails(doctor.check_harness(tmp_path, "gemini-cli"), "hooksConfig")
    # switched off in the user's own settings: workspace silence does not turn them back on
    (home / ".gemini" / "settings.json").write_text(json.dumps({"hooksConfig": {"enabled": False}}))
    document.pop("hooksConfig")
    settings.write_text(json.dumps(document))
    assert fails(doctor.check_harness(tmp_path, "gemini-cli"), str(home / ".gemini" / "settings.json"))


def test_the_removed_gemini_key_is_a_warning_and_switches_nothing(tmp_path, home):
    trust_project(home, tmp_path)
    hook_install.install("gemini-cli", tmp_path)
    settings = tmp_path / ".gemini" / "settings.json"
    document = {**json.loads(settings.read_text()), "tools": {"enableHooks": False}}
    settings.write_text(json.dumps(document))
    assert gemini_schema_errors(document)  # Gemini's schema rejects the old key...
    findings = doctor.check_harness(tmp_path, "gemini-cli")
    (legacy,) = [f for f in findings if "enableHooks" in f["message"]]
    assert legacy["status"] == "warn" and "hooksConfig" in legacy["fix"]
    assert not fails(findings, "hooksConfig.enabled")  # ...and it turns nothing off


def test_gemini_disabled_list_naming_our_hook_fails(tmp_path, home):
    trust_project(home, tmp_path)
    hook_install.install("gemini-cli", tmp_path)
    settings = tmp_path / ".gemini" / "settings.json"
    # the name install gives our hook entries in Gemini's settings (the name its disabled list matches)
    document = {**json.loads(settings.read_text()), "hooksConfig": {"disabled": [hook_install.HOOK_NAME]}}
    settings.write_text(json.dumps(document))
    assert gemini_schema_errors(document) == []
    assert fails(doctor.check_harness(tmp_path, "gemini-cli"), "hooksConfig.disabled", hook_install.HOOK_NAME)


@pytest.mark.parametrize("rules, status", [
    ({}, "warn"),                                   # never asked yet: Gemini ignores the workspace until trusted
    ({"{project}": "DO_NOT_TRUST"}, "fail"),
    ({"{project}/sub": "TRUST_FOLDER", "{project}": "DO_NOT_TRUST"}, "fail"),  # the longest rule that matches
    ({"{project}/x": "TRUST_PARENT"}, "ok"),        # the parent of x is the project
    ({"{parent}": "TRUST_FOLDER"}, "ok"),
])
def test_gemini_trusted_folders_decide_as_gemini_does(tmp_path, home, rules, status):
    project = tmp_path / "project"
    project.mkdir()
    hook_install.install("gemini-cli", project)
    (home / ".gemini").mkdir()
    spelled = {k.format(project=project, parent=tmp_path): v for k, v in rules.items()}
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps(spelled))
    findings = [f for f in doctor.check_harness(project, "gemini-cli") if f.get("topic") == "gemini_folder_trust"]
    assert [f["status"] for f in findings] == [status]


# -- Codex: project trust and per-hook trust -------------------------------------------------------------

def codex_findings(project, env=None):
    return [f for f in doctor.check_harness(project, "codex", env) if "mcp" not in f["message"].lower()]


def test_codex_hooks_untrusted_then_trusted_then_changed_since_trusted(tmp_path, home):
    project = tmp_path / "project"
    project.mkdir()
    trust_project(home, project)
    installed = hook_install.install("codex", project)
    assert any("trust" in n and "--trust" in n for n in installed["notes"])  # the step left, and how
    assert not (home / ".codex" / "config.toml").read_text().count("trusted_hash")  # never without asking
    assert fails(codex_findings(project), "never trusted")
    trusted = hook_install.install("codex", project, trust=True)
    assert len(trusted["trusted"]) == 5 and trusted["notes"] == []
    assert [f["status"] for f in codex_findings(project)][-1] == "ok" and not fails(codex_findings(project))
    # an edit to one entry (a longer timeout) changes its hash: Codex skips it until trusted again
    hooks_file = project / ".codex" / "hooks.json"
    document = json.loads(hooks_file.read_text())
    document["hooks"]["Stop"][0]["hooks"][0]["timeout"] = 30
    hooks_file.write_text(json.dumps(document))
    assert fails(codex_findings(project), "Stop", "changed since")
    assert not fails(codex_findings(project), "PostToolUse")


def test_codex_untrusted_project_fails_even_with_trusted_hooks(tmp_path, home):
    project = tmp_path / "project"
    project.mkdir()
    hook_install.install("codex", project, trust=True)
    assert fails(codex_findings(project), "not a trusted project")
    with open(home / ".codex" / "config.toml", "a") as handle:
        handle.write(f'\n[projects.{json.dumps(str(project))}]\ntrust_level = "untrusted"\n')
    assert fails(codex_findings(project), "marked untrusted")


def test_codex_trust_is_read_from_codex_home(tmp_path, home):
    project = tmp_path / "project"
    project.mkdir()
    elsewhere = tmp_path / "codex-home"
    elsewhere.mkdir()
    env = {**os.environ, "CODEX_HOME": str(elsewhere)}
    trust_project(home, project)  # ~/.codex says trusted, but Codex reads $CODEX_HOME
    hook_install.install("codex", project, trust=True)
    assert fails(codex_findings(project, env), "not a trusted project")
    (elsewhere / "config.toml").write_text(f'[projects.{json.dumps(str(project))}]\ntrust_level = "trusted"\n')
    assert fails(codex_findings(project, env), "never trusted")
    hook_install.install("codex", project, trust=True, env=env)
    assert not fails(codex_findings(project, env))
    env["CODEX_HOME"] = str(tmp_path / "missing")
    assert fails(codex_findings(project, env), "not a directory")


def test_a_codex_config_that_is_not_toml_is_a_finding(tmp_path, home):
    hook_install.install("codex", tmp_path)
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text("[projects\nbroken = ")
    assert fails(codex_findings(tmp_path), "not valid TOML")


# -- the program the hooks run --------------------------------------------------------------------------------

def test_the_installed_command_runs(tmp_path, home):
    hook_install.install("claude-code", tmp_path)
    (finding,) = [f for f in doctor.check_harness(tmp_path, "claude-code") if "the hooks run" in f["message"]]
    assert finding["status"] == "ok" and "synapolis, version" in finding["message"]


def _with_command(project, command):
    settings = project / ".claude" / "settings.json"
    document = json.loads(settings.read_text())
    for groups in document["hooks"].values():
        groups[-1]["hooks"][0]["command"] = command
    settings.write_text(json.dumps(document))


def test_hooks_whose_program_is_missing_or_wrong_fail(tmp_path, home):
    hook_install.install("claude-code", tmp_path)
    _with_command(tmp_path, "synapolis hook claude-code")
    empty = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    findings = doctor.check_harness(tmp_path, "claude-code", empty)
    assert fails(findings, "is not on PATH") and "hooks install claude-code" in findings[1]["fix"]
    _with_command(tmp_path, "'/nonexistent/my bin/synapolis' hook claude-code")
    assert fails(doctor.check_harness(tmp_path, "claude-code"), "does not exist")
    impostor = tmp_path / "bin" / "synapolis"
    impostor.parent.mkdir()
    impostor.write_text("#!/bin/sh\necho 'command not found: python3' >&2\nexit 127\n")
    impostor.chmod(0o755)
    _with_command(tmp_path, f"{impostor} hook claude-code")
    assert fails(doctor.check_harness(tmp_path, "claude-code"), "does not run synapolis", "command not found")


def test_a_bare_name_not_on_path_fails_in_the_whole_report(tmp_path, state_dir, bin_dir, home):
    project = tmp_path / "project"
    project.mkdir()
    good_setup(state_dir, project)
    settings = project / ".claude" / "settings.json"
    document = json.loads(settings.read_text())
    for groups in document["hooks"].values():
        groups[-1]["hooks"][0]["command"] = "synapolis hook claude-code"
    settings.write_text(json.dumps(document))
    fake_crontab(bin_dir, f"7 * * * * /opt/synapolis/scripts/synapolis-watchdog {state_dir}")
    env = clean_env()
    env.update(PATH=f"{bin_dir}{os.pathsep}/usr/bin:/bin", HOME=str(home))
    done = subprocess.run(synapolis_cmd(state_dir, "doctor", "--project-dir", project, "--json"), capture_output=True,
                          text=True, env=env, timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and fails(report["findings"], "is not on PATH")


@pytest.mark.parametrize("harness", sorted(hook_install.HARNESSES))
def test_the_suggested_mcp_entry_names_this_synapolis_and_is_recognised(tmp_path, home, harness):
    hook_install.install(harness, tmp_path)
    (missing,) = [f for f in doctor.check_harness(tmp_path, harness) if "synapolis mcp" in f["message"]]
    snippet = missing["fix"].split(": ", 1)[1]
    assert hook_install.program_command()[0] in snippet
    target = tmp_path / doctor.MCP_FILES[harness]
    if harness == "codex":
        target.write_text(snippet + "\n")
    else:
        existing = json.loads(target.read_text()) if target.exists() else {}
        target.write_text(json.dumps({**existing, **json.loads(snippet)}))
    (found,) = [f for f in doctor.check_harness(tmp_path, harness) if "MCP server" in f["message"]]
    assert found["status"] == "ok"


def test_no_crontab_on_the_machine_is_a_warning_and_exit_0(tmp_path, state_dir, bin_dir, home):
    """A laptop or container without cron: doctor says how to schedule the watchdog, and the set-up passes."""
    project = tmp_path / "project"
    project.mkdir()
    good_setup(state_dir, project)
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}", HOME=str(home))
    done = subprocess.run(synapolis_cmd(state_dir, "doctor", "--project-dir", project), capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARN  cron" in done.stdout and "no `crontab`" in done.stdout and "0 problem(s), 1 warning(s)" in done.stdout
