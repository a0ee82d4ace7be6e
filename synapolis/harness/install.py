"""Wiring harnesses up: synapolis's hook entries merged into each harness's project settings file and out."""

from __future__ import annotations

import copy
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write_json
from ..errors import UsageError
from .settings import load_settings  # noqa: F401 - install's readers and callers use it from here


@dataclass(frozen=True)
class HarnessSpec:
    """Where a harness reads its project hooks, which events synapolis listens to, and its dialect."""

    name: str
    settings_path: str          # relative to the project directory
    events: tuple               # events synapolis installs, in the order they fire
    timeout: int                # in the harness's own unit
    timeout_unit: str           # "s" or "ms", for people reading the docs


# Timeouts: the hook bounds itself well below these (see hooks.HOOK_DEADLINE_S); the harness's own
# limit is the backstop. Claude Code and Codex count seconds, Gemini CLI milliseconds.
HARNESSES: dict[str, HarnessSpec] = {
    "claude-code": HarnessSpec("claude-code", ".claude/settings.json",
                               ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop",
                                "SessionEnd"), 10, "s"),
    "gemini-cli": HarnessSpec("gemini-cli", ".gemini/settings.json",
                              ("SessionStart", "BeforeAgent", "BeforeTool", "AfterTool", "AfterAgent",
                               "SessionEnd"), 10000, "ms"),
    "codex": HarnessSpec("codex", ".codex/hooks.json",
                         ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"), 10, "s"),
}

HOOK_NAME = "synapolis"


def harness_spec(harness: str) -> HarnessSpec:
    try:
        return HARNESSES[harness]
    except KeyError:
        raise UsageError(f"unknown harness {harness!r}: use one of {', '.join(HARNESSES)}") from None


def program_command() -> list[str]:
    """The command that runs this synapolis from anywhere: the absolute path of the running interpreter's
    console script (a virtualenv's bin need not be on the harness's PATH), else that interpreter with -m."""
    import sysconfig

    name = "synapolis.exe" if os.name == "nt" else "synapolis"
    folders = [os.path.dirname(os.path.abspath(sys.executable))]
    for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user"):
        try:
            folders.append(sysconfig.get_path("scripts", scheme))
        except KeyError:
            continue
    for folder in folders:
        script = os.path.join(folder, name)
        if os.path.isfile(script) and os.access(script, os.X_OK):
            return [script]
    return [os.path.abspath(sys.executable), "-m", "synapolis"]


# -- where the entries go: --scope (docs/HOOKS.md, "Scopes: what is committed, what is this machine's") --------
SCOPES = ("project", "local", "user")
PORTABLE_PROGRAM = ["synapolis"]  # what a committed file runs: found on each teammate's PATH, no machine's path


def user_settings_file(harness: str, env=None) -> Path:
    """The harness's user-level file: ~/.claude/settings.json ($CLAUDE_CONFIG_DIR), ~/.gemini/settings.json
    ($GEMINI_CLI_HOME), $CODEX_HOME/hooks.json (~/.codex)."""
    from . import settings as hs

    env = os.environ if env is None else env
    harness_spec(harness)
    if harness == "gemini-cli":
        return hs.gemini_home(env) / "settings.json"
    if harness == "codex":
        return hs.codex_home(env) / "hooks.json"
    folder = env.get("CLAUDE_CONFIG_DIR")
    return (Path(folder).expanduser() if folder else Path(env.get("HOME") or Path.home()) / ".claude") / "settings.json"


def scoped_settings_file(project_dir: Path | str, harness: str, scope: str = "project", env=None) -> Path:
    """The file `hooks install --scope SCOPE` writes: `project` the committed project file; `local` this machine's
    file for the project (Claude Code's .claude/settings.local.json; Gemini CLI and Codex keep none, so their
    user-level file); `user` the user-level file."""
    if scope not in SCOPES:
        raise UsageError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if scope == "project":
        return settings_file(project_dir, harness)
    if scope == "local" and harness == "claude-code":
        return Path(project_dir) / ".claude" / "settings.local.json"
    return user_settings_file(harness, env)


def hook_files(project_dir: Path | str, harness: str, env=None) -> list[tuple[str, Path]]:
    """Every file HARNESS reads hooks from for this project, each once, as (scope, path): doctor looks in all."""
    found: list[tuple[str, Path]] = []
    for scope in SCOPES:
        path = scoped_settings_file(project_dir, harness, scope, env)
        if all(path != p for _s, p in found):
            found.append((scope, path))
    return found


