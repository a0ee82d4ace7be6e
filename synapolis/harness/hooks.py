"""Harness hooks (contract §11): one event in a harness's JSON shape in, beat and deliver, its answer out.

This runs on every tool call of every agent, so it imports only what the event at hand needs, bounds
its own time, and never fails the harness: every problem becomes a line for stderr and the answer is
still a valid (possibly empty) JSON object.
"""

from __future__ import annotations

import json
import os

# the event, its conversation and its agent (harness.conversation); every name stays importable from here
from .conversation import (ACTIVE_BEATS, CONTEXT_KINDS, EVENT_KINDS, HARNESS_NAMES,  # noqa: F401
                           HOOK_BUSY_TIMEOUT_MS, HOOK_DEADLINE_S, MAX_INPUT_BYTES, MAX_SUBSTRATE, OUTPUT_BUDGETS,
                           PINNED_ENV, PRETOOL_EVENTS, SUMMARY_IDS, HookInputError, agent_id_for, command_hint,
                           conversation_id, deadline_s, env_without_identity, event_name, load_state, parse_event,
                           register, save_state, session_active, who_of, workspace_for)

# the names they had here before (the tests and older callers use them)
_command_hint, _workspace, _register, _session_active = command_hint, workspace_for, register, session_active
_env_without_identity, _who = env_without_identity, who_of
_CONTEXT = ("answer", "context_cost", "printed_cost", "context_room", "ContextBudget", "render_context")


# -- the work ---------------------------------------------------------------------------------


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
    ws = workspace_for(state_dir, env, event)
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
    clean_env = env_without_identity(env)
    if kind == "end" and not (state.get("run_token") and session_active(ws, state.get("session_id"))):
        result["agent_id"] = state.get("agent_id") or key
        return  # not registered by this conversation, or its session is over: nobody of ours to stop
    preamble = [warning] if warning else []
    # Register on SessionStart, and whenever this conversation is in no live session (hooks installed
    # mid-conversation, its hooks/ file lost, or the session ended by consensus sleep and work resumed).
    if kind == "start" or not (state.get("run_token") and session_active(ws, state.get("session_id"))):
        state = register(ws, harness, key, conversation, event, env, problems, refresh=kind == "start", now=now)
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
            state = register(ws, harness, key, conversation, event, env, problems, refresh=True, now=now)
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
        actions.beat(ws, who_of(state), status=status, env=env, piggyback=False, now=now)
        if kind == "end":  # the files guard.auto_claim claimed for this agent are free again
            from ..autoclaim import release_all

            release_all(ws, state["agent_id"], now=now)
        return
    shown, waiting, text, result["quiet"] = _deliver(ws, harness, name, state, preamble, env, now)
    if harness == "copilot" and name == "Stop" and not shown:  # the turn ends with nothing to show: idle
        actions.beat(ws, who_of(state), status="idle", env=env, piggyback=False, now=now)
    result["delivered"] = [s["id"] for s in shown]
    result["withheld"] = [s["id"] for s in waiting]
    from .context import answer

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
                + command_hint("ack-signals ID,ID", agent_id, state.get("session_id"), token))
    read_hint = "Read them with: " + command_hint("read-signals", agent_id, state.get("session_id"), None)
    from .context import ContextBudget, context_room, render_context

    budget = ContextBudget(harness, context_room(harness, name), preamble, ack_hint, read_hint)
    # `limit` only bounds what the store reads: no block is shorter than its 64-character header
    drained = actions.signals_pending(ws, who_of(state), env=env, method="hook", status="active",
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
    lines.append("Send one with: " + command_hint("signal TO TEXT", agent_id, session, token)
                 + " (TO is an agent id or '*').")
    lines.append("Claim a file before editing it: " + command_hint("claim ITEM", agent_id, session, token))
    return "\n".join(lines)


# -- running bounded ------------------------------------------------------------------------------


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


def __getattr__(name):
    # the context text (harness.context) loads only when a hook delivers: a quiet call never needs it
    if name in _CONTEXT:
        from . import context

        return getattr(context, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
