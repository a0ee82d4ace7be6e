"""The MCP server (contract §10): every verb as a tool, the inbox and notes resources, push to subscribers.

A thin layer: each tool resolves who is calling, calls the same `actions.*` / `sleep.tired` function as the
CLI, and returns its JSON answer as structured content (with `pending_signals`). This module imports the
MCP SDK at the top, so only `synapolis mcp` may import it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import mcp_watch
from .errors import NotFoundError, SynapolisError, UsageError, internal_error
from .workspace import Workspace

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "synapolis: coordination between parallel coding agents in one session. Call start_session once; "
    "the identity it returns is remembered, else SYNAPOLIS_AGENT_ID/SYNAPOLIS_SESSION_ID/SYNAPOLIS_RUN_TOKEN "
    "from the server's environment apply; any tool may name agent_id (+run_token, session_id) explicitly. "
    "Every result has pending_signals: signals delivered with this answer; handle them, then ack_signals. "
    "A signal: id, sequence, timestamp, sender, recipient, type, content, lamport, read, delivered_at. "
    "Errors read '<Type> (exit N): message'. Subscribe to synapolis://session/{session_id}/inbox/{agent_id} "
    "to be told when a signal arrives."
)

MAX_KEPT = 16  # sessions whose database one server holds open (keep_open)
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


# -- errors ---------------------------------------------------------------------------------------------
def error_line(error: SynapolisError) -> str:
    return f"{error.type_name} (exit {error.exit_code}): {error.message}"


def error_result(error: SynapolisError) -> types.CallToolResult:
    """A tool error carrying the contract's one-line message, and its JSON shape as structured content."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=error_line(error))],
                                structured_content=error.to_json(), is_error=True)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid arguments: " + "; ".join(parts)


def as_synapolis_error(exc: BaseException, tool: str) -> SynapolisError:
    """What went wrong in a tool call, as the error the CLI would have reported for it."""
    cause = exc.__cause__
    if isinstance(cause, SynapolisError):
        return cause
    if isinstance(exc, ToolError) and not isinstance(exc, UnexpectedToolError):
        if isinstance(cause, ValidationError):
            return UsageError(_validation_message(cause))
        if cause is None and str(exc).startswith("Unknown tool"):
            return UsageError(f"unknown tool {tool!r}: tools/list names the tools")
        return UsageError(str(exc) if cause is None else f"{tool}: {cause}")
    return internal_error(exc if cause is None else cause)


def _compact_schema(node, collapse_optional: bool):
    """Drop what costs tokens and says nothing (titles, `default: null`, `additionalProperties: true`).

    `collapse_optional` turns `anyOf: [X, null]` into X: right for inputs (leaving a key out is how a
    caller says null), wrong for outputs, where null is a real value a client validates against.
    """
    if isinstance(node, list):
        return [_compact_schema(item, collapse_optional) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties" and value is True:
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: _compact_schema(sub, collapse_optional) for name, sub in value.items()}
        else:
            out[key] = _compact_schema(value, collapse_optional)
    options = out.get("anyOf")
    if collapse_optional and isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        (kept,) = [o for o in options if o != {"type": "null"}]
        out.pop("anyOf")
        out = {**kept, **out}
    return out


# -- the server ---------------------------------------------------------------------------------------
@dataclass
class Remembered:
    agent_id: str
    session_id: str
    run_token: str | None


class SynapolisMCP(MCPServer):
    """MCPServer with the contract's error shape on every tool call and compact tool schemas."""

    _tools_cache: list | None = None

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except MCPError:
            raise
        except ToolError as exc:
            return error_result(as_synapolis_error(exc, name))

    async def list_tools(self):
        # the list is fixed once built; an agent pays for its size on every turn, so trim it once
        if self._tools_cache is None:
            tools = await super().list_tools()
            self._tools_cache = [
                tool.model_copy(update={
                    "input_schema": _compact_schema(tool.input_schema, True),
                    "output_schema": _compact_schema(tool.output_schema, False) if tool.output_schema else None,
                })
                for tool in tools
            ]
        return self._tools_cache


