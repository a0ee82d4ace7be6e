"""The pre-tool hook (contract §14): a harness's edit of a file another live agent holds is refused in that
harness's own shape, with who holds it, until when, and the command to ask them.

Claude Code `PreToolUse` (Edit, Write, MultiEdit: `tool_input.file_path`; NotebookEdit:
`tool_input.notebook_path`), Gemini CLI `BeforeTool` (write_file, replace: `tool_input.file_path`) and
Codex `PreToolUse` (apply_patch: every path of the patch, harness.patch_paths). The answer is the library
verb `guard` (synapolis.guard); this module only reads the event, asks, and words the answer.

Whatever goes wrong on our side lets the tool run: an unknown tool, a path outside the project, a broken
event, an unreachable store, a timeout (hooks.run_bounded). `guard.mode` "warn" lets it run too and adds
the reason as context where the harness takes context before a tool (Claude Code, Codex); "off" answers
nothing at all. With `guard.auto_claim`, an edit that is let through claims its files for the editor.

Most edits meet no claim at all, so before opening any store the hook asks `nothing_held` (the claims
index is empty) and then `none_could_match` (no claim in the index near these paths). docs/HOOKS.md,
"Pre-tool events", says why that never lets a held file through.
"""

from __future__ import annotations

import os

from .conversation import PRETOOL_EVENTS as EVENTS  # loaded already whenever this module is

# harness -> tool -> the keys of tool_input that name the file it writes ("patch": a Codex patch's paths)
TOOLS: dict[str, dict[str, tuple]] = {
    "claude-code": {"Edit": ("file_path",), "Write": ("file_path",), "MultiEdit": ("file_path",),
                    "NotebookEdit": ("notebook_path",)},
    "gemini-cli": {"write_file": ("file_path",), "replace": ("file_path",)},
    "codex": {"apply_patch": ("patch",)},
    # Copilot CLI: camelCase payloads name its tools as the model sees them (`edit`, `create`), the VS Code
    # form capitalised (`Edit`, `Create`); both with `path` (checked with the real Copilot CLI 1.0.102)
    "copilot": {"edit": ("path",), "create": ("path",), "Edit": ("path",), "Create": ("path",)},
    # opencode 1.18: edit and write take `filePath`; apply_patch (and the older patch) a `patchText`;
    # multiedit (older versions) `filePath` too. The plugin passes the tool's args as tool_input
    "opencode": {"edit": ("filePath",), "write": ("filePath",), "multiedit": ("filePath",),
                 "apply_patch": ("patchText",), "patch": ("patchText",)},
}
# the matcher installed with the event: the harness starts no process at all for any other tool
MATCHERS = {harness: "|".join(tools) for harness, tools in TOOLS.items()}
INDEX_FILE = "claims-index.json"  # claim_index.INDEX_FILE (tests/test_startup.py checks they agree)
MAX_LINES = 20  # blocked paths named one by one in a refusal (each line is a few hundred characters)


def tool_paths(harness: str, event: dict) -> list[str] | None:
    """The paths the tool call would write, as the event gives them; None for a tool that writes no file
    we know of (or an event that names none)."""
    tools = TOOLS.get(harness, {})
    keys = tools.get(event.get("tool_name") or event.get("toolName"))
    if keys is None:
        return None
    tool_input = event.get("tool_input")
    if tool_input is None:
        tool_input = event.get("toolInput")
    if keys == ("patch",):
        from .patch_paths import patch_paths, tool_input_patch

        return patch_paths(tool_input_patch(tool_input)) or None
    if keys == ("patchText",):
        from .patch_paths import patch_paths

        text = tool_input.get("patchText") if isinstance(tool_input, dict) else None
        return (patch_paths(text) if isinstance(text, str) else []) or None
    if isinstance(tool_input, str):  # Copilot's reference types toolArgs as a JSON string in places
        import json

        try:
            tool_input = json.loads(tool_input)
        except (ValueError, RecursionError):
            return None
    if not isinstance(tool_input, dict):
        return None
    found = [tool_input[k] for k in keys if isinstance(tool_input.get(k), str) and tool_input[k].strip()]
    return found or None


