"""Harness hooks (contract §11): one event in a harness's JSON shape in, beat and deliver, its answer out.

This runs on every tool call of every agent, so it imports only what the event at hand needs, bounds
its own time, and never fails the harness: every problem becomes a line for stderr and the answer is
still a valid (possibly empty) JSON object.
"""

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


def answer(harness: str, event: str, context: str | None) -> dict:
    """The harness's own answer shape; {} when there is nothing to add."""
    kind = EVENT_KINDS.get(harness, {}).get(event)
    if harness == "copilot":
        from .copilot import answer as copilot_answer

        return copilot_answer(event, context)
    if not context or kind not in CONTEXT_KINDS:
        return {}
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": context}}


# -- the context text ---------------------------------------------------------------------------

def _utf16_units(text: str) -> int:
    if text.isascii():  # one unit a character, without loading the UTF-16 codec on a hook's call
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _escaped(text: str) -> str:
    """`text` as it stands inside the printed answer (run_bounded: json.dumps, ensure_ascii=False): a control
    character is six characters there (\\u0001), a quote, a backslash or a newline two."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text  # nothing to escape (the usual line): no encoder call
    return json.dumps(text, ensure_ascii=False)[1:-1]


def context_cost(harness: str, text: str) -> int:
    """What `text` costs as a hook's additionalContext in HARNESS, in the unit of OUTPUT_BUDGETS, counted as
    the harness receives it: JSON-escaped in the printed answer (4,500 control characters are 27,000 there).

    Every measure adds up character by character (JSON escapes each character on its own), so a text's cost
    is the sum of its parts' costs.
    """
    return printed_cost(harness, _escaped(text))


def printed_cost(harness: str, printed: str) -> int:
    """What printed text (the answer on stdout) costs in HARNESS's unit: Codex UTF-8 bytes, Claude Code
    UTF-16 code units (JavaScript's length), Gemini CLI UTF-16 code units once it escapes < and > as &lt; &gt;."""
    if harness == "codex":
        return len(printed.encode("utf-8", "surrogatepass"))
    if harness == "gemini-cli":
        return _utf16_units(printed) + 3 * (printed.count("<") + printed.count(">"))
    return _utf16_units(printed)


def context_room(harness: str, event: str) -> int:
    """The budget for one event's context: the harness's cap less the printed answer around it (the answer
    object with an empty context, and its newline), so that the whole answer stays within the cap."""
    envelope = json.dumps(answer(harness, event, "x"), ensure_ascii=False).replace('"x"', '""') + "\n"
    return OUTPUT_BUDGETS[harness] - printed_cost(harness, envelope)


def _signal_block(signal: dict) -> str:
    head = f"[signal {signal.get('id', '')[:12]} from {signal.get('sender')} to {signal.get('recipient')}" \
           f" · {signal.get('type')} · {signal.get('timestamp')}]"
    return f"{head}\n{signal.get('content', '')}"


def _shown_header(count: int) -> str:
    return f"{count} signal(s) from other agents (oldest first):"


def _summary(rest: list[dict], read_hint: str) -> str:
    ids = ", ".join((s.get("id") or "")[:12] for s in rest[:SUMMARY_IDS])
    more = f" and {len(rest) - SUMMARY_IDS} more" if len(rest) > SUMMARY_IDS else ""
    biggest = max(len(s.get("content") or "") for s in rest)
    return (f"{len(rest)} more signal(s) not shown here: they do not fit in one hook answer of this harness "
            f"(the largest has {biggest} characters). Ids: {ids}{more}. {read_hint}")


def _worst_summary(read_hint: str) -> str:
    # the longest `_summary` can be: ids are 12 hex digits, and no count comes near these numbers
    ids = ", ".join(["f" * 12] * SUMMARY_IDS)
    return (f"{10 ** 10} more signal(s) not shown here: they do not fit in one hook answer of this harness "
            f"(the largest has {10 ** 12} characters). Ids: {ids} and {10 ** 10} more. {read_hint}")


class ContextBudget:
    """Decides which signals fit one answer of a harness, reserving room for the summary at its largest.

    `fits(chosen, candidate)` is the test the store's drain applies while it takes signals oldest
    first, so that exactly the signals shown are the ones marked delivered.
    """

    def __init__(self, harness: str, room: int, preamble: list[str], ack_hint: str, read_hint: str):
        self.harness, self.room = harness, room
        cost = self.cost
        separators = cost("\n\n") * (len(preamble) + 3)
        self.fixed = (sum(cost(p) for p in preamble) + cost(_shown_header(10 ** 10)) + cost(ack_hint)
                      + cost(_worst_summary(read_hint)) + separators)
        self._blocks: dict[str, int] = {}

    def cost(self, text: str) -> int:
        return context_cost(self.harness, text)

    def block_cost(self, signal: dict) -> int:
        key = signal.get("id") or id(signal)
        if key not in self._blocks:
            self._blocks[key] = self.cost(_signal_block(signal)) + self.cost("\n\n")
        return self._blocks[key]

    def fits(self, chosen: list[dict], candidate: dict) -> bool:
        used = self.fixed + sum(self.block_cost(s) for s in chosen)
        return used + self.block_cost(candidate) <= self.room


def render_context(preamble: list[str], shown: list[dict], rest: list[dict], ack_hint: str, read_hint: str) -> str:
    """The additionalContext text: the preamble, the signals shown (whole, oldest first), and a summary
    by id and size of the ones `rest` that wait, with the command that reads them."""
    parts = list(preamble)
    if shown:
        parts.append(_shown_header(len(shown)))
        parts.extend(_signal_block(s) for s in shown)
    if rest:
        parts.append(_summary(rest, read_hint))
    if shown:
        parts.append(ack_hint)
    return "\n\n".join(parts)


def _command_hint(verb: str, agent_id: str, session_id: str | None, run_token: str | None) -> str:
    words = [f"synapolis {verb}", f"--agent-id {agent_id}"]
    if session_id:
        words.append(f"--session-id {session_id}")
    if run_token:
        words.append(f"--run-token {run_token}")
    return " ".join(words)


# -- remembering the conversation between calls -------------------------------------------------

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


# -- the work ---------------------------------------------------------------------------------

def _workspace(state_dir, env, event):
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


def _register(ws, harness, key, conversation, event, env, problems, *, refresh: bool, now=None) -> dict:
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
        active = _session_active(ws, state.get("session_id"))
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
                                        env=_env_without_identity(env), piggyback=False, now=now)
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


