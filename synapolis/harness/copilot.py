"""GitHub Copilot CLI (contract §16): its hook file `.github/hooks/synapolis.json` (version 1), its two payload
forms, and its answer shape.

Copilot documents two payload forms, chosen by how an event is named in the hook file: camelCase names
(`sessionStart`) send camelCase fields (`sessionId`, `toolName`, a timestamp in milliseconds) and no event
name; PascalCase names (`SessionStart`) send the VS Code form, snake_case fields with `hook_event_name`.
Both become the one event hooks.handle acts on. Copilot processes no output of sessionStart,
userPromptSubmitted or postToolUse (its reference: "Output processed: No"; postToolUse's only for SDK
hooks), so signals reach the model where it does read an answer: at `agentStop`, whose `decision: block`
with a `reason` starts another turn with that reason as its prompt. The installed file names the event
in each command's `env` (SYNAPOLIS_HOOK_EVENT), since the camelCase payload does not carry it.
"""

from __future__ import annotations

import json
import os

EVENT_ENV = "SYNAPOLIS_HOOK_EVENT"
HOOK_FILE = ".github/hooks/synapolis.json"
TIMEOUT_S = 10
# the event names we install (camelCase: Copilot's own form), in the order they fire, and the PascalCase
# name of each (the VS Code form; what hooks.EVENT_KINDS["copilot"] keys on)
EVENTS = {"sessionStart": "SessionStart", "userPromptSubmitted": "UserPromptSubmit", "preToolUse": "PreToolUse",
          "postToolUse": "PostToolUse", "agentStop": "Stop", "sessionEnd": "SessionEnd"}
_FIELDS = {"sessionId": "session_id", "toolName": "tool_name", "toolArgs": "tool_input",
           "toolResult": "tool_result", "transcriptPath": "transcript_path", "initialPrompt": "initial_prompt"}


def normalize(raw, env) -> bytes | str:
    """A camelCase payload as the VS Code form (session_id, hook_event_name from SYNAPOLIS_HOOK_EVENT); a
    PascalCase one, or anything that is not a JSON object, as it came (hooks.parse_event judges it)."""
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(event, dict) or "hook_event_name" in event:
        return raw
    named = env.get(EVENT_ENV) or ""
    for camel, snake in _FIELDS.items():
        if camel in event and snake not in event:
            event[snake] = event.pop(camel)
    event["hook_event_name"] = EVENTS.get(named, named)
    return json.dumps(event)


def answer(event: str, context: str | None) -> dict:
    """Copilot's answer: at agentStop, signals to show become the next turn's prompt; else nothing."""
    if event == "Stop" and context:
        return {"decision": "block", "reason": context}
    return {}


# -- the hook file ---------------------------------------------------------------------------------

def hook_file(project_dir) -> str:
    return os.path.join(os.fspath(project_dir), HOOK_FILE)


def document(command: str) -> dict:
    return {"version": 1, "hooks": {
        event: [{"type": "command", "bash": command, "env": {EVENT_ENV: event}, "timeoutSec": TIMEOUT_S}]
        for event in EVENTS}}


def _ours(entry, command_check) -> bool:
    return isinstance(entry, dict) and command_check(entry.get("bash"))


def install(project_dir, command: str, command_check) -> dict:
    """Write `.github/hooks/synapolis.json` (a file of ours alone: Copilot reads every *.json there); our
    entries are replaced, anything else a person added to the file stays."""
    from ..atomic import atomic_write_json
    from .settings import load_settings

    path = hook_file(project_dir)
    from pathlib import Path

    current = load_settings(Path(path))
    wanted = document(command)
    merged = dict(current, version=1)
    hooks = current.get("hooks") if isinstance(current.get("hooks"), dict) else {}
    merged["hooks"] = {k: v for k, v in hooks.items()}
    for event, entries in wanted["hooks"].items():
        others = [e for e in merged["hooks"].get(event, []) if not _ours(e, command_check)] \
            if isinstance(merged["hooks"].get(event), list) else []
        merged["hooks"][event] = others + entries
    changed = merged != current
    if changed:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_json(path, merged)
    return {"settings_file": os.path.abspath(path), "events": list(EVENTS), "changed": changed,
            "added": [e for e in EVENTS if e not in hooks] if changed else [], "updated": [], "notes": [
                "Copilot's cloud agent reads .github/hooks/ from the repository's default branch: commit the file, "
                "and give that agent SYNAPOLIS_SERVER and SYNAPOLIS_TOKEN (its environment's secrets)"],
            "trusted": []}


def uninstall(project_dir, command_check) -> dict:
    from pathlib import Path

    from ..atomic import atomic_write_json
    from .settings import load_settings

    path = hook_file(project_dir)
    if not os.path.exists(path):
        return {"settings_file": os.path.abspath(path), "removed": [], "changed": False}
    current = load_settings(Path(path))
    hooks = current.get("hooks") if isinstance(current.get("hooks"), dict) else {}
    removed, kept = [], {}
    for event, entries in hooks.items():
        entries = entries if isinstance(entries, list) else []
        left = [e for e in entries if not _ours(e, command_check)]
        if len(left) != len(entries):
            removed.append(event)
        if left:
            kept[event] = left
    if removed:
        if kept or set(current) - {"version", "hooks"}:
            atomic_write_json(path, dict(current, hooks=kept))
        else:
            os.remove(path)  # nothing but ours was in it
    return {"settings_file": os.path.abspath(path), "removed": removed, "changed": bool(removed)}


def check(project, command_check) -> tuple[list[dict], dict]:
    """doctor's finding for the Copilot hook file (every event wired, version 1), and the file's commands as
    a settings document of groups (what doctor.check_hook_commands reads) so each program is also run."""
    from pathlib import Path

    from ..doctor import FAIL, OK, finding
    from ..errors import UsageError
    from .settings import load_settings

    path = Path(hook_file(project))
    fix = f"synapolis hooks install copilot --project-dir {project}"
    try:
        current = load_settings(path)
    except UsageError as exc:
        return [finding("harness:copilot", FAIL, exc.message, f"fix {path} by hand, then: {fix}")], {}
    hooks = current.get("hooks") if isinstance(current.get("hooks"), dict) else {}
    ours = {e: [x for x in hooks.get(e) if _ours(x, command_check)] if isinstance(hooks.get(e), list) else []
            for e in EVENTS}
    groups = {"hooks": {e: [{"hooks": [{"command": x["bash"]} for x in found]}] for e, found in ours.items()}}
    missing = [e for e, found in ours.items() if not found]
    if current.get("version") != 1:
        return [finding("harness:copilot", FAIL, f"{path} is not version 1, which Copilot reads", fix)], groups
    if missing:
        return [finding("harness:copilot", FAIL, f"{path} has no synapolis hook for {', '.join(missing)}", fix)], \
            groups
    return [finding("harness:copilot", OK, f"hooks for {', '.join(EVENTS)} in {path}")], groups