def absolute(paths: list[str], event: dict, env) -> list[str]:
    """Each path made absolute against the folder the harness works in (the event's cwd, else its
    project directory variable, else ours); the guard decides what is inside the project."""
    base = event.get("cwd") if isinstance(event.get("cwd"), str) else None
    base = base or env.get("CLAUDE_PROJECT_DIR") or env.get("GEMINI_PROJECT_DIR") or os.getcwd()
    out = []
    for path in paths:
        path = os.path.expanduser(path) if path.startswith("~") else path
        out.append(os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path)))
    return out


# -- the quiet path: no store opened when nothing is held -----------------------------------------

def nothing_held(ws, env) -> bool:
    """True only when no path claim can be held, answered from files (the SQLite store only): the claims
    index (every path claim that may be held: an item goes in before its claim file is written and comes
    out only after its release is) is there and empty, or there is no index and no claim file at all.

    claim_index.nothing_held's answer, read without importing claim_index (its pattern code and datetime
    would be most of a quiet call); tests/test_pretool.py checks the two agree."""
    from . import quiet

    if not quiet._sqlite(ws, env):
        return False
    from ..atomic import read_json_or

    path = os.path.join(ws.files.root, INDEX_FILE)
    try:
        if os.stat(path).st_size > 4096:
            return False  # an index this long names claims: not worth parsing twice (the guard reads it next)
    except OSError:
        pass
    index = read_json_or(path, None)
    if isinstance(index, dict) and index.get("schema_version") == 1 and isinstance(index.get("items"), dict):
        return not index["items"]
    try:
        with os.scandir(ws.files.claims) as entries:
            return not any(entry.name.endswith(".json") for entry in entries)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def none_could_match(ws, env, wanted: list[str]) -> bool:
    """SQLite only: True when the claims index has no claim whose pattern could match any of `wanted` (the
    first step of the guard's own lookup, claim_index.holders_of, which then reads the store, the claim
    records and the holders' status only for such candidates). Also True when every path lies outside
    the project. Cheaper than the guard by the store and claims code it does not load."""
    from . import quiet

    if not quiet._sqlite(ws, env):
        return False
    from ..claim_index import file_candidates
    from ..pathpatterns import prefixes_of
    from ..project import project_of, relative_path

    root, fold = project_of(ws)
    prefixes: set = set()
    for path in wanted:
        rel = relative_path(path, root, fold)
        if rel is not None:
            prefixes.update(prefixes_of(rel.lower()))
    return not prefixes or not file_candidates(ws, sorted(prefixes))


# -- the answer -------------------------------------------------------------------------------------

def reason_text(blocked: list[dict], agent_id: str | None, session_id: str | None, now=None, mode: str = "deny") -> str:
    """One line per blocked path: who holds it (which item), until when, and the signal command to ask."""
    from ..timeutil import humanize_age, parse_ts
    from .conversation import command_hint

    lines = []
    for b in blocked[:MAX_LINES]:
        holder, path = b.get("claimed_by"), b.get("relative_path") or b.get("path")
        until = b.get("expires_at") or "?"
        try:
            left = (parse_ts(until) - now).total_seconds() if now is not None else None
            when = f"{until} ({humanize_age(-left)})" if left is not None else until
        except (ValueError, TypeError):
            when = until
        ask = command_hint(f"signal {holder} \"may I edit {path}?\" --type query", agent_id, session_id, None) \
            if agent_id else f"synapolis signal {holder} \"may I edit {path}?\" --type query"
        advice = "Do not edit it now; ask the holder with" if mode == "deny" else \
            "This edit was let through (guard.mode warn), but coordinate with the holder"
        lines.append(f"synapolis: {path} is claimed by {holder} (claim {b.get('item')}, token {b.get('token')}) "
                     f"until {when}. {advice}: {ask}")
    if len(blocked) > MAX_LINES:  # a patch of a thousand held files: the answer stays inside every harness's cap
        lines.append(f"... and {len(blocked) - MAX_LINES} more held path(s); see them all with: synapolis guard PATH...")
    return "\n".join(lines)


