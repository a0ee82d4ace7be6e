"""The tools, resources and subscriptions (contract §10), registered on a server whatever its transport.

A thin layer: each tool resolves who is calling, calls the same `actions.*` / `sleep.tired` function as the
CLI, and returns its JSON answer as structured content (with `pending_signals`).
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import actions, agent_call
from ..errors import BusyError, ForbiddenError, SynapolisError
from . import watch
from .live import NoWait, not_waiting
from .errors import error_line, resource_error
from .state import ServerState, client_key, principal_of

SIGNAL_TYPES = Literal["inform", "query", "delegate", "ack", "warn", "sleep_event", "sleep_request"]
STATUSES = Literal["active", "idle", "sleeping", "stopped"]

# Parameters shared by every tool that acts as an agent; explained once, in INSTRUCTIONS.
AgentId = Annotated[str | None, Field(default=None)]
SessionId = Annotated[str | None, Field(default=None)]
RunToken = Annotated[str | None, Field(default=None)]


# -- output schemas: the keys callers may rely on (contract §5); more keys pass through -----------------
class _Result(BaseModel):
    model_config = ConfigDict(extra="allow")
    pending_signals: list[dict[str, Any]]


class StartResult(_Result):
    agent_id: str
    session_id: str
    run_token: str | None
    status: str


class BeatResult(_Result):
    heartbeat: dict[str, Any]


class AgentsResult(_Result):
    agents: list[dict[str, Any]]


class SignalResult(_Result):
    signal: dict[str, Any]
    audience: dict[str, Any]


class SignalsResult(_Result):
    signals: list[dict[str, Any]]


class AckResult(_Result):
    acked: list[str]


class NoteResult(_Result):
    note: dict[str, Any]


class NotesResult(_Result):
    notes: list[dict[str, Any]]


class EntryResult(_Result):
    entry: dict[str, Any]


class TiredResult(_Result):
    outcome: str
    active_others: int
    staged: int
    merged: int


class ClaimResult(_Result):
    claim: dict[str, Any]



def _client_name(ctx: Context | None) -> str | None:
    try:
        params = ctx.request_context.session.client_params
        return params.client_info.name if params and params.client_info else None
    except (AttributeError, ValueError):
        return None



class GuardResult(_Result):
    allowed: bool
    blocked: list[dict[str, Any]]


def _answer(result: dict) -> types.CallToolResult:
    """The library's answer as structured content, and the same JSON, compact, as the text a model reads.

    The tool's return annotation publishes the output schema; the SDK validates this result against it.
    """
    result = dict(result)
    result.setdefault("pending_signals", [])
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=result)


def register_tools(server, state: ServerState) -> None:
    # readOnlyHint only where a call changes nothing: every tool acting as an agent refreshes its heartbeat
    # and may mark signals delivered (piggyback), the reads too when an identity resolves
    ro = types.ToolAnnotations(read_only_hint=True)

    def act(ws, fn, who, *args, env=None, **kwargs) -> types.CallToolResult:
        """Run one library verb in `ws` as `who` (None: the verb takes no caller) and answer with its result.

        `env`: the environment identity may come from (the server's, for a local client; none for a remote
        one). The verbs that write create the state directory themselves (as for the CLI)."""
        lead = () if who is None else (who,)
        with agent_call.long_lived(state.live if state.fast else None):
            result = fn(ws, *lead, *args, env=state.env if env is None else env, **kwargs)
        state.keep_open(ws, result.get("session_id") or getattr(who, "session_id", None))
        return _answer(result)

    async def call(fn, who, *args, slow: bool = False, rerunnable: bool = True, **kwargs) -> types.CallToolResult:
        """`act` on the event loop itself where it cannot wait, else on a worker thread.

        A thread hop is two wake-ups (the worker, then the loop): 0.3-0.5 ms of the server's CPU per call on a
        busy small machine, and more of the round trip. Inline, a verb that waits (a locked store, up to
        busy_timeout_ms) would hold up the loop: every other client's calls, the pushes, the page. So a verb
        first runs inline with session stores that wait for no lock (`NoWait`, SQLite only); when one was
        locked, it has changed nothing in the store (`rerunnable`: its store work is one transaction at its
        end, and what it wrote before, the heartbeat file, is written again alike) and runs again on a
        thread, where it waits as any verb does. Verbs that wait by design (`slow`: start_session, tired,
        claim with wait_s) always run on a thread; so do the rest that are not rerunnable (claim, release:
        their work is done outside the store first) once anyone has subscribed, and every verb on a shared
        store (PostgreSQL: each verb is network round trips).
        """
        ws = state.workspace()
        if rerunnable and not slow and state.fast and state.on_sqlite(ws):
            attempt = NoWait()
            try:
                with not_waiting(attempt):
                    return act(ws, fn, who, *args, **kwargs)
            except BusyError:
                if not attempt.blocked:
                    raise
            # a session store was locked: wait for it where waiting holds up nobody else
            return await anyio.to_thread.run_sync(functools.partial(act, ws, fn, who, *args, **kwargs))
        if slow or state.watcher is not None or not state.fast:
            return await anyio.to_thread.run_sync(functools.partial(act, ws, fn, who, *args, **kwargs))
        return act(ws, fn, who, *args, **kwargs)

    @server.tool(description="Join (or create) a session as an agent; remembers the identity for later calls. "
                             "Returns agent_id, session_id, run_token.")
    async def start_session(session_id: SessionId = None, agent_id: AgentId = None,
                            harness_conversation_id: str | None = None, harness: str | None = None,
                            substrate: str | None = None, run_token: RunToken = None, new_session: bool = False,
                            ctx: Context = None) -> StartResult:
        principal = principal_of(ctx)
        principal.check_may_write()
        agent_id = principal.acting_as(agent_id)
        # a remote client gets nothing from this machine: not its environment, nor its identity.json
        env = {} if principal.remote else state.env
        answer = await call(actions.start, None, slow=True, agent_id=agent_id, session_id=session_id,
                            harness=harness or env.get(actions.ENV_HARNESS) or _client_name(ctx) or "mcp",
                            substrate=substrate, conversation_id=harness_conversation_id, run_token=run_token,
                            new_session=new_session, env=env, write_identity=not principal.remote)
        state.remember(ctx, answer.structured_content)
        return answer

    @server.tool(description="Write this agent's heartbeat (status/task kept unless given).")
    async def beat(status: STATUSES | None = None, task: str | None = None,
                   ttl_s: Annotated[float | None, Field(gt=0)] = None, note: str | None = None,
                   agent_id: AgentId = None, session_id: SessionId = None, run_token: RunToken = None,
                   ctx: Context = None) -> BeatResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        # a beat's note belongs to one beat: never written twice (see `call`)
        return await call(actions.beat, who, status=status, task=task, ttl_s=ttl_s, note=note,
                          rerunnable=note is None)

    @server.tool(description="Send a signal. to: '*' (all), an agent id, or a sub-agent (id.name). "
                             "sender_id: you or your sub-agent.")
    async def signal(to: str, content: str, type: SIGNAL_TYPES = "inform", sender_id: str | None = None,
                     reply_to: str | None = None, agent_id: AgentId = None, session_id: SessionId = None,
                     run_token: RunToken = None, ctx: Context = None) -> SignalResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.signal, who, to, content, type=type, sender_id=sender_id, reply_to=reply_to)

    @server.tool(description="A page of your signals, oldest first (unread only by default; limit default 200). "
                             "Marks nothing read. remaining: how many more (up to 1000); next page: after=next_after.")
    async def read_signals(unread_only: bool = True, limit: Annotated[int | None, Field(gt=0)] = None,
                           after: Annotated[int | None, Field(ge=0)] = None,
                           agent_id: AgentId = None, session_id: SessionId = None,
                           run_token: RunToken = None, ctx: Context = None) -> SignalsResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.read_signals, who, unread_only=unread_only, limit=limit, after=after)

    @server.tool(description="Mark signals read: full ids or unique 8+ char prefixes, or all=true.")
    async def ack_signals(signal_ids: list[str] | None = None, all: bool = False, agent_id: AgentId = None,
                          session_id: SessionId = None, run_token: RunToken = None,
                          ctx: Context = None) -> AckResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.ack_signals, who, list(signal_ids or []), all=all)

    @server.tool(description="Deliver a page of signals not yet delivered to you (limit default 200); "
                             "pending_remaining: how many more wait.")
    async def signals_pending(limit: Annotated[int | None, Field(gt=0)] = None, agent_id: AgentId = None,
                              session_id: SessionId = None, run_token: RunToken = None,
                              ctx: Context = None) -> _Result:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.signals_pending, who, method="poll", limit=limit)

    @server.tool(description="The session's notes: the newest `limit`, oldest first; older: before=next_before.")
    async def read_notes(session_id: SessionId = None, limit: Annotated[int, Field(gt=0)] = 50,
                         before: Annotated[int | None, Field(gt=0)] = None, agent_id: AgentId = None,
                         ctx: Context = None) -> NotesResult:
        who = state.who(ctx, agent_id, session_id, writes=False)
        return await call(actions.read_notes, who, session_id=session_id, limit=limit, before=before)

    @server.tool(description="Append a note to the session's notes bus.")
    async def note(text: str, agent_id: AgentId = None, session_id: SessionId = None,
                   run_token: RunToken = None, ctx: Context = None) -> NoteResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.note, who, text)

    @server.tool(description="The session's agents: status and effective (heartbeat) status.")
    async def list_agents(session_id: SessionId = None, agent_id: AgentId = None,
                          ctx: Context = None) -> AgentsResult:
        who = state.who(ctx, agent_id, session_id, writes=False)
        return await call(actions.list_agents, who, session_id=session_id)

    @server.tool(description="Set a shared whiteboard entry.")
    async def write_whiteboard(key: str, value: str, agent_id: AgentId = None, session_id: SessionId = None,
                               run_token: RunToken = None, ctx: Context = None) -> EntryResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.whiteboard_write, who, key, value)

    @server.tool(description="Read a whiteboard entry ({entry}), or without key a page of entries by key "
                             "({entries}, remaining; next page: after=next_after).")
    async def read_whiteboard(key: str | None = None, after: str | None = None,
                              limit: Annotated[int | None, Field(gt=0)] = None, session_id: SessionId = None,
                              agent_id: AgentId = None, ctx: Context = None) -> _Result:
        who = state.who(ctx, agent_id, session_id, writes=False)
        return await call(actions.whiteboard_read, who, key, session_id=session_id, after=after, limit=limit)

    @server.tool(description="Done: go idle, stage memories (strings or {text,key,tags}); the last active "
                             "agent consolidates them and ends the session.")
    async def tired(memories: list[str | dict[str, Any]] | str | None = None, agent_id: AgentId = None,
                    session_id: SessionId = None, run_token: RunToken = None, ctx: Context = None) -> TiredResult:
        from .. import sleep

        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(sleep.tired, who, memories=memories, slow=True)

    @server.tool(description="Claim a work item (file path, ticket:N) for ttl_s; wait_s waits for a holder. "
                             "Returns the claim with its fencing token.")
    async def claim(item: str, ttl_s: Annotated[float | None, Field(gt=0)] = None,
                    wait_s: Annotated[float, Field(ge=0)] = 0, agent_id: AgentId = None, session_id: SessionId = None,
                    run_token: RunToken = None, ctx: Context = None) -> ClaimResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.claim, who, item, ttl_s=ttl_s, wait_s=wait_s, slow=wait_s > 0, rerunnable=False)

    @server.tool(description="Release your claim; force (with reason) releases another's.")
    async def release(item: str, force: bool = False, reason: str | None = None, agent_id: AgentId = None,
                      session_id: SessionId = None, run_token: RunToken = None,
                      ctx: Context = None) -> ClaimResult:
        who = state.who(ctx, agent_id, session_id, run_token)
        return await call(actions.release, who, item, force=force, reason=reason, rerunnable=False)

    @server.tool(description="Fencing check: succeeds only while token is the live holder's token of item.",
                 annotations=ro)
    async def claim_check(item: str, token: int, agent_id: AgentId = None, session_id: SessionId = None,
                          ctx: Context = None) -> _Result:
        who = state.who(ctx, agent_id, session_id, writes=False)
        return await call(actions.claim_check, who, item, token)

    @server.tool(description="May you write these paths (absolute, or relative to the project root)? allowed, and "
                             "blocked: each path held by a live other agent with its item, holder, expiry and "
                             "token. Changes nothing.", annotations=ro)
    async def guard(paths: list[str], agent_id: AgentId = None, session_id: SessionId = None,
                    run_token: RunToken = None, ctx: Context = None) -> GuardResult:
        who = state.who(ctx, agent_id, session_id, run_token, writes=False)
        return await call(actions.guard, who, paths)


def register_resources(server, state: ServerState) -> None:
    from ..identity import Who

    @server.resource(watch.INBOX_TEMPLATE, name="inbox", mime_type="application/json",
                     description="A page of the agent's unread signals, as JSON: signals, remaining, next_after. "
                                 "Only that agent may read it: reading marks them delivered (push).")
    async def inbox(session_id: str, agent_id: str, ctx: Context = None) -> str:
        def read():
            who = state.who(ctx)  # the caller's own identity: the URI names whose inbox, not who asks
            env = {} if who.named_only else state.env
            return actions.inbox(state.workspace(), who, session_id, agent_id, env=env, method="push")

        try:
            result = await anyio.to_thread.run_sync(read)
        except SynapolisError as exc:
            raise resource_error(exc) from None
        return json.dumps(result, ensure_ascii=False, default=str)

    @server.resource(watch.NOTES_TEMPLATE, name="notes", mime_type="application/json",
                     description="The session's notes bus, as JSON with a notes list: the newest 50, oldest "
                                 "first. Reading acts as nobody and changes nothing.")
    async def notes(session_id: str, ctx: Context = None) -> str:
        def read():
            state.who(ctx, writes=False)  # refuses a request without a valid token
            return actions.read_notes(state.workspace(), Who(named_only=True), session_id=session_id,
                                      piggyback=False)

        try:
            result = await anyio.to_thread.run_sync(read)
        except SynapolisError as exc:
            raise resource_error(exc) from None
        return json.dumps(result, ensure_ascii=False, default=str)


def register_subscriptions(server, state: ServerState) -> None:
    """`resources/subscribe` (protocol revisions up to 2025-11-25) and `subscriptions/listen` (2026-07-28+)."""

    async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        key = client_key(ctx)
        try:
            state.check_may_watch(ctx, uri)
            await state.subscribe(uri, key)
        except SynapolisError as exc:
            raise MCPError(types.INVALID_PARAMS, error_line(exc), data={"uri": uri}) from None
        state.connections[key] = ctx.session
        return types.EmptyResult()

    async def on_unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        state.subscriptions.remove(str(params.uri), client_key(ctx))
        return types.EmptyResult()

    async def track_listen(ctx, call_next):
        """Watch the synapolis URIs of a listen stream while it is open; the SDK's bus does the sending."""
        if ctx.method != "subscriptions/listen":
            return await call_next(ctx)
        try:
            params = types.SubscriptionsListenRequestParams.model_validate(ctx.params or {})
            uris = list(params.notifications.resource_subscriptions or ())
        except ValidationError:
            return await call_next(ctx)  # the SDK answers the malformed request
        for uri in uris:
            try:
                state.check_may_watch(ctx, uri)
            except ForbiddenError as exc:
                # refused outright: the SDK's bus would send this stream whatever is published for the URI
                # (another client's subscription to it), whether or not we watch it for this one
                raise MCPError(types.INVALID_PARAMS, error_line(exc), data={"uri": uri}) from None
            except SynapolisError:
                pass  # not ours: honored by the SDK and never fires, as the protocol says
        holder = ("listen", object())
        watched = []
        try:
            for uri in uris:
                try:
                    await state.subscribe(uri, holder)
                    watched.append(uri)
                except SynapolisError:
                    pass  # not ours: honored by the SDK and never fires, as the protocol says
            return await call_next(ctx)
        finally:
            for uri in watched:
                state.subscriptions.remove(uri, holder)

    # MCPServer serves subscriptions/listen but not the older resources/subscribe; the SDK's advice for a
    # method the 2026 revision removed is the low-level server's add_request_handler
    lowlevel = server.lowlevel
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)
    server.middleware.append(track_listen)