class ServerState:
    """What one `synapolis mcp` process holds: the state directory, its environment, the remembered
    identity, and the subscriptions with their watcher."""

    def __init__(self, state_dir, env=None, *, force_polling: bool = False):
        self.root = Path(state_dir).absolute()
        self.env = dict(os.environ if env is None else env)
        self.remembered: Remembered | None = None
        self.bus = InMemorySubscriptionBus()
        self.subscriptions = mcp_watch.Subscriptions()
        self.connections: dict[Any, Any] = {}  # legacy subscriber key -> ServerSession to notify
        self.force_polling = force_polling
        self.watcher: mcp_watch.SessionWatcher | None = None
        self.kept: dict[str, Any] = {}  # session_id -> SessionStore held open (see keep_open)
        self._users = 0
        self._lock = threading.Lock()

    def workspace(self, create: bool = False) -> Workspace:
        # re-read per call, so an edited synapolis.json applies without restarting the harness
        ws = Workspace.open(self.root, env=self.env)
        return ws.ensure() if create else ws

    def who(self, agent_id=None, session_id=None, run_token=None):
        """Explicit arguments first; the identity start_session remembered fills what they leave out (its
        run token only for that agent in that session); the library then falls back to env, identity.json."""
        from .identity import Who

        mem = self.remembered
        if mem is None or agent_id not in (None, mem.agent_id):
            return Who(agent_id, session_id, run_token)
        same_session = session_id in (None, mem.session_id)
        return Who(mem.agent_id, session_id or mem.session_id,
                   run_token or (mem.run_token if same_session else None))

    def remember(self, result: dict) -> None:
        self.remembered = Remembered(result["agent_id"], result["session_id"], result.get("run_token"))

    def keep_open(self, ws, session_id: str | None) -> None:
        """Hold one connection to a session this server works in, for the server's life.

        When the last connection to a WAL database closes, SQLite checkpoints and deletes the WAL, and the
        next opener rebuilds its index: with one connection held here every verb's own open and close is
        cheap (a read verb drops from ~20 ms to a few ms here), the CLI's and hooks' included. Never queried.
        """
        if not session_id or session_id in self.kept:
            return
        from .store import SessionStore

        try:
            store = SessionStore.open(ws, session_id)
        except SynapolisError:
            return
        with self._lock:
            if session_id in self.kept or len(self.kept) >= MAX_KEPT:
                store.close()
                return
            self.kept[session_id] = store

    def close_kept(self) -> None:
        with self._lock:
            stores, self.kept = list(self.kept.values()), {}
        for store in stores:
            store.close()

    # -- push ---------------------------------------------------------------------------------------
    async def deliver(self, uris: list[str]) -> None:
        """On the event loop: tell every subscriber of each URI, both ways."""
        for uri in uris:
            await self.bus.publish(ResourceUpdated(uri=uri))  # subscriptions/listen streams
            for holder in self.subscriptions.holders(uri):  # resources/subscribe connections
                session = self.connections.get(holder)
                if session is None:
                    continue
                try:
                    await session.send_resource_updated(uri)
                except Exception as exc:  # noqa: BLE001 - one gone client must not starve the others
                    log.debug("synapolis mcp: cannot notify %s: %s", uri, exc)

    async def subscribe(self, uri: str, holder) -> None:
        """Watch `uri` for `holder` from now on: what it holds now is the baseline, not news."""
        ws = self.workspace()
        baseline = await anyio.to_thread.run_sync(mcp_watch.current_value, ws, uri)
        self.subscriptions.add(uri, holder, baseline)
        if self.watcher is not None:
            # a signal stored between the baseline and the registration woke a check that did not
            # know this URI yet; look once more so it is not missed until the next event
            self.watcher.mark_dirty(mcp_watch.parse_uri(uri)[1])

    def start_watching(self, token) -> None:
        with self._lock:
            self._users += 1
            if self.watcher is not None:
                return
            ws = self.workspace(create=True)

            def notify(uris):
                anyio.from_thread.run(self.deliver, uris, token=token)

            self.watcher = mcp_watch.SessionWatcher(ws, self.subscriptions, notify,
                                                    force_polling=self.force_polling).start()

    def stop_watching(self) -> None:
        with self._lock:
            self._users -= 1
            watcher = self.watcher if self._users <= 0 else None
            if watcher is not None:
                self.watcher = None
        if watcher is not None:
            watcher.stop()
            self.close_kept()
            for holder in list(self.connections):
                self.subscriptions.drop_holder(holder)
            self.connections.clear()


def _connection_key(session) -> Any:
    # one ServerSession proxy is built per request; the connection behind it is what identifies a client
    return ("conn", id(getattr(session, "_connection", session)))


def _client_name(ctx: Context | None) -> str | None:
    try:
        params = ctx.request_context.session.client_params
        return params.client_info.name if params and params.client_info else None
    except (AttributeError, ValueError):
        return None


