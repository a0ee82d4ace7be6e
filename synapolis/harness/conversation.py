"""One hook event and its conversation: the harnesses' events, the event read, the agent it is, its saved
state and its registration (harness.hooks acts on them; harness.pretool and harness.remote_hook use them too)."""

from __future__ import annotations

import json
import os

HARNESS_NAMES = ("claude-code", "gemini-cli", "codex", "copilot", "opencode")


# event -> what synapolis does: register (start), beat and deliver (deliver), beat idle, beat stopped
EVENT_KINDS: dict[str, dict[str, str]] = {
    "claude-code": {"SessionStart": "start", "UserPromptSubmit": "deliver", "PostToolUse": "deliver",
                    "Stop": "idle", "SessionEnd": "end"},
    "gemini-cli": {"SessionStart": "start", "BeforeAgent": "deliver", "AfterTool": "deliver",
                   "AfterAgent": "idle", "SessionEnd": "end"},
    # Codex documents no SessionEnd today; should it send one, it means the same as Claude Code's.
    "codex": {"SessionStart": "start", "UserPromptSubmit": "deliver", "PostToolUse": "deliver",
              "Stop": "idle", "SessionEnd": "end"},
    # GitHub Copilot CLI (harness.copilot, its events by their PascalCase names): it reads an answer only at
    # agentStop (Stop), so that is where signals are delivered; idle when there were none. Its sessionStart
    # registers without delivering (a "beat" registers a conversation in no live session): Copilot drops
    # that answer, and signals shown in it would be marked delivered yet never seen
    "copilot": {"SessionStart": "beat", "UserPromptSubmit": "beat", "PreToolUse": "beat", "PostToolUse": "beat",
                "Stop": "deliver", "SessionEnd": "end"},
    # opencode (harness.opencode's plugin names its events so): the plugin appends the context to the output
    # of the tool call the model reads next; session.created registers, session.idle is idle
    "opencode": {"SessionStart": "beat", "PreToolUse": "beat", "PostToolUse": "deliver", "SessionIdle": "idle",
                 "SessionEnd": "end"},
}


# the pre-tool event of each harness: the guard's (harness.pretool), never a beat
PRETOOL_EVENTS = {"claude-code": "PreToolUse", "gemini-cli": "BeforeTool", "codex": "PreToolUse",
                  "copilot": "PreToolUse", "opencode": "PreToolUse"}


# harnesses whose every event but idle and end means the agent works (they have no prompt event of their own
# that delivers): a beat on them says active, where on the others it keeps the registry's status
ACTIVE_BEATS = ("copilot", "opencode")


# Only these events accept hookSpecificOutput.additionalContext (Codex's output schemas reject it
# elsewhere: additionalProperties false).
CONTEXT_KINDS = ("start", "deliver")


# What each harness shows of a hook's context, counted the way that harness counts (docs/HOOKS.md names
# the source of each rule). A signal is marked delivered only when its whole text fits.
OUTPUT_BUDGETS = {
    # Claude Code: additionalContext over 10,000 characters (JavaScript string length: UTF-16 code
    # units, an emoji counts 2) is replaced by a preview and a file; 10,000 exactly passes whole.
    "claude-code": 10_000,
    # Codex: ceil(UTF-8 bytes / 4) approximate tokens; additionalContext over 2,500 of them is cut to a
    # preview and the rest spilled to a file under $CODEX_HOME/hook_outputs. So: 10,000 UTF-8 bytes.
    "codex": 2_500 * 4,
    # Gemini CLI caps no hook output, but AfterTool context is appended to the tool's result, which it
    # cuts to 40,000 characters keeping the last 80% (32,000): the context stays well inside that tail.
    # Counted in UTF-16 code units after Gemini escapes each < and > as &lt; and &gt;.
    "gemini-cli": 30_000,
    # Copilot CLI documents no limit on agentStop's `reason` (the next turn's prompt): Claude Code's 10,000
    # UTF-16 units, the smallest budget of the others, so a delivery never floods the turn
    "copilot": 10_000,
    # opencode documents no limit on what a plugin appends to a tool's output: the same 10,000 UTF-16 units
    "opencode": 10_000,
}


PINNED_ENV = "SYNAPOLIS_HOOK_PINNED_AGENT"  # set by the team server (web.api_call) only, never by a harness


MAX_INPUT_BYTES = 32 * 1024 * 1024


HOOK_DEADLINE_S = 4.0          # SYNAPOLIS_HOOK_TIMEOUT_S overrides; harnesses allow 10 s (installed)


HOOK_BUSY_TIMEOUT_MS = 1500    # a locked store gives up this fast inside a hook, well before the deadline


