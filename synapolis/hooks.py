"""Harness hooks (contract §11): one event in a harness's JSON shape in, beat and deliver, its answer out.

This runs on every tool call of every agent, so it imports only what the event at hand needs, bounds
its own time, and never fails the harness: every problem becomes a line for stderr and the answer is
still a valid (possibly empty) JSON object.
"""

from __future__ import annotations

import json
import os

HARNESS_NAMES = ("claude-code", "gemini-cli", "codex")

# event -> what synapolis does: register (start), beat and deliver (deliver), beat idle, beat stopped
EVENT_KINDS: dict[str, dict[str, str]] = {
    "claude-code": {"SessionStart": "start", "UserPromptSubmit": "deliver", "PostToolUse": "deliver",
                    "Stop": "idle", "SessionEnd": "end"},
    "gemini-cli": {"SessionStart": "start", "BeforeAgent": "deliver", "AfterTool": "deliver",
                   "AfterAgent": "idle", "SessionEnd": "end"},
    # Codex documents no SessionEnd today; should it send one, it means the same as Claude Code's.
    "codex": {"SessionStart": "start", "UserPromptSubmit": "deliver", "PostToolUse": "deliver",
              "Stop": "idle", "SessionEnd": "end"},
}
# Only these events accept hookSpecificOutput.additionalContext (Codex's output schemas reject it
# elsewhere: additionalProperties false).
CONTEXT_KINDS = ("start", "deliver")

# The harness throws away a hook answer over 10,000 characters; the whole stdout stays below this.
MAX_OUTPUT_CHARS = 9500
MAX_INPUT_BYTES = 32 * 1024 * 1024
HOOK_DEADLINE_S = 4.0          # SYNAPOLIS_HOOK_TIMEOUT_S overrides; harnesses allow 10 s (installed)
HOOK_BUSY_TIMEOUT_MS = 1500    # a locked store gives up this fast inside a hook, well before the deadline
SUMMARY_IDS = 12               # ids named in the "not shown" summary


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
    return (event.get("session_id") or event.get("sessionId")).strip()


def event_name(event: dict) -> str:
    return event.get("hook_event_name") or event.get("hookEventName")


def agent_id_for(harness: str, conversation: str, env=None) -> str:
    """The same id for every hook call of one conversation (contract §2).

    The slug is `$SYNAPOLIS_SUBSTRATE` or the harness, never the model named in the event: Claude
    Code names the model on SessionStart only, and the id must not change between events.
    """
    from .names import generate_agent_id

    env = os.environ if env is None else env
    return generate_agent_id(env.get("SYNAPOLIS_SUBSTRATE") or None, harness, conversation_id=conversation,
                             deterministic=True)


def answer(harness: str, event: str, context: str | None) -> dict:
    """The harness's own answer shape; {} when there is nothing to add."""
    kind = EVENT_KINDS.get(harness, {}).get(event)
    if not context or kind not in CONTEXT_KINDS:
        return {}
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": context}}


# -- the context text ---------------------------------------------------------------------------

def _json_len(text: str) -> int:
    # what the text costs inside the JSON answer (quotes, newlines and the like are escaped)
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _signal_block(signal: dict) -> str:
    head = f"[signal {signal.get('id', '')[:12]} from {signal.get('sender')} to {signal.get('recipient')}" \
           f" · {signal.get('type')} · {signal.get('timestamp')}]"
    return f"{head}\n{signal.get('content', '')}"


def _tail_cost(ack_hint: str, read_hint: str) -> int:
    """Room kept for the summary line (a bounded number of ids) and both hints."""
    return 200 + SUMMARY_IDS * 14 + _json_len(read_hint) + _json_len(ack_hint)