def create_server(state_dir, env=None, *, force_polling: bool = False) -> SynapolisMCP:
    """Build the server for one state directory; `env` is what the harness gave the process."""
    from importlib.metadata import PackageNotFoundError, version

    state = ServerState(state_dir, env, force_polling=force_polling)

    @asynccontextmanager
    async def lifespan(_server):
        state.start_watching(anyio.lowlevel.current_token())
        try:
            yield {}
        finally:
            await anyio.to_thread.run_sync(state.stop_watching)

    try:
        server_version = version("synapolis")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        server_version = "0"
    server = SynapolisMCP("synapolis", version=server_version, instructions=INSTRUCTIONS,
                          subscriptions=state.bus, lifespan=lifespan, log_level="WARNING")
    server.state = state
    _register_tools(server, state)
    _register_resources(server, state)
    _register_subscriptions(server, state)
    return server


def _answer(result: dict) -> types.CallToolResult:
    """The library's answer as structured content, and the same JSON, compact, as the text a model reads.

    The tool's return annotation publishes the output schema; the SDK validates this result against it.
    """
    result = dict(result)
    result.setdefault("pending_signals", [])
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=result)


def _register_tools(server: SynapolisMCP, state: ServerState) -> None:
    from . import actions

    ro = types.ToolAnnotations(read_only_hint=True)

    def act(fn, who, *args, **kwargs) -> types.CallToolResult:
        """Run one library verb as `who` (None: the verb takes no caller) and answer with its result.

        The verbs that write create the state directory themselves (as for the CLI)."""
        ws = state.workspace()
        lead = () if who is None else (who,)
        result = fn(ws, *lead, *args, env=state.env, **kwargs)
        state.keep_open(ws, result.get("session_id") or getattr(who, "session_id", None))
        return _answer(result)

    @server.tool(description="Join (or create) a session as an agent; remembers the identity for later calls. "
                             "Returns agent_id, session_id, run_token.")
    def start_session(session_id: SessionId = None, agent_id: AgentId = None,
                      harness_conversation_id: str | None = None, harness: str | None = None,
                      substrate: str | None = None, run_token: RunToken = None, new_session: bool = False,
                      ctx: Context = None) -> StartResult:
        answer = act(actions.start, None, agent_id=agent_id, session_id=session_id,
                     harness=harness or state.env.get(actions.ENV_HARNESS) or _client_name(ctx) or "mcp",
                     substrate=substrate,
                     conversation_id=harness_conversation_id, run_token=run_token, new_session=new_session)
        state.remember(answer.structured_content)
        return answer

    @server.tool(description="Write this agent's heartbeat (status/task kept unless given).")
    def beat(status: STATUSES | None = None, task: str | None = None,
             ttl_s: Annotated[float | None, Field(gt=0)] = None, note: str | None = None,
             agent_id: AgentId = None, session_id: SessionId = None, run_token: RunToken = None) -> BeatResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.beat, who, status=status, task=task, ttl_s=ttl_s, note=note)

    @server.tool(description="Send a signal. to: '*' (all), an agent id, or a sub-agent (id.name). "
                             "sender_id: you or your sub-agent.")
    def signal(to: str, content: str, type: SIGNAL_TYPES = "inform", sender_id: str | None = None,
               reply_to: str | None = None, agent_id: AgentId = None, session_id: SessionId = None,
               run_token: RunToken = None) -> SignalResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.signal, who, to, content, type=type, sender_id=sender_id, reply_to=reply_to)

    @server.tool(description="Your signals, oldest first (unread only by default). Marks nothing read.",
                 annotations=ro)
    def read_signals(unread_only: bool = True, limit: Annotated[int | None, Field(gt=0)] = None,
                     agent_id: AgentId = None, session_id: SessionId = None,
                     run_token: RunToken = None) -> SignalsResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.read_signals, who, unread_only=unread_only, limit=limit)

    @server.tool(description="Mark signals read: full ids or unique 8+ char prefixes, or all=true.")
    def ack_signals(signal_ids: list[str] | None = None, all: bool = False, agent_id: AgentId = None,
                    session_id: SessionId = None, run_token: RunToken = None) -> AckResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.ack_signals, who, list(signal_ids or []), all=all)

    @server.tool(description="Deliver signals not yet delivered to you.")
    def signals_pending(agent_id: AgentId = None, session_id: SessionId = None,
                        run_token: RunToken = None) -> _Result:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.signals_pending, who, method="poll")

    @server.tool(description="The session's notes: the newest `limit`, oldest first.", annotations=ro)
    def read_notes(session_id: SessionId = None, limit: Annotated[int, Field(gt=0)] = 50,
                   agent_id: AgentId = None) -> NotesResult:
        who = state.who(agent_id, session_id)
        return act(actions.read_notes, who, session_id=session_id, limit=limit)

    @server.tool(description="Append a note to the session's notes bus.")
    def note(text: str, agent_id: AgentId = None, session_id: SessionId = None,
             run_token: RunToken = None) -> NoteResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.note, who, text)

    @server.tool(description="The session's agents: status and effective (heartbeat) status.", annotations=ro)
    def list_agents(session_id: SessionId = None, agent_id: AgentId = None) -> AgentsResult:
        who = state.who(agent_id, session_id)
        return act(actions.list_agents, who, session_id=session_id)

    @server.tool(description="Set a shared whiteboard entry.")
    def write_whiteboard(key: str, value: str, agent_id: AgentId = None, session_id: SessionId = None,
                         run_token: RunToken = None) -> EntryResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.whiteboard_write, who, key, value)

    @server.tool(description="Read a whiteboard entry ({entry}), or all without key ({entries}).",
                 annotations=ro)
    def read_whiteboard(key: str | None = None, session_id: SessionId = None, agent_id: AgentId = None) -> _Result:
        who = state.who(agent_id, session_id)
        return act(actions.whiteboard_read, who, key, session_id=session_id)

    @server.tool(description="Done: go idle, stage memories (strings or {text,key,tags}); the last active "
                             "agent consolidates them and ends the session.")
    def tired(memories: list[str | dict[str, Any]] | str | None = None, agent_id: AgentId = None,
              session_id: SessionId = None, run_token: RunToken = None) -> TiredResult:
        from . import sleep

        who = state.who(agent_id, session_id, run_token)
        return act(sleep.tired, who, memories=memories)

    @server.tool(description="Claim a work item (file path, ticket:N) for ttl_s; wait_s waits for a holder. "
                             "Returns the claim with its fencing token.")
    def claim(item: str, ttl_s: Annotated[float | None, Field(gt=0)] = None,
              wait_s: Annotated[float, Field(ge=0)] = 0, agent_id: AgentId = None, session_id: SessionId = None,
              run_token: RunToken = None) -> ClaimResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.claim, who, item, ttl_s=ttl_s, wait_s=wait_s)

    @server.tool(description="Release your claim; force (with reason) releases another's.")
    def release(item: str, force: bool = False, reason: str | None = None, agent_id: AgentId = None,
                session_id: SessionId = None, run_token: RunToken = None) -> ClaimResult:
        who = state.who(agent_id, session_id, run_token)
        return act(actions.release, who, item, force=force, reason=reason)

    @server.tool(description="Fencing check: succeeds only while token is the live holder's token of item.",
                 annotations=ro)
    def claim_check(item: str, token: int, agent_id: AgentId = None, session_id: SessionId = None) -> _Result:
        who = state.who(agent_id, session_id)
        return act(actions.claim_check, who, item, token)


