"""The MCP server (contract §10): every verb as a tool, the inbox and notes resources, push to subscribers.

A thin layer: each tool resolves who is calling, calls the same `actions.*` / `sleep.tired` function as the
CLI, and returns its JSON answer as structured content (with `pending_signals`). This module imports the
MCP SDK at the top, so only `synapolis mcp` may import it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
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

from . import actions, mcp_watch
from .paths import CONFIG_NAME
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

MAX_KEPT = 16  # sessions whose database one server holds open (LongLived pools)
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
    fast_stdio = True

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

    async def run_stdio_async(self) -> None:
        """stdio as the SDK serves it, but on the event loop's own pipe I/O where stdin and stdout are pipes
        or sockets (what every harness gives a server): the SDK's file wrapper runs each readline, write and
        flush on a worker thread, three thread hops per message. Anything else (a file, a terminal): the SDK's."""
        from mcp.server.stdio import stdio_server

        if not (self.fast_stdio and _pipes(0, 1)):
            return await super().run_stdio_async()
        async with _pipe_stdio() as (stdin, stdout), stdio_server(stdin, stdout) as (read_stream, write_stream):
            await self._lowlevel_server.run(read_stream, write_stream,
                                            self._lowlevel_server.create_initialization_options())


def _pipes(*fds: int) -> bool:
    import stat

    if os.name != "posix":
        return False
    try:
        return all(stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in fds)
    except OSError:
        return False


class _PipeLines:
    """stdin as the SDK's stdio_server reads it (`async for line`), straight from the event loop."""

    def __init__(self, reader):
        self._reader = reader
        self._buffer = bytearray()
        self._scanned = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end + 1])
                del self._buffer[:end + 1]
                self._scanned = 0
                return line.decode("utf-8", errors="replace")
            self._scanned = len(self._buffer)
            chunk = await self._reader.read(1 << 16)
            if not chunk:  # end of input: a last line without its newline still counts, as for readline
                if not self._buffer:
                    raise StopAsyncIteration
                line, self._buffer[:] = bytes(self._buffer), b""
                return line.decode("utf-8", errors="replace")
            self._buffer += chunk


class _PipeWriter:
    """stdout as the SDK's stdio_server writes it (`await write`, `await flush`), without a thread."""

    def __init__(self, writer):
        self._writer = writer

    async def write(self, text: str) -> None:
        if self._writer.transport.is_closing():
            raise anyio.ClosedResourceError  # the client went away: the SDK's writer ends quietly on this
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            raise anyio.ClosedResourceError from None


@asynccontextmanager
async def _pipe_stdio():
    """(stdin lines, stdout writer) on private duplicates of fds 0 and 1, as the SDK's stdio does: while the
    server runs, fd 0 reads /dev/null and fd 1 writes to stderr, so a stray print or a child process never
    corrupts the protocol; both are put back on the way out."""
    import asyncio
    import fcntl

    loop = asyncio.get_running_loop()
    wire_in = os.fdopen(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3), "rb", buffering=0)
    wire_out = os.fdopen(fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        try:
            os.dup2(2, 1)
        except OSError:  # no stderr: stray output goes nowhere rather than onto the wire
            os.dup2(null, 1)
    finally:
        os.close(null)
    transports = []
    try:
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire_in)
        transports.append(transport)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, wire_out)
        transports.append(transport)
        yield _PipeLines(reader), _PipeWriter(asyncio.StreamWriter(transport, protocol, None, loop))
    finally:
        for fd, wire in ((0, wire_in), (1, wire_out)):
            try:
                os.dup2(wire.fileno(), fd)
                os.set_blocking(fd, True)
            except (OSError, ValueError):
                pass
        for transport in transports:
            transport.close()  # closes its duplicate
        for wire in (wire_in, wire_out)[len(transports):]:
            wire.close()