def scope_program(scope: str) -> list[str]:
    """The program words a scope's entries run: the committed project file the bare `synapolis` (portable); a
    file of this machine the absolute path of this synapolis (a virtualenv need not be on the harness's PATH)."""
    return list(PORTABLE_PROGRAM) if scope == "project" else program_command()


def hook_command(harness: str, program: list[str] | None = None) -> str:
    """`<program> hook HARNESS` (default: this synapolis by its absolute path), quoted for the harness's shell."""
    return shlex.join([*(program or program_command()), "hook", harness])


def with_this_program(command: str, harness: str, program: list[str] | None = None) -> str:
    """`command` (one of ours) running `program` (default: this synapolis): its program words replaced, its
    options kept."""
    program = program or program_command()
    try:
        words = shlex.split(command)
    except ValueError:
        return hook_command(harness, program)
    end = next((i + 1 for i, w in enumerate(words) if _is_program(w)), None)
    return shlex.join([*program, *words[end:]]) if end else hook_command(harness, program)


def _is_program(word: str) -> bool:
    return re.split(r"[\\/]", word)[-1] in ("synapolis", "synapolis.exe")


def is_our_command(command, harness: str | None = None) -> bool:
    """True for a hook command that runs `synapolis [--state-dir DIR] hook HARNESS` (any path to synapolis,
    `python -m synapolis` too; any harness if None)."""
    if not isinstance(command, str):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    for at, word in enumerate(words):
        if not _is_program(word):
            continue
        rest = words[at + 1:]
        if rest[:1] == ["--state-dir"]:
            rest = rest[2:]
        elif rest[:1] and rest[0].startswith("--state-dir="):
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "hook" and (rest[1] == harness or (
                harness is None and (rest[1] in HARNESSES or rest[1] in ("copilot", "opencode")))):
            return True
    return False


def _entry(spec: HarnessSpec, command: str) -> dict:
    entry = {"type": "command", "command": command, "timeout": spec.timeout}
    if spec.name == "gemini-cli":
        # Gemini names hooks for `/hooks enable|disable` and de-duplicates on name + command.
        entry = {"name": HOOK_NAME, **entry, "description": "synapolis heartbeat and signal delivery"}
    return entry


def _pretool_event(harness: str) -> str:
    from .conversation import PRETOOL_EVENTS

    return PRETOOL_EVENTS[harness]


def _pretool_matcher(harness: str) -> str:
    from .pretool import MATCHERS

    return MATCHERS[harness]


def settings_file(project_dir: Path | str, harness: str) -> Path:
    return Path(project_dir) / harness_spec(harness).settings_path


def existing_project(project_dir: Path | str) -> Path:
    """`project_dir`, which must be a folder that exists: UsageError (exit 2) otherwise, so a mistyped
    --project-dir is said at once instead of a settings tree made (or searched) where no project is."""
    folder = Path(project_dir)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"project directory {folder} {what}: --project-dir names the project's folder")
    return folder


def _hooks_table(document: dict, path: Path) -> dict:
    hooks = document.get("hooks")
    if hooks is None:
        return {}
    if not isinstance(hooks, dict):
        raise UsageError(f"{path}: \"hooks\" is not an object; fix it by hand, the file was left untouched")
    return hooks


def installed_events(document: dict, harness: str) -> list[str]:
    """The events whose groups already run `synapolis hook HARNESS`."""
    hooks = document.get("hooks") if isinstance(document, dict) else None
    if not isinstance(hooks, dict):
        return []
    found = []
    for event, groups in hooks.items():
        if not isinstance(groups, list):
            continue
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list) and any(
                    isinstance(h, dict) and is_our_command(h.get("command"), harness) for h in group["hooks"]):
                found.append(event)
                break
    return found


def merge_install(document: dict, harness: str, path: Path = Path("settings.json"),
                  command: str | None = None, program: list[str] | None = None) -> tuple[dict, list[str], list[str]]:
    """A copy of `document` with our entry in every event that lacks it, and `program` (default: this synapolis)
    as the program of every entry of ours (its options, such as --state-dir, kept); the events added, those whose
    command changed."""
    spec = harness_spec(harness)
    command = command or hook_command(harness, program)
    result = copy.deepcopy(document)
    hooks = _hooks_table(result, path)
    present = set(installed_events(result, harness))
    added, updated = [], []
    for event in present:
        for group in hooks[event]:
            for entry in group.get("hooks", []) if isinstance(group, dict) and isinstance(group.get("hooks"), list) else []:
                if not (isinstance(entry, dict) and is_our_command(entry.get("command"), harness)):
                    continue
                current = with_this_program(entry["command"], harness, program)
                if current != entry["command"]:
                    entry["command"] = current
                    if event not in updated:
                        updated.append(event)
    for event in spec.events:
        if event in present:
            continue
        groups = hooks.get(event)
        if groups is None:
            groups = []
        elif not isinstance(groups, list):
            raise UsageError(f"{path}: hooks.{event} is not a list; fix it by hand, the file was left untouched")
        # No matcher: every tool, every start source; but the pre-tool guard only for the tools that
        # write files (harness.pretool), so no other tool call starts a process for it.
        group = {"hooks": [_entry(spec, command)]}
        if event == _pretool_event(harness):
            group = {"matcher": _pretool_matcher(harness), **group}
        groups.append(group)
        hooks[event] = groups
        added.append(event)
    if added:
        result["hooks"] = hooks
    return result, added, updated