def _resource_error(error: SynapolisError) -> ResourceError:
    cls = ResourceNotFoundError if isinstance(error, (NotFoundError, UsageError)) else ResourceError
    return cls(error_line(error))


def _register_resources(server: SynapolisMCP, state: ServerState) -> None:
    from . import actions

    @server.resource(mcp_watch.INBOX_TEMPLATE, name="inbox", mime_type="application/json",
                     description="Unread signals of agent_id: {signals}. Reading marks them delivered (push).")
    def inbox(session_id: str, agent_id: str) -> str:
        try:
            result = actions.inbox(state.workspace(), session_id, agent_id, method="push")
        except SynapolisError as exc:
            raise _resource_error(exc) from None
        return json.dumps(result, ensure_ascii=False, default=str)

    @server.resource(mcp_watch.NOTES_TEMPLATE, name="notes", mime_type="application/json",
                     description="The session's notes bus: {notes}, newest 50, oldest first.")
    def notes(session_id: str) -> str:
        try:
            result = actions.read_notes(state.workspace(), None, session_id=session_id, env=state.env)
        except SynapolisError as exc:
            raise _resource_error(exc) from None
        return json.dumps(result, ensure_ascii=False, default=str)


def _register_subscriptions(server: SynapolisMCP, state: ServerState) -> None:
    """`resources/subscribe` (protocol revisions up to 2025-11-25) and `subscriptions/listen` (2026-07-28+)."""

    async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        key = _connection_key(ctx.session)
        try:
            await state.subscribe(uri, key)
        except SynapolisError as exc:
            raise MCPError(types.INVALID_PARAMS, error_line(exc), data={"uri": uri}) from None
        state.connections[key] = ctx.session
        return types.EmptyResult()

    async def on_unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        state.subscriptions.remove(str(params.uri), _connection_key(ctx.session))
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
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)
    server.middleware.append(track_listen)