class ServerState:
    """What one `synapolis mcp` process holds: the state directory, its environment, the remembered
    identity, and the subscriptions with their watcher."""

    def __init__(self, state_dir, env=None, *, force_polling: bool = False, fast: bool = True):
        self.root = Path(state_dir).absolute()
        self.env = dict(os.environ if env is None else env)
        self.remembered: Remembered | None = None
        self.bus = InMemorySubscriptionBus()
        self.subscriptions = mcp_watch.Subscriptions()
        self.connections: dict[Any, Any] = {}  # legacy subscriber key -> ServerSession to notify
        self.force_polling = force_polling
        self.fast = fast
        self.watcher: mcp_watch.SessionWatcher | None = None
        # stores held open, callers resolved, refreshes coalesced between calls (actions.LongLived)
        self.live = actions.LongLived(max_sessions=MAX_KEPT)
        self._ws: tuple | None = None  # (config file signature, Workspace)
        self._users = 0
        self._token = None  # the event loop's, for the watcher's thread to deliver on
        self._lock = threading.Lock()

    def workspace(self, create: bool = False) -> Workspace:
        """The state directory and its config, re-read only when synapolis.json changed (an edit applies
        to the next call without restarting the harness)."""
        signature = actions.file_signature(os.path.join(self.root, CONFIG_NAME))
        cached = self._ws
        if self.fast and cached is not None and signature is not None and cached[0] == signature:
            ws = cached[1]
        else:
            ws = Workspace.open(self.root, env=self.env)
            # a file changed within the last seconds may change again within its mtime's granularity with
            # the same size (an in-place edit): trusted only once it is older (git's "racy clean" rule)
            settled = signature is not None and time.time_ns() - signature[2] > 2_000_000_000
            self._ws = (signature, ws) if settled else None
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
        """Hold a connection to a session this server works in, for the server's life (LongLived.hold).

        When the last connection to a WAL database closes, SQLite checkpoints and deletes the WAL, and the
        next opener rebuilds its index: with one connection held here every verb's own open and close is
        cheap (a read verb drops from ~20 ms to a few ms here), the CLI's and hooks' included.
        """
        self.live.hold(ws, session_id)

    def close_kept(self) -> None:
        self.live.close()

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
        mcp_watch.parse_uri(uri)  # a URI that is not ours starts no watcher

        def watch_and_measure():
            self._start_watcher()  # before the baseline, so nothing stored after it goes unseen
            return mcp_watch.current_value(ws, uri)

        baseline = await anyio.to_thread.run_sync(watch_and_measure)
        self.subscriptions.add(uri, holder, baseline)
        if self.watcher is not None:
            # a signal stored between the baseline and the registration woke a check that did not
            # know this URI yet; look once more so it is not missed until the next event
            self.watcher.mark_dirty(mcp_watch.parse_uri(uri)[1])

    def start_watching(self, token) -> None:
        """The server is up: push may start. The watcher itself starts with the first subscription: its
        threads wake on every write to the sessions folder, our own tool calls' included, which costs
        every call of a server nobody subscribed to (most clients today) a share of a small machine."""
        with self._lock:
            self._users += 1
            self._token = token

    def _start_watcher(self) -> None:
        with self._lock:
            if self.watcher is not None or self._users <= 0:
                return
            ws = self.workspace(create=True)
            token = self._token

            def notify(uris):
                anyio.from_thread.run(self.deliver, uris, token=token)

            self.watcher = mcp_watch.SessionWatcher(ws, self.subscriptions, notify,
                                                    force_polling=self.force_polling).start()

    def stop_watching(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
            watcher = self.watcher if last else None
            if last:
                self.watcher = None
        if last:
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


def create_server(state_dir, env=None, *, force_polling: bool = False, fast: bool = True) -> SynapolisMCP:
    """Build the server for one state directory; `env` is what the harness gave the process.

    `fast=False` does per call what the CLI does (resolve, open, refresh; the SDK's stdio; every verb on a
    worker thread; the watcher from the start): the baseline benchmarks/bench_mcp.py measures against.
    """
    from importlib.metadata import PackageNotFoundError, version

    state = ServerState(state_dir, env, force_polling=force_polling, fast=fast)

    @asynccontextmanager
    async def lifespan(_server):
        state.start_watching(anyio.lowlevel.current_token())
        if not fast:
            await anyio.to_thread.run_sync(state._start_watcher)
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
    server.fast_stdio = fast
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
        with actions.long_lived(state.live if state.fast else None):
            result = fn(ws, *lead, *args, env=state.env, **kwargs)
        state.keep_open(ws, result.get("session_id") or getattr(who, "session_id", None))
        return _answer(result)

    async def call(fn, who, *args, slow: bool = False, **kwargs) -> types.CallToolResult:
        """`act` on the event loop itself while nobody has subscribed to anything, else on a worker thread.

        A thread hop is two wake-ups (the worker, then the loop), a millisecond or more of a round trip on a
        busy small machine. Inline, a verb that waits (a locked store, up to busy_timeout_ms) holds up the
        loop, and the only other work the loop then has is this client's own requests; once anyone
        subscribes, pushes must never wait behind a verb, so every call goes to a thread. Verbs that wait
        by design (`slow`: start_session, tired, claim with wait_s) always do.
        """
        if slow or state.watcher is not None or not state.fast:
            return await anyio.to_thread.run_sync(functools.partial(act, fn, who, *args, **kwargs))
        return act(fn, who, *args, **kwargs)

    @server.tool(description="Join (or create) a session as an agent; remembers the identity for later calls. "
                             "Returns agent_id, session_id, run_token.")
    async def start_session(session_id: SessionId = None, agent_id: AgentId = None,
                            harness_conversation_id: str | None = None, harness: str | None = None,
                            substrate: str | None = None, run_token: RunToken = None, new_session: bool = False,
                            ctx: Context = None) -> StartResult:
        answer = await call(actions.start, None, slow=True, agent_id=agent_id, session_id=session_id,
                           harness=harness or state.env.get(actions.ENV_HARNESS) or _client_name(ctx) or "mcp",
                           substrate=substrate,
                           conversation_id=harness_conversation_id, run_token=run_token, new_session=new_session)
        state.remember(answer.structured_content)
        return answer

    @server.tool(description="Write this agent's heartbeat (status/task kept unless given).")
    async def beat(status: STATUSES | None = None, task: str | None = None,
                   ttl_s: Annotated[float | None, Field(gt=0)] = None, note: str | None = None,
                   agent_id: AgentId = None, session_id: SessionId = None, run_token: RunToken = None) -> BeatResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.beat, who, status=status, task=task, ttl_s=ttl_s, note=note)

    @server.tool(description="Send a signal. to: '*' (all), an agent id, or a sub-agent (id.name). "
                             "sender_id: you or your sub-agent.")
    async def signal(to: str, content: str, type: SIGNAL_TYPES = "inform", sender_id: str | None = None,
                     reply_to: str | None = None, agent_id: AgentId = None, session_id: SessionId = None,
                     run_token: RunToken = None) -> SignalResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.signal, who, to, content, type=type, sender_id=sender_id, reply_to=reply_to)

    @server.tool(description="Your signals, oldest first (unread only by default). Marks nothing read.",
                 annotations=ro)
    async def read_signals(unread_only: bool = True, limit: Annotated[int | None, Field(gt=0)] = None,
                           agent_id: AgentId = None, session_id: SessionId = None,
                           run_token: RunToken = None) -> SignalsResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.read_signals, who, unread_only=unread_only, limit=limit)

    @server.tool(description="Mark signals read: full ids or unique 8+ char prefixes, or all=true.")
    async def ack_signals(signal_ids: list[str] | None = None, all: bool = False, agent_id: AgentId = None,
                          session_id: SessionId = None, run_token: RunToken = None) -> AckResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.ack_signals, who, list(signal_ids or []), all=all)

    @server.tool(description="Deliver signals not yet delivered to you.")
    async def signals_pending(agent_id: AgentId = None, session_id: SessionId = None,
                              run_token: RunToken = None) -> _Result:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.signals_pending, who, method="poll")

    @server.tool(description="The session's notes: the newest `limit`, oldest first.", annotations=ro)
    async def read_notes(session_id: SessionId = None, limit: Annotated[int, Field(gt=0)] = 50,
                         agent_id: AgentId = None) -> NotesResult:
        who = state.who(agent_id, session_id)
        return await call(actions.read_notes, who, session_id=session_id, limit=limit)

    @server.tool(description="Append a note to the session's notes bus.")
    async def note(text: str, agent_id: AgentId = None, session_id: SessionId = None,
                   run_token: RunToken = None) -> NoteResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.note, who, text)

    @server.tool(description="The session's agents: status and effective (heartbeat) status.", annotations=ro)
    async def list_agents(session_id: SessionId = None, agent_id: AgentId = None) -> AgentsResult:
        who = state.who(agent_id, session_id)
        return await call(actions.list_agents, who, session_id=session_id)

    @server.tool(description="Set a shared whiteboard entry.")
    async def write_whiteboard(key: str, value: str, agent_id: AgentId = None, session_id: SessionId = None,
                               run_token: RunToken = None) -> EntryResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.whiteboard_write, who, key, value)

    @server.tool(description="Read a whiteboard entry ({entry}), or all without key ({entries}).",
                 annotations=ro)
    async def read_whiteboard(key: str | None = None, session_id: SessionId = None,
                              agent_id: AgentId = None) -> _Result:
        who = state.who(agent_id, session_id)
        return await call(actions.whiteboard_read, who, key, session_id=session_id)

    @server.tool(description="Done: go idle, stage memories (strings or {text,key,tags}); the last active "
                             "agent consolidates them and ends the session.")
    async def tired(memories: list[str | dict[str, Any]] | str | None = None, agent_id: AgentId = None,
                    session_id: SessionId = None, run_token: RunToken = None) -> TiredResult:
        from . import sleep

        who = state.who(agent_id, session_id, run_token)
        return await call(sleep.tired, who, memories=memories, slow=True)

    @server.tool(description="Claim a work item (file path, ticket:N) for ttl_s; wait_s waits for a holder. "
                             "Returns the claim with its fencing token.")
    async def claim(item: str, ttl_s: Annotated[float | None, Field(gt=0)] = None,
                    wait_s: Annotated[float, Field(ge=0)] = 0, agent_id: AgentId = None, session_id: SessionId = None,
                    run_token: RunToken = None) -> ClaimResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.claim, who, item, ttl_s=ttl_s, wait_s=wait_s, slow=wait_s > 0)

    @server.tool(description="Release your claim; force (with reason) releases another's.")
    async def release(item: str, force: bool = False, reason: str | None = None, agent_id: AgentId = None,
                      session_id: SessionId = None, run_token: RunToken = None) -> ClaimResult:
        who = state.who(agent_id, session_id, run_token)
        return await call(actions.release, who, item, force=force, reason=reason)

    @server.tool(description="Fencing check: succeeds only while token is the live holder's token of item.",
                 annotations=ro)
    async def claim_check(item: str, token: int, agent_id: AgentId = None, session_id: SessionId = None) -> _Result:
        who = state.who(agent_id, session_id)
        return await call(actions.claim_check, who, item, token)


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