def merge_uninstall(document: dict, harness: str, path: Path = Path("settings.json")) -> tuple[dict, list[str]]:
    """A copy of `document` without our entries (only ours), and the events they were removed from."""
    result = copy.deepcopy(document)
    hooks = _hooks_table(result, path)
    removed = []
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept_groups = []
        touched = False
        for group in groups:
            inner = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(inner, list):
                kept_groups.append(group)
                continue
            kept = [h for h in inner if not (isinstance(h, dict) and is_our_command(h.get("command"), harness))]
            if len(kept) == len(inner):
                kept_groups.append(group)
                continue
            touched = True
            if kept:
                kept_groups.append({**group, "hooks": kept})
        if touched:
            removed.append(event)
            if kept_groups:
                hooks[event] = kept_groups
            else:
                del hooks[event]
    if removed and not hooks and "hooks" in result:
        # we emptied it; an empty table the user wrote themselves is left alone
        del result["hooks"]
    return result, removed


def legacy_gemini_switch(document: dict) -> bool:
    """True when Gemini CLI settings still carry `tools.enableHooks`, a key its schema no longer has."""
    tools = document.get("tools") if isinstance(document, dict) else None
    return isinstance(tools, dict) and "enableHooks" in tools


def _write(path: Path, document: dict) -> None:
    try:
        atomic_write_json(path, document)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def install(harness: str, project_dir: Path | str = ".", *, trust: bool = False, env=None,
            scope: str = "project") -> dict:
    """Merge synapolis's hook entries into HARNESS's settings file of `scope` (idempotent): `project` (the default,
    the committed file, running the portable `synapolis`), `local` or `user` (this machine's, running this
    synapolis by its absolute path); see scoped_settings_file.

    `trust` (Codex only, the user's explicit request) also records the entries as trusted in Codex's
    user config. `notes` say what is left to do before the harness really runs the hooks.
    """
    if harness == "opencode":  # a plugin file of ours (harness.opencode)
        from . import opencode

        if trust:
            raise UsageError("--trust is for codex: opencode keeps no per-hook trust")
        done = opencode.install(existing_project(project_dir), program_command())
        return {"harness": harness, "command": hook_command(harness), **done}
    if harness == "copilot":  # a file of its own format (harness.copilot)
        from . import copilot

        if trust:
            raise UsageError("--trust is for codex: Copilot CLI keeps no per-hook trust")
        done = copilot.install(existing_project(project_dir), hook_command(harness),
                               lambda c: is_our_command(c, harness))
        return {"harness": harness, "command": hook_command(harness), **done}
    spec = harness_spec(harness)
    if trust and harness != "codex":
        raise UsageError("--trust is for codex: Claude Code and Gemini CLI keep no per-hook trust")
    path = scoped_settings_file(existing_project(project_dir), harness, scope, env)
    program = scope_program(scope)
    document = load_settings(path)
    merged, added, updated = merge_install(document, harness, path, program=program)
    if added or updated:
        _write(path, merged)
    result = {"harness": harness, "scope": scope, "settings_file": str(path.absolute()),
              "command": hook_command(harness, program), "events": list(spec.events), "added": added,
              "updated": updated, "changed": bool(added or updated), "notes": [], "trusted": []}
    if harness == "gemini-cli":
        result["notes"] = _gemini_notes(Path(project_dir), merged, env)
    elif harness == "codex":
        result["trusted"], result["notes"] = _codex_trust(Path(project_dir), path, merged, trust, env)
    result["notes"] += _scope_notes(harness, project_dir, scope, path, env)
    return result


