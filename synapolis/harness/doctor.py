"""`synapolis doctor` outside the state directory: each harness's files, the git hook, the crontab; `run_doctor`.

The state directory's own checks are synapolis.doctor (a verb: it knows nothing of the harnesses), re-exported
here, so this module is doctor whole."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ..doctor import (FAIL, NETWORK_FS, OK, STRAY_TEMP_AGE_S, WARN, check_config_and_schemas,  # noqa: F401
                      check_local_fs, check_temp_files, check_writable, filesystem_of, finding)
from ..errors import UsageError
from ..paths import working_directory
from . import install as hook_install
from .doctor_mcp import MCP_FILES, is_stdio_server as _is_our_server  # noqa: F401 - doctor's names for them

CRONTAB_TIMEOUT_S = 5.0


# -- cron ---------------------------------------------------------------------------------------

def suggested_cron_line(root: Path) -> str:
    """The hourly line of cron/synapolis.crontab, with this checkout's wrapper and this state directory."""
    from .. import schemas

    try:
        checkout = schemas.standards_dir().parent
    except FileNotFoundError:
        checkout = None
    wrapper = checkout / "scripts" / "synapolis-watchdog" if checkout else None
    minute = "7"
    if checkout:
        try:
            template = (checkout / "cron" / "synapolis.crontab").read_text("utf-8")
            lines = [ln.split() for ln in template.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            minute = lines[0][0] if lines and lines[0] else minute
        except OSError:
            pass
    if wrapper and wrapper.is_file():
        return f"{minute} * * * * {shlex.quote(str(wrapper))} {shlex.quote(str(root))}"
    return (f"{minute} * * * * synapolis --state-dir {shlex.quote(str(root))} watchdog "
            f">> {shlex.quote(str(root / 'watchdog.log'))} 2>&1")


def _names_state_dir(line: str, root: Path) -> bool:
    expanded = os.path.expandvars(line.replace("~/", str(Path.home()) + "/"))
    return str(root) in expanded or "SYNAPOLIS_STATE_DIR" in line


def check_cron(root: Path, crontab_cmd: str = "crontab") -> list[dict]:
    line = suggested_cron_line(root)
    add = f"(crontab -l 2>/dev/null; echo {shlex.quote(line)}) | crontab -"
    exe = shutil.which(crontab_cmd)
    # not scheduled yet is a warning (a set-up step still to do, and a laptop or container may have no cron at
    # all); a crontab that cannot be read is a failure
    if exe is None:
        return [finding("cron", WARN, "no `crontab` on this machine, so the watchdog is never run hourly",
                        f"install cron (e.g. apt-get install cron), then: {add}")]
    try:
        done = subprocess.run([exe, "-l"], capture_output=True, text=True, timeout=CRONTAB_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [finding("cron", FAIL, f"`crontab -l` failed: {exc}", f"check cron, then: {add}")]
    if done.returncode != 0:
        return [finding("cron", WARN, "no crontab for this user: the watchdog never runs", add)]
    entries = [ln.strip() for ln in done.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    ours = [ln for ln in entries if "watchdog" in ln and "synapolis" in ln]
    if not ours:
        return [finding("cron", WARN, "the crontab has no synapolis watchdog line", add)]
    if not any(_names_state_dir(ln, root) for ln in ours):
        return [finding("cron", WARN, f"a watchdog line is installed but it does not name {root}",
                        f"make sure it runs against this state directory: {line}", lines=ours)]
    return [finding("cron", OK, "the watchdog runs from cron", lines=ours)]


# -- harnesses ----------------------------------------------------------------------------------

def _mcp_snippet(harness: str) -> str:
    # the program by its absolute path, as the hooks run it: the harness's PATH may not reach a virtualenv
    program, *args = hook_install.program_command()
    args = [*args, "mcp"]
    if harness == "codex":
        # required: Codex starts its first turn without the servers it does not wait for (docs/MCP.md)
        return (f"[mcp_servers.synapolis]\ncommand = {json.dumps(program)}\nargs = {json.dumps(args)}\n"
                "required = true\nstartup_timeout_sec = 30")
    return json.dumps({"mcpServers": {"synapolis": {"command": program, "args": args}}})


def _load_toml(path: Path):
    from .settings import load_toml

    try:
        return load_toml(path)
    except UsageError as exc:
        raise ValueError(exc.message) from None


def check_harness(project: Path, harness: str, env=None) -> list[dict]:
    env = os.environ if env is None else env
    if harness in ("copilot", "opencode"):  # files of their own format; the commands checked as the others'
        from . import copilot, opencode

        found, groups = copilot.check(project, lambda c: hook_install.is_our_command(c, "copilot")) \
            if harness == "copilot" else opencode.check(project)
        install = f"synapolis hooks install {harness} --project-dir {shlex.quote(str(project))}"
        return found + check_hook_commands(groups, harness, f"harness:{harness}", install, env)
    spec = hook_install.harness_spec(harness)
    check = f"harness:{harness}"
    settings = hook_install.settings_file(project, harness)
    install = f"synapolis hooks install {harness} --project-dir {shlex.quote(str(project))}"
    results = []
    # every file the harness reads hooks from (hooks install --scope project|local|user): ours may be in any
    holding, document = [], {}
    for _scope, path in hook_install.hook_files(project, harness, env):
        try:
            found = hook_install.load_settings(path)
        except UsageError as exc:
            return [finding(check, FAIL, exc.message, f"repair {path}, then: {install}")]
        if hook_install.installed_events(found, harness):
            holding.append((path, found))
    if holding:
        settings, document = holding[0]
    elif settings.exists():
        document = hook_install.load_settings(settings)
    events = {e for _path, found in holding for e in hook_install.installed_events(found, harness)}
    missing = [e for e in spec.events if e not in events]
    if len(missing) == len(spec.events):
        # the harness is set up in this project, but maybe not for synapolis: say so, do not fail
        mcp = _check_mcp(project, harness, check, env)
        if any(f.get("mcp_entry") for f in mcp):  # agents reach synapolis through its MCP tools only
            return [finding(check, WARN, f"{settings} has no synapolis hooks: agents beat and receive signals only "
                                         "when they call synapolis's MCP tools, never between calls", install), *mcp]
        return [finding(check, WARN, f"{settings.parent} exists but {settings.name} has no synapolis hooks, so "
                                     "this harness's agents neither beat nor receive signals", install)]
    where = ", ".join(str(path) for path, _found in holding)
    if missing:
        results.append(finding(check, FAIL, f"{where} has no synapolis hook for {', '.join(missing)}", install))
    else:
        results.append(finding(check, OK, f"hooks for {', '.join(spec.events)} in {where}"))
    if len(holding) > 1:
        results.append(finding(check, WARN, f"synapolis hooks are in {len(holding)} files the harness reads ({where}): "
                                            "each event runs the hook once per file",
                               f"keep one: synapolis hooks uninstall {harness} --scope project|local|user"))
    for _path, found in holding:
        results.extend(check_hook_commands(found, harness, check, install, env))
    if harness == "gemini-cli":
        results.extend(_check_gemini(project, document, settings, check, env))
    if harness == "codex":
        results.extend(_check_codex_features(project, check, env))
        results.extend(_check_codex_trust(project, settings, document, check, install, env))
    results.extend(_check_mcp(project, harness, check, env))
    return results


# -- the command the hooks run ----------------------------------------------------------------------

COMMAND_TIMEOUT_S = 20.0


def _program_words(command: str, harness: str) -> list[str] | None:
    """The words of an installed hook command before `hook HARNESS` (the program and its options)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for at in range(len(words) - 1):
        if words[at] == "hook" and words[at + 1] == harness:
            return words[:at] or None
    return None


def check_hook_commands(document: dict, harness: str, check: str, install: str, env) -> list[dict]:
    """Each distinct command our hooks run: its program is found and answers `--version` (it really runs)."""
    commands = []
    for groups in (document.get("hooks") or {}).values():
        for group in groups if isinstance(groups, list) else []:
            for entry in (group.get("hooks") if isinstance(group, dict) else None) or []:
                command = entry.get("command") if isinstance(entry, dict) else None
                if hook_install.is_our_command(command, harness) and command not in commands:
                    commands.append(command)
    results = []
    for command in commands:
        words = _program_words(command, harness)
        if not words:
            results.append(finding(check, FAIL, f"cannot tell the program in the hook command {command!r}", install))
            continue
        results.append(_probe_program(words, check, install, env))
    return results


def _probe_program(words: list[str], check: str, install: str, env) -> dict:
    """The finding for a hook's program (`words`: it and its options): found, and answers `--version` as synapolis."""
    program = words[0]
    found = program if os.sep in program else shutil.which(program, path=env.get("PATH"))
    if found is None or not (os.path.isfile(found) and os.access(found, os.X_OK)):
        where = "does not exist or is not executable" if os.sep in program else "is not on PATH"
        return finding(check, FAIL, f"the hooks run {program}, which {where}, so every hook fails",
                       f"{install} --scope local   (this machine's absolute path of synapolis, in a file that is "
                       "not committed)" if os.sep not in program else install)
    # a state directory option is kept; only the program is asked who it is
    probe = [found, *(w for w in words[1:] if w in ("-m", "synapolis")), "--version"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return finding(check, FAIL, f"the hooks' program {found} does not run: {exc}", install)
    if done.returncode != 0 or "synapolis" not in done.stdout:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return finding(check, FAIL, f"the hooks' program {found} does not run synapolis: {tail[0][:200]}", install)
    bare = "" if os.sep in program else " (found on this PATH; the harness's PATH may differ)"
    return finding(check, OK, f"the hooks run {shlex.join(words)}: {done.stdout.strip()}{bare}")


def check_git_hook(project: Path, env=None) -> list[dict]:
    """synapolis's pre-commit guard (`hooks install git`), when it is installed for `project`'s repository:
    executable, and its program runs synapolis. Nothing when there is none (a project may not want it)."""
    from . import githook

    env = os.environ if env is None else env
    found = githook.installed(project)
    if found is None:
        return []
    install = f"synapolis hooks install git --project-dir {shlex.quote(str(project))}"
    if not found["executable"]:
        return [finding("git", FAIL, f"{found['hook']} is not executable, so git skips the claim guard",
                        f"chmod +x {shlex.quote(found['hook'])}   (or {install})")]
    try:
        words = githook.program_words(found["command"])
    except ValueError:
        words = []
    if not words:
        return [finding("git", FAIL, f"cannot tell the program {found['hook']} runs", install)]
    result = _probe_program(words, "git", install, env)
    if result["status"] == OK:
        result["message"] = f"pre-commit guard {found['hook']}: " + result["message"]
    return [result]


# -- what each harness's own settings decide --------------------------------------------------------

def _check_gemini(project: Path, document: dict, settings: Path, check: str, env) -> list[dict]:
    from . import settings as hs

    results = []
    if hook_install.legacy_gemini_switch(document):
        results.append(finding(check, WARN, f"{settings}: tools.enableHooks is not a Gemini CLI setting any more "
                                            "(its schema rejects it, and it switches nothing)",
                               "remove \"enableHooks\" from \"tools\" in that file; the switch is "
                               "\"hooksConfig\": {\"enabled\": true}"))
    enabled, decided_by = hs.gemini_hooks_switch(project, env)
    if not enabled:
        results.append(finding(check, FAIL, f"{decided_by}: hooksConfig.enabled is false, so Gemini CLI runs no hooks",
                               f"in {decided_by} set \"hooksConfig\": {{\"enabled\": true}}"))
    ours = {hook_install.HOOK_NAME} | {e.get("command") for g in (document.get("hooks") or {}).values()
                                       if isinstance(g, list) for grp in g if isinstance(grp, dict)
                                       for e in grp.get("hooks") or [] if isinstance(e, dict)}
    off = [(name, path) for name, path in hs.gemini_disabled_hooks(project, env) if name in ours]
    for name, path in off:
        results.append(finding(check, FAIL, f"{path}: hooksConfig.disabled lists {name!r}, so Gemini CLI skips "
                                            "synapolis's hooks", f"take {name!r} out of hooksConfig.disabled in {path}"))
    trusted, how = hs.gemini_folder_trust(project, env)
    if trusted is False:
        results.append(finding(check, FAIL, f"{project} is an untrusted folder for Gemini CLI ({how}): it ignores "
                                            ".gemini/settings.json there, hooks included",
                               f"trust the folder: /permissions in gemini, or set \"{project}\": \"TRUST_FOLDER\" in {how}",
                               topic="gemini_folder_trust"))
    elif trusted is None:
        results.append(finding(check, WARN, f"{project} is not in Gemini CLI's trusted folders ({how}) yet: until it "
                                            "is trusted, Gemini ignores .gemini/settings.json and runs no project hook",
                               "start gemini in the project and choose \"Trust folder\" (or /permissions later)",
                               topic="gemini_folder_trust"))
    elif enabled and not off:
        results.append(finding(check, OK, f"Gemini CLI runs project hooks here (hooks switched on; trusted: {how})",
                               topic="gemini_folder_trust"))
    return results


def _check_codex_features(project: Path, check: str, env=None) -> list[dict]:
    from .settings import codex_home

    for config in (project / ".codex" / "config.toml", codex_home(env) / "config.toml"):
        try:
            document = _load_toml(config) if config.is_file() else None
        except (OSError, ValueError):
            continue
        features = (document or {}).get("features") if isinstance(document, dict) else None
        if isinstance(features, dict) and (features.get("hooks") is False or features.get("codex_hooks") is False):
            return [finding(check, FAIL, f"{config} turns hooks off ([features] hooks = false)",
                            f"remove that line or set it to true in {config}")]
    return []


def _check_codex_trust(project: Path, settings: Path, document: dict, check: str, install: str, env) -> list[dict]:
    """Codex runs a project's hooks only in a trusted project, each once its current hash is trusted."""
    from . import settings as hs

    home = hs.codex_home(env)
    config_path = home / "config.toml"
    if env.get("CODEX_HOME") and not home.is_dir():
        return [finding(check, FAIL, f"CODEX_HOME is {home}, which is not a directory: Codex will not start",
                        f"mkdir -p {shlex.quote(str(home))} (or unset CODEX_HOME)")]
    try:
        config = hs.load_toml(config_path)
    except UsageError as exc:
        return [finding(check, FAIL, exc.message, f"repair {config_path}: Codex cannot start with it either")]
    results = []
    level, key = hs.codex_project_trust(project, config)
    if level != "trusted":
        said = "is marked untrusted" if level == "untrusted" else "is not a trusted project"
        results.append(finding(check, FAIL, f"{key} {said} in {config_path}: Codex ignores {project}/.codex there, "
                                            "hooks included",
                               f"start codex in {project} and trust the project when asked, or add "
                               f"[projects.{json.dumps(key)}] trust_level = \"trusted\" to {config_path}"))
    ours = hs.codex_hooks(settings, document, lambda command: hook_install.is_our_command(command, "codex"))
    states = hs.codex_hook_states(config)
    by_status: dict[str, list[str]] = {}
    for hook in ours:
        by_status.setdefault(hs.codex_trust_status(hook, states), []).append(hook["event"])
    trust = (f"start codex in {project} and choose \"Trust all and continue\" when it says hooks need review "
             f"(or /hooks); or, having read them: {install} --trust")
    for status, said in (("untrusted", "were never trusted"), ("modified", "changed since they were trusted")):
        if by_status.get(status):
            results.append(finding(check, FAIL, f"Codex skips the synapolis hooks for {', '.join(by_status[status])}: "
                                                f"they {said} (hooks.state in {config_path})", trust))
    if by_status.get("disabled"):
        results.append(finding(check, FAIL, f"the synapolis hooks for {', '.join(by_status['disabled'])} are disabled "
                                            f"in {config_path} (hooks.state ... enabled = false)",
                               "enable them in codex with /hooks, or remove those enabled = false lines"))
    if ours and set(by_status) == {"trusted"}:
        results.append(finding(check, OK, f"Codex trusts the {len(ours)} synapolis hook(s) as they are now"))
    return results


def _check_mcp(project: Path, harness: str, check: str, env=None) -> list[dict]:
    """The harness's synapolis MCP entries (doctor_mcp): `synapolis mcp`, or `synapolis serve` by URL and token."""
    from . import doctor_mcp

    env = os.environ if env is None else env
    results, found = doctor_mcp.check(project, harness, env)
    if results:
        return [finding(check, status, message, fix, mcp_entry=found) for status, message, fix in results]
    first = doctor_mcp.mcp_files(project, harness, env)[0]
    return [finding(check, WARN, f"no `synapolis mcp` server in {first} (hooks still deliver signals)",
                    f"add to {first}: {_mcp_snippet(harness)}")]


def _hooks_elsewhere(project: Path, harness: str, env) -> bool:
    """synapolis hooks in one of the harness's files outside the project (hooks install --scope user)."""
    for _scope, path in hook_install.hook_files(project, harness, env):
        try:
            if path.exists() and hook_install.installed_events(hook_install.load_settings(path), harness):
                return True
        except UsageError:
            continue
    return False


def check_harnesses(project: Path, env=None) -> list[dict]:
    wired = [h for h, spec in hook_install.HARNESSES.items()
             if (project / spec.settings_path).parent.is_dir() or (project / MCP_FILES[h]).is_file()
             or _hooks_elsewhere(project, h, env)]
    from . import copilot, opencode

    if os.path.exists(copilot.hook_file(project)):
        wired.append("copilot")
    if os.path.exists(opencode.plugin_file(project)):
        wired.append("opencode")
    if not wired:
        return [finding("harness", WARN, f"no harness is wired up in {project}",
                        "synapolis hooks install claude-code   (or gemini-cli, codex)")]
    results = []
    for harness in wired:
        results.extend(check_harness(project, harness, env))
    return results


# -- all of it ----------------------------------------------------------------------------------

def run_doctor(root: Path | str, project_dir: Path | str | None = None, *, mounts_file="/proc/mounts",
               crontab_cmd: str = "crontab", now: float | None = None, env=None) -> dict:
    """Every check on state directory `root`; `ok` is False when any finding failed (the CLI then exits 1).

    Takes the path, not a Workspace: opening one refuses a broken config, which is a finding here.
    """
    root = Path(root).absolute()
    project = Path(project_dir or ".")  # the harnesses' project: the working directory by default
    if not project.is_absolute():  # only then is the working directory asked for (it may have been removed)
        project = Path(working_directory("--project-dir"), project)
    findings = []
    findings += check_writable(root)
    findings += check_local_fs(root, mounts_file)
    findings += check_config_and_schemas(root)
    findings += check_temp_files(root, now)
    from ..doctor_remote import check_server, configured

    remote = configured(root, env)  # through the team server (§16): its store and watchdog are the server's
    if not remote:
        findings += check_cron(root, crontab_cmd)
    findings += check_harnesses(project, env)
    findings += check_git_hook(project, env)
    if remote:
        findings += check_server(root, env)
    else:
        from ..errors import SynapolisError
        from ..store.checks import check_store  # reachable, schema version, server clock (contract §12)
        from ..workspace import Workspace

        try:  # the store check is given the opened state directory (the store never imports the workspace)
            ws = Workspace.open(root, env=env)
        except SynapolisError:
            ws = None  # a broken config is the config check's finding
        findings += check_store(ws, env)
    counts = {s: sum(1 for f in findings if f["status"] == s) for s in (OK, WARN, FAIL)}
    return {"ok": counts[FAIL] == 0, "state_dir": str(root), "project_dir": str(project),
            "counts": counts, "findings": findings}