def _session_active(ws, session_id) -> bool:
    from ..errors import SynapolisError
    from ..sessions import read_session

    if not session_id:
        return False
    try:
        return read_session(ws, session_id).get("status") == "active"
    except (SynapolisError, ValueError):  # no such session, a broken session.json, a malformed name
        return False


def _env_without_identity(env) -> dict:
    # A hook acts for the conversation it was called from; an agent id exported for some other
    # process must not override that.
    return {k: v for k, v in env.items() if k not in ("SYNAPOLIS_AGENT_ID", "SYNAPOLIS_RUN_TOKEN")}


def _who(state):
    from ..identity import Who

    return Who(agent_id=state["agent_id"], session_id=state.get("session_id"), run_token=state.get("run_token"))


def handle(harness: str, raw: bytes | str, *, state_dir=None, env=None, now=None) -> dict:
    """Act on one hook event at `now` (default: the store's clock); never raises.

    Returns {"output": the answer object to print, "problems": lines for stderr, "agent_id",
    "event", "delivered": ids shown in full, "withheld": ids summarised}.
    """
    env = dict(os.environ if env is None else env)
    result = {"output": {}, "problems": [], "agent_id": None, "event": None, "delivered": [], "withheld": []}
    problems = result["problems"]
    if harness not in EVENT_KINDS:
        problems.append(f"unknown harness {harness!r}: use one of {', '.join(HARNESS_NAMES)}")
        return result
    if harness == "copilot":  # its camelCase payload form as the VS Code one (harness.copilot)
        from .copilot import normalize

        raw = normalize(raw, env)
    try:
        event = parse_event(raw)
    except HookInputError as exc:
        problems.append(str(exc))
        return result
    name = event_name(event)
    result["event"] = name
    if name == PRETOOL_EVENTS.get(harness):
        return _pretool(harness, event, state_dir, env, result, now)
    kind = EVENT_KINDS[harness].get(name, "beat")
    if kind != "start" and isinstance(event.get("agent_id"), str) and event["agent_id"]:
        # Fired inside a subagent (Claude Code and Codex add agent_id/agent_type then): it keeps the
        # conversation's heartbeat fresh, but the signals are the main agent's, and a subagent's
        # Stop does not make the main agent idle.
        kind = "beat"
    try:
        _act(harness, event, name, kind, state_dir, env, result, now)
    except Exception as exc:  # noqa: BLE001 - a hook never breaks the harness
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        problems.append(message)
        if env.get("SYNAPOLIS_DEBUG"):
            import traceback

            problems.append(traceback.format_exc())
    return result