SUMMARY_IDS = 12               # ids named in the "not shown" summary


MAX_SUBSTRATE = 128            # contract §2's bound on the model name recorded as the substrate


class HookInputError(ValueError):
    """The event on stdin is not something a hook can act on."""


def parse_event(raw: bytes | str) -> dict:
    """The event object; HookInputError for anything else (garbage, a list, no session id)."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_INPUT_BYTES:
            raise HookInputError(f"hook input is {len(raw)} bytes, more than the {MAX_INPUT_BYTES} accepted")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HookInputError(f"hook input is not UTF-8 ({exc})") from None
    if not raw.strip():
        raise HookInputError("no hook input on stdin (expected one JSON object)")
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: '[[[[…' nested too deeply
        raise HookInputError(f"hook input is not JSON ({exc})") from None
    if not isinstance(event, dict):
        raise HookInputError(f"hook input is a JSON {type(event).__name__}, not an object")
    session = event.get("session_id") or event.get("sessionId")
    if not isinstance(session, str) or not session.strip():
        raise HookInputError("hook input has no session_id, so there is no conversation to act for")
    name = event.get("hook_event_name") or event.get("hookEventName")
    if not isinstance(name, str) or not name:
        raise HookInputError("hook input has no hook_event_name")
    return event


def conversation_id(event: dict) -> str:
    conversation = (event.get("session_id") or event.get("sessionId")).strip()
    # JSON may carry lone surrogates ("\\udcff"), which no UTF-8 file or hash takes: spell them out
    return conversation.encode("utf-8", "backslashreplace").decode("utf-8")


def event_name(event: dict) -> str:
    return event.get("hook_event_name") or event.get("hookEventName")


def agent_id_for(harness: str, conversation: str, env=None) -> str:
    """The same id for every hook call of one conversation (contract §2).

    The slug is `$SYNAPOLIS_SUBSTRATE` or the harness, never the model named in the event: Claude
    Code names the model on SessionStart only, and the id must not change between events.
    """
    from ..names import generate_agent_id

    env = os.environ if env is None else env
    if env.get(PINNED_ENV):  # through the team server with a token pinned to an agent: that agent (§16)
        return env[PINNED_ENV]
    return generate_agent_id(env.get("SYNAPOLIS_SUBSTRATE") or None, harness, conversation_id=conversation,
                             deterministic=True)


def command_hint(verb: str, agent_id: str, session_id: str | None, run_token: str | None) -> str:
    words = [f"synapolis {verb}", f"--agent-id {agent_id}"]
    if session_id:
        words.append(f"--session-id {session_id}")
    if run_token:
        words.append(f"--run-token {run_token}")
    return " ".join(words)


def load_state(ws, agent_id: str) -> dict:
    from ..atomic import read_json_or

    document = read_json_or(ws.files.hook_state(agent_id), {})  # a str: no pathlib on every hook call
    return document if isinstance(document, dict) and _well_formed(document) else {}


def _well_formed(state: dict) -> bool:
    """Whether a saved state's identity is one a hook can act with: a damaged or hand-edited file (an id
    that breaks the rules, a token that is not text) is forgotten as an unparseable one is, and the
    conversation registers afresh; kept, it failed every hook call of the conversation from then on."""
    from ..errors import UsageError
    from ..names import validate_agent_id, validate_session_id

    try:
        for key, check in (("agent_id", validate_agent_id), ("session_id", validate_session_id)):
            if state.get(key) is not None:
                check(state[key])
    except UsageError:
        return False
    token = state.get("run_token")
    return token is None or (isinstance(token, str) and bool(token.strip()))


def save_state(ws, agent_id: str, document: dict) -> None:
    from ..atomic import atomic_write_json

    # it holds the run token: readable by this user only
    atomic_write_json(ws.files.hook_state(agent_id), document, durable=False, mode=0o600)  # a str: no pathlib


def workspace_for(state_dir, env, event):
    """The state directory as §1 finds it, walking up from the harness's project directory."""
    from ..config import Config
    from ..workspace import Workspace

    project = env.get("CLAUDE_PROJECT_DIR") or env.get("GEMINI_PROJECT_DIR") or event.get("cwd") or None
    if project and not os.path.isdir(project):
        project = None
    ws = Workspace.open(state_dir, env=env, cwd=project)
    values = dict(ws.config.values)
    values["busy_timeout_ms"] = min(int(values.get("busy_timeout_ms", HOOK_BUSY_TIMEOUT_MS)), HOOK_BUSY_TIMEOUT_MS)
    return Workspace(ws.paths, Config(values))