def render_context(preamble: list[str], signals: list[dict], ack_hint: str, read_hint: str,
                   waiting: list[dict] = (), budget: int = MAX_OUTPUT_CHARS - 300) -> tuple[str, list[dict], list[dict]]:
    """The additionalContext text within `budget` JSON characters: (text, shown, withheld).

    Signals are shown whole, oldest first, each while it fits; a signal is never cut in half. Those
    that do not fit, and `waiting` ones not taken at all, are summarised at the end by id and size,
    with the command that reads them.
    """
    used = sum(_json_len(p) + 2 for p in preamble)
    tail = _tail_cost(ack_hint, read_hint)
    shown, withheld, blocks = [], [], []
    for signal in signals:
        block = _signal_block(signal)
        cost = _json_len(block) + 2
        if used + cost + tail <= budget:
            blocks.append(block)
            used += cost
            shown.append(signal)
        else:
            withheld.append(signal)
    parts = list(preamble)
    if shown:
        parts.append(f"{len(shown)} signal(s) from other agents (oldest first):")
        parts.extend(blocks)
    rest = withheld + list(waiting)
    if rest:
        ids = ", ".join((s.get("id") or "")[:12] for s in rest[:SUMMARY_IDS])
        more = f" and {len(rest) - SUMMARY_IDS} more" if len(rest) > SUMMARY_IDS else ""
        biggest = max(len(s.get("content") or "") for s in rest)
        parts.append(f"{len(rest)} more signal(s) not shown here: a hook's answer holds under "
                     f"{MAX_OUTPUT_CHARS} characters and the largest of these has {biggest}. Ids: {ids}{more}. "
                     f"{read_hint}")
    if shown:
        parts.append(ack_hint)
    return "\n\n".join(parts), shown, rest


def _command_hint(verb: str, agent_id: str, session_id: str | None, run_token: str | None) -> str:
    words = [f"synapolis {verb}", f"--agent-id {agent_id}"]
    if session_id:
        words.append(f"--session-id {session_id}")
    if run_token:
        words.append(f"--run-token {run_token}")
    return " ".join(words)


# -- remembering the conversation between calls -------------------------------------------------

def load_state(ws, agent_id: str) -> dict:
    from .atomic import read_json_or

    document = read_json_or(ws.files.hook_state(agent_id), {})  # a str: no pathlib on every hook call
    return document if isinstance(document, dict) else {}


def save_state(ws, agent_id: str, document: dict) -> None:
    from .atomic import atomic_write_json

    # it holds the run token: readable by this user only
    atomic_write_json(ws.paths.hook_state(agent_id), document, durable=False, mode=0o600)


# -- the work ---------------------------------------------------------------------------------

def _workspace(state_dir, env, event):
    """The state directory as §1 finds it, walking up from the harness's project directory."""
    from .config import Config
    from .workspace import Workspace

    project = env.get("CLAUDE_PROJECT_DIR") or env.get("GEMINI_PROJECT_DIR") or event.get("cwd") or None
    if project and not os.path.isdir(project):
        project = None
    ws = Workspace.open(state_dir, env=env, cwd=project)
    values = dict(ws.config.values)
    values["busy_timeout_ms"] = min(int(values.get("busy_timeout_ms", HOOK_BUSY_TIMEOUT_MS)), HOOK_BUSY_TIMEOUT_MS)
    return Workspace(ws.paths, Config(values))


def _register(ws, harness, agent_id, conversation, event, env, state, problems) -> dict:
    """SessionStart (or the first event seen of a conversation): join a session, write the heartbeat."""
    from . import actions
    from .errors import ConflictError, ForbiddenError

    session_id = state.get("session_id") if _session_active(ws, state.get("session_id")) else None
    model = event.get("model")
    substrate = model if isinstance(model, str) and model else state.get("substrate")
    token = state.get("run_token")
    for attempt in (token, None) if token else (None,):
        try:
            started = actions.start(ws, agent_id=agent_id, session_id=session_id, harness=harness,
                                    substrate=substrate, conversation_id=conversation, run_token=attempt,
                                    deterministic_id=True, env=_env_without_identity(env), piggyback=False)
            break
        except ForbiddenError:
            # the remembered token is not the slot's any more (taken over while stale): start afresh
            continue
        except ConflictError as exc:
            # Our id is derived from this conversation, so the live holder is this conversation too
            # (its hooks/ file was lost); carry on as that agent rather than fail the harness.
            problems.append(f"{exc.message}; continuing as {agent_id}")
            return state
    else:  # pragma: no cover - the loop always ends in break, return or an exception
        return state
    state = {**state, "agent_id": started["agent_id"], "session_id": started["session_id"],
             "run_token": started.get("run_token"), "harness": harness, "conversation_id": conversation}
    if substrate:
        state["substrate"] = substrate
    save_state(ws, agent_id, state)
    return state


def _session_active(ws, session_id) -> bool:
    from .errors import SynapolisError
    from .sessions import read_session

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


def _who(state, agent_id):
    from .identity import Who

    return Who(agent_id=agent_id, session_id=state.get("session_id"), run_token=state.get("run_token"))