def _pretool(harness, event, state_dir, env, result, now=None) -> dict:
    """The pre-tool event (harness.pretool): the guard's answer, or {} (the tool runs) on any failure."""
    try:
        from . import pretool

        pretool.handle(harness, event, state_dir, env, result, now)
    except Exception as exc:  # noqa: BLE001 - the guard never blocks work because of its own failure
        result["output"] = {}
        result["problems"].append("guard: " + (getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"))
    return result


def _pending_warning(ws, harness, conversation, env) -> str | None:
    if harness != "gemini-cli":
        return None
    from .pretool import take_warning

    return take_warning(ws, harness, conversation, env)


def _act(harness, event, name, kind, state_dir, env, result, now=None) -> None:
    from ..errors import ForbiddenError, UsageError
    from . import quiet

    problems = result["problems"]
    conversation = conversation_id(event)
    ws = _workspace(state_dir, env, event)
    if env.get("SYNAPOLIS_SERVER") or ws.config.values.get("server"):  # through the team server (§16)
        from .remote_hook import act

        return act(harness, event, kind, ws, env, result)
    ws = ws.ensure()
    key = quiet.known_key(ws, harness, conversation, env)  # no SHA-256 on the usual call (harness.quiet)
    try:
        state = load_state(ws, key) if key else {}
    except UsageError:  # not an id: the index entry is not ours
        state = {}
    indexed = bool(state) and state.get("conversation_id") == conversation and state.get("harness") == harness
    if not indexed:
        key = agent_id_for(harness, conversation, env)
        state = load_state(ws, key)
        if state:  # registered before the index existed, or the entry was wrong: (re)write it now
            quiet.remember_key(ws, harness, conversation, env, key)
            indexed = True

    seconds, stamp = quiet.clock(now)  # the quiet path is SQLite's only: the local clock
    # a guard warning (guard.mode warn) that Gemini CLI's BeforeTool could not give the model: given now
    warning = _pending_warning(ws, harness, conversation, env) if kind == "deliver" else None
    # Copilot's agentStop is also its idle: the quiet path's refresh would keep the agent active
    if (kind == "deliver" and not warning and not (harness == "copilot" and name == "Stop")
            and quiet.still_quiet(ws, state, env, seconds)):
        result["agent_id"] = state["agent_id"]
        quiet.refresh(ws, state, stamp)  # nothing new since the last drain: no store opened
        return
    clean_env = _env_without_identity(env)
    if kind == "end" and not (state.get("run_token") and _session_active(ws, state.get("session_id"))):
        result["agent_id"] = state.get("agent_id") or key
        return  # not registered by this conversation, or its session is over: nobody of ours to stop
    preamble = [warning] if warning else []
    # Register on SessionStart, and whenever this conversation is in no live session (hooks installed
    # mid-conversation, its hooks/ file lost, or the session ended by consensus sleep and work resumed).
    if kind == "start" or not (state.get("run_token") and _session_active(ws, state.get("session_id"))):
        state = _register(ws, harness, key, conversation, event, env, problems, refresh=kind == "start", now=now)
    for attempt in (1, 2):
        result["agent_id"] = state["agent_id"]
        if kind == "start" and not preamble:
            preamble.append(_identity_note(ws, state["agent_id"], state))
        try:
            _work(ws, harness, name, kind, state, preamble, clean_env, result, now)
            break
        except ForbiddenError:
            if attempt == 2:
                raise
            # our run token is not the slot's any more (someone took the stale slot over): register
            # afresh rather than act as whoever holds it now
            state = _register(ws, harness, key, conversation, event, env, problems, refresh=True, now=now)
    if not indexed:  # registered just now
        quiet.remember_key(ws, harness, conversation, env, key)
    if kind != "beat":  # a plain beat keeps the registry's status: what the quiet path knew still holds
        changed = quiet.remembered(state, result.pop("quiet", None), seconds)
        if changed is not None:
            try:
                save_state(ws, key, changed)
            except OSError:  # not remembered: the next call takes the full path again
                pass


def _work(ws, harness, name, kind, state, preamble, env, result, now=None) -> None:
    """Beat with the event's status, or beat and deliver, as the agent `state` names (with its token)."""
    from .. import actions

    if kind in ("idle", "end", "beat"):
        status = {"idle": "idle", "end": "stopped", "beat": None}[kind]
        if harness in ACTIVE_BEATS and kind == "beat":
            status = "active"  # its prompt and tool events are all it has to say the agent works again
        actions.beat(ws, _who(state), status=status, env=env, piggyback=False, now=now)
        if kind == "end":  # the files guard.auto_claim claimed for this agent are free again
            from ..autoclaim import release_all

            release_all(ws, state["agent_id"], now=now)
        return
    shown, waiting, text, result["quiet"] = _deliver(ws, harness, name, state, preamble, env, now)
    if harness == "copilot" and name == "Stop" and not shown:  # the turn ends with nothing to show: idle
        actions.beat(ws, _who(state), status="idle", env=env, piggyback=False, now=now)
    result["delivered"] = [s["id"] for s in shown]
    result["withheld"] = [s["id"] for s in waiting]
    result["output"] = answer(harness, name, text)


def _deliver(ws, harness, name, state, preamble, env, now=None):
    """Beat active and take the signals that fit this harness's answer (`signals_pending`, method `hook`).

    The drain takes signals oldest first while ContextBudget says the next one still fits, so exactly
    the signals shown are marked delivered. A text over budget after all (it cannot be: fits() reserved
    the largest summary) fails the hook, and hook redelivery offers those signals again.
    """
    from .. import actions

    agent_id = state["agent_id"]
    token = state.get("run_token") if ws.config.require_run_token else None
    ack_hint = ("When you have handled them, acknowledge them so they are not offered again: "
                + _command_hint("ack-signals ID,ID", agent_id, state.get("session_id"), token))
    read_hint = "Read them with: " + _command_hint("read-signals", agent_id, state.get("session_id"), None)
    budget = ContextBudget(harness, context_room(harness, name), preamble, ack_hint, read_hint)
    # `limit` only bounds what the store reads: no block is shorter than its 64-character header
    drained = actions.signals_pending(ws, _who(state), env=env, method="hook", status="active",
                                      limit=max(budget.room // 64, 1), fits=budget.fits, withheld=True,
                                      change_mark=True, now=now)
    taken, waiting = drained["pending_signals"], drained["withheld"]
    text = render_context(preamble, taken, waiting, ack_hint, read_hint)
    if budget.cost(text) > budget.room:
        raise RuntimeError(f"hook context of {budget.cost(text)} over the budget of {budget.room}")
    # nothing unread at all, read under the store's write lock with the change counter: what the quiet
    # path may rely on while that counter stays the same (harness.quiet)
    return taken, waiting, text, drained["change_mark"]


def _identity_note(ws, agent_id, state) -> str:
    session = state.get("session_id")
    token = state.get("run_token") if ws.config.require_run_token else None
    lines = [f"synapolis: you are agent {agent_id} in session {session}. Other agents' signals to you "
             "appear in this context as they arrive."]
    lines.append("Send one with: " + _command_hint("signal TO TEXT", agent_id, session, token)
                 + " (TO is an agent id or '*').")
    lines.append("Claim a file before editing it: " + _command_hint("claim ITEM", agent_id, session, token))
    return "\n".join(lines)


# -- running bounded ------------------------------------------------------------------------------

def deadline_s(env=None) -> float:
    env = os.environ if env is None else env
    try:
        value = float(env.get("SYNAPOLIS_HOOK_TIMEOUT_S", HOOK_DEADLINE_S))
    except ValueError:
        return HOOK_DEADLINE_S
    # an hour at most: "inf" (or 1e400) would overflow the timer thread and leave the hook unbounded
    return value if 0 < value <= 3600 else HOOK_DEADLINE_S


def run_bounded(harness: str, read_input, write_out, write_err, *, state_dir=None, env=None,
                deadline: float | None = None) -> dict:
    """Read, handle and answer one event, giving up after `deadline` seconds with an empty answer.

    `read_input()` returns the raw event, `write_out(text)` / `write_err(text)` print. A timer thread
    enforces the bound even when the main thread is stuck in C (a lock, a slow disk): it prints `{}`
    and ends the process with exit 0. Anything already marked delivered but not printed is offered
    again later (hook redelivery), so giving up loses nothing.
    """
    # the low-level `_thread` (documented, public) rather than `threading`: one lock and one thread are all
    # this needs, and `threading` is about 1 ms of every hook call (a quiet one opens nothing else heavy)
    import _thread

    env = os.environ if env is None else env
    deadline = deadline_s(env) if deadline is None else deadline
    lock = _thread.allocate_lock()
    finished = _thread.allocate_lock()
    finished.acquire()
    done = []

    def emit(text: str, problems: list[str]) -> bool:
        with lock:
            if done:
                return False
            done.append(True)
            try:
                for line in problems:
                    write_err(f"synapolis hook {harness}: {line}\n")
                write_out(text + "\n")
            except (OSError, ValueError):
                pass  # the harness stopped listening (closed pipe): nothing left to tell it
            return True

    def give_up():
        emit("{}", [f"gave up after {deadline:g}s (store busy or disk slow); answered with nothing"])
        os._exit(0)

    def watch():  # the timer: a thread the interpreter does not wait for at exit
        if not finished.acquire(timeout=min(deadline, _thread.TIMEOUT_MAX)):
            give_up()

    _thread.start_new_thread(watch, ())
    try:
        try:
            raw = read_input()
        except Exception as exc:  # noqa: BLE001
            raw = b""
            result = {"output": {}, "problems": [f"cannot read stdin: {exc}"]}
        else:
            result = handle(harness, raw, state_dir=state_dir, env=env)
        emit(json.dumps(result["output"], ensure_ascii=False), result["problems"])
        return result
    finally:
        finished.release()