def answer(harness: str, mode: str, reason: str) -> dict:
    """The refusal (mode "deny") or the warning as context ("warn") in the harness's own shape."""
    name = EVENTS[harness]
    if mode == "deny":
        if harness == "gemini-cli":
            return {"decision": "deny", "reason": reason}
        out = {"hookSpecificOutput": {"hookEventName": name, "permissionDecision": "deny",
                                      "permissionDecisionReason": reason}}
        if harness == "copilot":
            # Copilot CLI reads the flat form for camelCase payloads and hookSpecificOutput for the VS Code
            # form (both checked with the real Copilot CLI 1.0.102): one answer carries both
            out.update(permissionDecision="deny", permissionDecisionReason=reason)
        return out
    if harness == "gemini-cli":
        # Gemini CLI's BeforeTool takes no context for the model (only AfterTool does): the person sees it
        return {"systemMessage": reason}
    out = {"hookSpecificOutput": {"hookEventName": name, "additionalContext": reason}}
    if harness == "copilot":
        out["additionalContext"] = reason
    return out


# Gemini CLI takes no context from BeforeTool, only from AfterTool: a warning is kept for the same
# conversation's next AfterTool (hooks._act), which adds it to the context it gives the model.

def _warning_path(ws, harness: str, conversation: str, env) -> str | None:
    from .quiet import index_name

    name = index_name(harness, conversation, env)
    return None if name is None else os.path.join(ws.files.hook_states, "warnings", f"{name}.txt")