def _scope_notes(harness: str, project_dir, scope: str, path: Path, env) -> list[str]:
    """What a scope leaves to the user: the portable command must be on PATH; a second file doubles the hooks."""
    import shutil

    env = os.environ if env is None else env
    notes = []
    if scope == "project" and shutil.which(PORTABLE_PROGRAM[0], path=env.get("PATH")) is None:
        notes.append(f"{path.name} runs `synapolis` from the harness's PATH (portable, safe to commit), but it is not "
                     f"on this PATH: put synapolis on PATH, or install this machine's path where it is not committed: "
                     f"synapolis hooks install {harness} --scope local")
    if scope == "local" and harness == "claude-code":
        notes.append(f"{path} is this machine's (Claude Code's personal settings): keep it out of git")
    others = [p for s, p in hook_files(project_dir, harness, env)
              if p != path and p.exists() and installed_events(_settings_or_empty(p), harness)]
    if others:
        notes.append(f"{', '.join(map(str, others))} also run(s) synapolis hooks: the harness reads every file, "
                     "so each event would run the hook more than once; keep one "
                     f"(synapolis hooks uninstall {harness} --scope ...)")
    return notes


def _settings_or_empty(path: Path) -> dict:
    try:
        return load_settings(path)
    except UsageError:
        return {}


def _gemini_notes(project: Path, document: dict, env) -> list[str]:
    from . import settings as hs

    notes = []
    if legacy_gemini_switch(document):
        notes.append("tools.enableHooks is not a Gemini CLI setting any more (its schema rejects it): "
                     "remove it; the switch is \"hooksConfig\": {\"enabled\": true}")
    enabled, decided_by = hs.gemini_hooks_switch(project, env)
    if not enabled:
        notes.append(f"hooksConfig.enabled is false in {decided_by}: Gemini CLI runs no hook until it is true")
    trusted, how = hs.gemini_folder_trust(project, env)
    if trusted is False:
        notes.append(f"{project.absolute()} is marked untrusted ({how}): Gemini CLI ignores its .gemini/settings.json "
                     "and so these hooks; trust the folder (/permissions in gemini) to use them")
    elif trusted is None:
        notes.append(f"Gemini CLI runs project hooks only in a trusted folder: when gemini asks on its first start "
                     f"in {project.absolute()}, trust the folder (or later with /permissions)")
    return notes


def _codex_trust(project: Path, path: Path, document: dict, trust: bool, env) -> tuple[list[str], list[str]]:
    """(keys trusted now, notes): Codex runs a project hook only in a trusted project, once its hash is trusted."""
    from . import settings as hs

    config_path = hs.codex_home(env) / "config.toml"
    config = hs.load_toml(config_path)
    ours = hs.codex_hooks(path, document, lambda command: is_our_command(command, "codex"))
    trusted = hs.trust_codex_hooks(config_path, ours) if trust else []
    if trusted:
        config = hs.load_toml(config_path)
    notes = []
    level, key = hs.codex_project_trust(project, config)
    if level != "trusted":
        notes.append(f"Codex reads .codex/ only in a trusted project: start codex in {project.absolute()} and "
                     f"trust it when asked (it records [projects.\"{key}\"] trust_level = \"trusted\" in {config_path})")
    states = hs.codex_hook_states(config)
    waiting = [h["event"] for h in ours if hs.codex_trust_status(h, states) != "trusted"]
    if waiting:
        notes.append(f"Codex runs each project hook only after you trust it, and these are not trusted yet "
                     f"({', '.join(waiting)}): start codex in the project and choose \"Trust all and continue\" "
                     f"when it says hooks need review (or /hooks), or run: synapolis hooks install codex --trust "
                     f"--project-dir {shlex.quote(str(project.absolute()))}")
    return trusted, notes


def uninstall(harness: str, project_dir: Path | str = ".", *, scope: str = "project", env=None) -> dict:
    """Take synapolis's own hook entries out of HARNESS's settings file of `scope`; everything else stays.
    Copilot CLI's and opencode's files are the project's own (--scope does not apply)."""
    if harness == "opencode":
        from . import opencode

        return {"harness": harness, **opencode.uninstall(project_dir)}
    if harness == "copilot":
        from . import copilot

        return {"harness": harness, **copilot.uninstall(project_dir, lambda c: is_our_command(c, harness))}
    harness_spec(harness)
    path = scoped_settings_file(project_dir, harness, scope, env)
    if not path.exists():  # nothing there, not even the project: nothing of ours to take out (as `rm -f`)
        return {"harness": harness, "settings_file": str(path.absolute()), "removed": [], "changed": False}
    document = load_settings(path)
    cleaned, removed = merge_uninstall(document, harness, path)
    if removed:
        _write(path, cleaned)
    return {"harness": harness, "settings_file": str(path.absolute()), "removed": removed, "changed": bool(removed)}