def handle(harness: str, raw: bytes | str, *, state_dir=None, env=None) -> dict:
    """Act on one hook event; never raises.

    Returns {"output": the answer object to print, "problems": lines for stderr, "agent_id",
    "event", "delivered": ids shown in full, "withheld": ids summarised}.
    """
    env = dict(os.environ if env is None else env)
    result = {"output": {}, "problems": [], "agent_id": None, "event": None, "delivered": [], "withheld": []}
    problems = result["problems"]
    if harness not in EVENT_KINDS:
        problems.append(f"unknown harness {harness!r}: use one of {', '.join(HARNESS_NAMES)}")
        return result
    try:
        event = parse_event(raw)
    except HookInputError as exc:
        problems.append(str(exc))
        return result
    name = event_name(event)
    result["event"] = name
    kind = EVENT_KINDS[harness].get(name, "beat")
    if kind != "start" and isinstance(event.get("agent_id"), str) and event["agent_id"]:
        # Fired inside a subagent (Claude Code and Codex add agent_id/agent_type then): it keeps the
        # conversation's heartbeat fresh, but the signals are the main agent's, and a subagent's
        # Stop does not make the main agent idle.
        kind = "beat"
    try:
        _act(harness, event, name, kind, state_dir, env, result)
    except Exception as exc:  # noqa: BLE001 - a hook never breaks the harness
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        problems.append(message)
        if env.get("SYNAPOLIS_DEBUG"):
            import traceback

            problems.append(traceback.format_exc())
    return result


def _act(harness, event, name, kind, state_dir, env, result) -> None:
    from . import actions
    from .errors import NoIdentityError, NotFoundError

    problems = result["problems"]
    conversation = conversation_id(event)
    agent_id = agent_id_for(harness, conversation, env)
    result["agent_id"] = agent_id
    ws = _workspace(state_dir, env, event).ensure()
    state = load_state(ws, agent_id)
    clean_env = _env_without_identity(env)
    preamble = []
    # Register on SessionStart, and whenever this conversation is in no live session (hooks
    # installed mid-conversation, or the session ended by consensus sleep and work resumed).
    if kind == "start" or (kind == "deliver" and not _session_active(ws, state.get("session_id"))):
        state = _register(ws, harness, agent_id, conversation, event, env, state, problems)
        if kind == "start":
            preamble.append(_identity_note(ws, agent_id, state))
    if kind in ("idle", "end", "beat"):
        status = {"idle": "idle", "end": "stopped", "beat": None}[kind]
        try:
            actions.beat(ws, _who(state, agent_id), status=status, env=clean_env, piggyback=False)
        except (NotFoundError, NoIdentityError):
            # never registered (no SessionStart seen): the heartbeat alone still tells the truth
            from .heartbeat import write_heartbeat

            write_heartbeat(ws.paths, agent_id, status=status, harness=harness)
        return
    shown, withheld, text = _deliver(ws, agent_id, state, preamble, clean_env)
    result["delivered"] = [s["id"] for s in shown]
    result["withheld"] = [s["id"] for s in withheld]
    result["output"] = answer(harness, name, text)


def _deliver(ws, agent_id, state, preamble, env):
    """Beat active and take the signals due (method `hook`) in one transaction; render what fits."""
    from . import actions
    from . import signals as sig

    token = state.get("run_token") if ws.config.require_run_token else None
    ack_hint = ("When you have handled them, acknowledge them so they are not offered again: "
                + _command_hint("ack-signals ID,ID", agent_id, state.get("session_id"), token))
    read_hint = "Read them with: " + _command_hint("read-signals", agent_id, state.get("session_id"), None)
    room = MAX_OUTPUT_CHARS - 300 - sum(_json_len(p) + 2 for p in preamble) - _tail_cost(ack_hint, read_hint)
    with actions.as_agent(ws, _who(state, agent_id), env=env, method="hook") as call:
        call.heartbeat_fields = {"status": "active"}
        with call.store.write() as conn:
            # drain counts raw content; escaping in JSON makes text longer, hence the margin
            taken = call.finish({}, conn, budget_chars=max(int(room / 1.25), 0))["pending_signals"]
            waiting = [s for s in sig.unread(conn, agent_id, limit=500) if s.get("delivered_at") is None]
    text, shown, withheld = render_context(preamble, taken, ack_hint, read_hint, waiting)
    return shown, withheld, text


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
    import threading

    env = os.environ if env is None else env
    deadline = deadline_s(env) if deadline is None else deadline
    lock = threading.Lock()
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

    timer = threading.Timer(deadline, give_up)
    timer.daemon = True
    timer.start()
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
        timer.cancel()