def stash_warning(ws, harness: str, conversation: str, env, reason: str) -> None:
    path = _warning_path(ws, harness, conversation, env)
    if path is None:
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, (reason + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def take_warning(ws, harness: str, conversation: str, env) -> str | None:
    """The warnings kept for this conversation, taken (the file removed first: given once); None if none."""
    path = _warning_path(ws, harness, conversation, env)
    if path is None:
        return None
    taken = path + ".taken"
    try:
        os.rename(path, taken)
    except OSError:
        return None
    try:
        with open(taken, "rb") as handle:
            text = handle.read(64 * 1024).decode("utf-8", "replace").strip()[:4000]  # within every budget
    finally:
        try:
            os.unlink(taken)
        except OSError:
            pass
    return text or None


# -- the event ---------------------------------------------------------------------------------------

def handle(harness: str, event: dict, state_dir, env, result: dict, now=None) -> None:
    """Decide one pre-tool event into `result["output"]` ({} lets the tool run). Raises nothing the caller
    must not swallow: hooks.handle turns any exception into a line on stderr and an empty answer."""
    paths = tool_paths(harness, event)
    if not paths:
        return
    from . import conversation as convo

    ws = convo.workspace_for(state_dir, env, event)
    if ws.config.guard_mode == "off":
        return
    if env.get("SYNAPOLIS_SERVER") or ws.config.values.get("server"):  # through the team server (§16)
        from .remote_guard import ask

        return ask(harness, event, ws, env, result, absolute(paths, event, env))
    decide(harness, event, ws, env, result, absolute(paths, event, env), now)


def decide(harness: str, event: dict, ws, env, result: dict, wanted: list[str], now=None) -> None:
    """The guard's answer for `wanted` (absolute paths, or relative to the project root) into `result`, for
    the conversation of `event`, beside the store: here, or on the team server for a sandbox's hook
    (web/api_call.run_hook)."""
    from . import conversation as convo

    mode, auto = ws.config.guard_mode, ws.config.auto_claim
    if mode == "off":
        return
    if not auto and nothing_held(ws, env):
        return  # no claim anywhere: no store opened, no identity needed
    from ..claim_index import one_reading

    # the pre-check and the guard read a big claims index once between them (never a claim: a writer must
    # read the index afresh, so auto-claiming comes after this block)
    with one_reading():
        if not auto and none_could_match(ws, env, wanted):
            return  # no claim that may be held has a pattern these paths could match: the guard's own answer
        state = _conversation_state(ws, harness, event, env)
        agent_id = state.get("agent_id") or convo.agent_id_for(harness, convo.conversation_id(event), env)
        result["agent_id"] = agent_id
        from ..guard import guard
        from ..identity import Who

        who = Who(agent_id, state.get("session_id"), state.get("run_token"), named_only=True)
        verdict = guard(ws, who, wanted, now=now, env=env)
    blocked = verdict.get("blocked") or []
    if blocked:
        from ..store import clock

        moment = clock(ws, now)
        result["blocked"] = blocked
        reason = reason_text(blocked, agent_id, state.get("session_id"), moment, mode)
        result["output"] = answer(harness, mode, reason)
        if mode == "deny":
            _tell_denied(ws, harness, agent_id, blocked, event.get("tool_name") or event.get("toolName"), now)
        if mode == "warn" and harness == "gemini-cli":
            stash_warning(ws, harness, convo.conversation_id(event), env, reason)
        return
    if auto:
        result["claimed"] = _auto_claim(ws, harness, event, env, state, wanted, result, now)


def _tell_denied(ws, harness: str, agent_id, blocked: list[dict], tool, now=None) -> None:
    """Record the refused tool call for the dashboard and hand it to the notify targets (contract §15:
    io.synapolis.guard.denied); never waited for, never raises (guard_events.tell)."""
    from ..guard_events import tool_denied

    tool_denied(ws, harness, agent_id, blocked, tool, now)


def _conversation_state(ws, harness, event, env) -> dict:
    """The conversation's saved hook state (its agent id, session, run token), as the other events keep
    it; {} when it never registered (then it holds no claim, and acts as its derived id)."""
    from . import conversation as convo, quiet

    conversation = convo.conversation_id(event)
    key = quiet.known_key(ws, harness, conversation, env) or convo.agent_id_for(harness, conversation, env)
    try:
        state = convo.load_state(ws, key)
    except Exception:  # noqa: BLE001 - a damaged or planted state file: act as nobody known
        return {}
    if state.get("conversation_id") not in (None, conversation) or state.get("harness") not in (None, harness):
        return {}
    return state


def _auto_claim(ws, harness, event, env, state, wanted, result, now=None) -> list[str]:
    """Claim the edited files (those inside the project whose names are claim items) for the editor,
    registering the conversation first when no hook did yet."""
    from .. import autoclaim
    from . import conversation as convo

    items = claim_items(ws, wanted)
    if not items:
        return []
    ws = ws.ensure()
    if not (state.get("run_token") and convo.session_active(ws, state.get("session_id"))):
        conversation = convo.conversation_id(event)
        key = convo.agent_id_for(harness, conversation, env)
        state = convo.register(ws, harness, key, conversation, event, env, result["problems"], refresh=False, now=now)
    return autoclaim.claim_edits(ws, state["agent_id"], state.get("session_id"), items, now=now)


def claim_items(ws, wanted: list[str]) -> list[str]:
    """The claim items (project-relative paths, case kept) of the absolute paths `wanted` that lie inside
    the project and are valid items as they are: a file name with a space, or with a wildcard character
    that would make it a pattern, is not auto-claimed."""
    from ..errors import UsageError
    from ..names import is_name, validate_claim_item
    from ..pathpatterns import has_wildcards
    from ..project import project_of, relative_path

    root, _fold = project_of(ws)
    items = []
    for path in wanted:
        rel = relative_path(path, root, False)
        if rel is None or has_wildcards(rel) or is_name(rel) or rel in items:
            continue
        try:
            validate_claim_item(rel)
        except UsageError:
            continue
        items.append(rel)
    return items
