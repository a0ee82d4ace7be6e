"""Wiring harnesses up: merging synapolis's hook entries into each harness's project settings file and out again."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_write_json
from .errors import UsageError


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
                               ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd"), 10, "s"),
    "gemini-cli": HarnessSpec("gemini-cli", ".gemini/settings.json",
                              ("SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd"), 10000, "ms"),
    "codex": HarnessSpec("codex", ".codex/hooks.json",
                         ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"), 10, "s"),
}

HOOK_NAME = "synapolis"


def harness_spec(harness: str) -> HarnessSpec:
    try:
        return HARNESSES[harness]
    except KeyError:
        raise UsageError(f"unknown harness {harness!r}: use one of {', '.join(HARNESSES)}") from None


def hook_command(harness: str) -> str:
    # A bare name on PATH keeps a team-shared settings file portable between machines; `doctor`
    # checks that `synapolis` really resolves.
    return f"synapolis hook {harness}"


def is_our_command(command, harness: str | None = None) -> bool:
    """True for a hook command that runs `synapolis hook HARNESS` (any path to synapolis, any harness if None)."""
    if not isinstance(command, str):
        return False
    which = re.escape(harness) if harness else r"[A-Za-z0-9_-]+"
    return re.search(rf"(^|[\s/\\\"'])synapolis(\.exe)?[\"']?\s+(--state-dir\s+\S+\s+)?hook\s+{which}(\s|$)",
                     command) is not None


def _entry(spec: HarnessSpec) -> dict:
    entry = {"type": "command", "command": hook_command(spec.name), "timeout": spec.timeout}
    if spec.name == "gemini-cli":
        # Gemini names hooks for `/hooks enable|disable` and de-duplicates on name + command.
        entry = {"name": HOOK_NAME, **entry, "description": "synapolis heartbeat and signal delivery"}
    return entry


def settings_file(project_dir: Path | str, harness: str) -> Path:
    return Path(project_dir) / harness_spec(harness).settings_path


def load_settings(path: Path) -> dict:
    """The settings document at `path` ({} when missing); UsageError (exit 2) when it is not a JSON object."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a settings file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if not raw.strip():
        return {}
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # Recursion: nested too deeply
        raise UsageError(f"{path} is not valid JSON ({exc}); fix it by hand, it was left untouched") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path} holds a JSON {type(document).__name__}, not an object; it was left untouched")
    return document


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


def merge_install(document: dict, harness: str, path: Path = Path("settings.json")) -> tuple[dict, list[str]]:
    """A copy of `document` with our entry in every event that lacks it, and the events added."""
    spec = harness_spec(harness)
    result = copy.deepcopy(document)
    hooks = _hooks_table(result, path)
    present = set(installed_events(result, harness))
    added = []
    for event in spec.events:
        if event in present:
            continue
        groups = hooks.get(event)
        if groups is None:
            groups = []
        elif not isinstance(groups, list):
            raise UsageError(f"{path}: hooks.{event} is not a list; fix it by hand, the file was left untouched")
        # No matcher: every tool, every start source.
        groups.append({"hooks": [_entry(spec)]})
        hooks[event] = groups
        added.append(event)
    if added:
        result["hooks"] = hooks
    return result, added


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


def hooks_disabled(document: dict, harness: str) -> bool:
    """True when the settings turn every hook off (Gemini CLI's `tools.enableHooks: false`)."""
    return harness == "gemini-cli" and isinstance(document.get("tools"), dict) \
        and document["tools"].get("enableHooks") is False


def _write(path: Path, document: dict) -> None:
    try:
        atomic_write_json(path, document)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def install(harness: str, project_dir: Path | str = ".") -> dict:
    """Merge synapolis's hook entries into HARNESS's project settings file (idempotent)."""
    spec = harness_spec(harness)
    path = settings_file(project_dir, harness)
    document = load_settings(path)
    merged, added = merge_install(document, harness, path)
    if added:
        _write(path, merged)
    notes = []
    if hooks_disabled(merged, harness):
        notes.append("tools.enableHooks is false in this file: Gemini CLI will not run any hook until it is true")
    return {"harness": harness, "settings_file": str(path.absolute()), "command": hook_command(harness),
            "events": list(spec.events), "added": added, "changed": bool(added), "notes": notes}


def uninstall(harness: str, project_dir: Path | str = ".") -> dict:
    """Take synapolis's own hook entries out of HARNESS's project settings file; everything else stays."""
    harness_spec(harness)
    path = settings_file(project_dir, harness)
    if not path.exists():
        return {"harness": harness, "settings_file": str(path.absolute()), "removed": [], "changed": False}
    document = load_settings(path)
    cleaned, removed = merge_uninstall(document, harness, path)
    if removed:
        _write(path, cleaned)
    return {"harness": harness, "settings_file": str(path.absolute()), "removed": removed, "changed": bool(removed)}