def _text_field(value, limit: int) -> str | None:
    """A harness-given name (the model) as text the registry takes: at most `limit` characters, UTF-8."""
    if not isinstance(value, str) or not value.strip():
        return None
    return value.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def register(ws, harness, key, conversation, event, env, problems, *, refresh: bool, now=None) -> dict:
    """Make this conversation a registered agent and remember it in hooks/<key>.json; the state.

    Under a lock of its own, so the hooks of one conversation that fire together register once. With
    `refresh` False, a state another hook just saved (registered, session active) is taken as it is.
    The id is the conversation's derived one (`key`) unless someone else holds it: a hook acts only
    as an agent whose run token it holds, and never adopts an id registered by anyone else.
    """
    from .. import actions
    from ..atomic import locked
    from ..errors import ConflictError, ForbiddenError
    from ..identity import new_token
    from ..names import generate_agent_id
    from ..sessions import sessions_of_agent

    with locked(ws.paths.lock(f"hook-{key}"), timeout=HOOK_DEADLINE_S):
        state = load_state(ws, key)
        active = session_active(ws, state.get("session_id"))
        if not refresh and active and state.get("agent_id") and state.get("run_token"):
            return state
        session_id = state.get("session_id") if active else None
        substrate = (_text_field(event.get("model"), MAX_SUBSTRATE) or state.get("substrate")
                     or _text_field(env.get("SYNAPOLIS_SUBSTRATE"), MAX_SUBSTRATE))
        attempts = []
        if state.get("agent_id") and state.get("run_token"):
            attempts.append((state["agent_id"], state["run_token"]))  # a resumed conversation: its own slot
        attempts.append((key, None))
        for agent_id, token in attempts + [(None, None)]:
            if agent_id is None and env.get(PINNED_ENV):
                raise ForbiddenError(f"agent {key} is registered by someone else, and this token acts only as it")
            if agent_id is None:
                # the derived id is someone else's: this conversation's hash with 4 random hex instead
                agent_id = generate_agent_id(env.get("SYNAPOLIS_SUBSTRATE") or None, harness, conversation)
                problems.append(f"agent id {key} is registered by someone else; this conversation is {agent_id}")
            elif token is None and sessions_of_agent(ws, agent_id, active_only=False):
                continue  # registered already, and not with a token this conversation holds
            if token is None:
                # remember the slot and its token before registering it: saved only after, a state file
                # that cannot be written (a folder in its place) lost the token of an agent already
                # registered, and each later call registered yet another live agent. With no session
                # named, concurrent hooks of this conversation come here (and wait) rather than act on it
                token = new_token()
                save_state(ws, key, {"agent_id": agent_id, "session_id": None, "run_token": token,
                                     "harness": harness, "conversation_id": conversation})
            try:
                started = actions.start(ws, agent_id=agent_id, session_id=session_id, harness=harness,
                                        substrate=substrate, conversation_id=conversation, run_token=token,
                                        env=env_without_identity(env), piggyback=False, now=now)
                break
            except (ForbiddenError, ConflictError):
                # our token is not the slot's any more, or the slot is live under someone else
                continue
        else:
            raise ConflictError(f"no agent id free for this conversation (tried {key})")
        state = {"agent_id": started["agent_id"], "session_id": started["session_id"],
                 "run_token": started.get("run_token"), "harness": harness, "conversation_id": conversation}
        if substrate:
            state["substrate"] = substrate
        save_state(ws, key, state)
        return state


def session_active(ws, session_id) -> bool:
    from ..errors import SynapolisError
    from ..sessions import read_session

    if not session_id:
        return False
    try:
        return read_session(ws, session_id).get("status") == "active"
    except (SynapolisError, ValueError):  # no such session, a broken session.json, a malformed name
        return False


def env_without_identity(env) -> dict:
    # A hook acts for the conversation it was called from; an agent id exported for some other
    # process must not override that.
    return {k: v for k, v in env.items() if k not in ("SYNAPOLIS_AGENT_ID", "SYNAPOLIS_RUN_TOKEN")}


def who_of(state):
    from ..identity import Who

    return Who(agent_id=state["agent_id"], session_id=state.get("session_id"), run_token=state.get("run_token"))


def deadline_s(env=None) -> float:
    env = os.environ if env is None else env
    try:
        value = float(env.get("SYNAPOLIS_HOOK_TIMEOUT_S", HOOK_DEADLINE_S))
    except ValueError:
        return HOOK_DEADLINE_S
    # an hour at most: "inf" (or 1e400) would overflow the timer thread and leave the hook unbounded
    return value if 0 < value <= 3600 else HOOK_DEADLINE_S
