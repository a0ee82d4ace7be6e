"""What one MCP server holds across its clients: the state directory, the stores kept open, the
subscriptions and their watcher, and who each client is."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ..atomic import file_signature
from ..errors import ForbiddenError
from ..identity import Who
from ..paths import CONFIG_NAME
from ..workspace import Workspace
from . import watch
from .live import LongLived
from .memory import IdentityMemory, Remembered, stateless_key

log = logging.getLogger(__name__)

MAX_KEPT = 16  # sessions whose database one server holds open (LongLived pools)


class Principal:
    """Who is at the other end of a transport, as the transport proved it: a local stdio client (the harness
    that started this process), or an HTTP client by its token (name, the agent it is pinned to, read-only)."""

    __slots__ = ("name", "agent_id", "read_only", "remote", "key", "secret")

    def __init__(self, name: str | None, agent_id: str | None = None, read_only: bool = False,
                 remote: bool = True, key: str | None = None, secret: str | None = None):
        self.name, self.agent_id, self.read_only, self.remote = name, agent_id, read_only, remote
        # key: the token's SHA-256 (which token, whatever its name); secret: the bearer token this request
        # presented, held for the request only (it seals what a restarted server must remember, memory.seal)
        self.key, self.secret = key, secret

    def __repr__(self) -> str:  # never the secret
        return f"Principal(name={self.name!r}, agent_id={self.agent_id!r}, read_only={self.read_only!r})"

    def acting_as(self, agent_id: str | None) -> str | None:
        """The agent a call naming `agent_id` acts as: a pinned token's own agent (or one of its sub-agents,
        `agent.name`, when the call names one); ForbiddenError for anyone else."""
        if self.agent_id is None:
            return agent_id
        if agent_id is not None and not self.covers(agent_id):
            raise ForbiddenError(f"token {self.name} acts only as {self.agent_id}")
        return agent_id or self.agent_id

    def covers(self, agent_id: str) -> bool:
        """Whether this principal may act as `agent_id` (a pinned token: its agent and sub-agents only)."""
        return self.agent_id is None or agent_id == self.agent_id or agent_id.startswith(self.agent_id + ".")

    def check_may_write(self) -> None:
        if self.read_only:
            raise ForbiddenError(f"token {self.name} is read-only: it may only read")


LOCAL = Principal(None, remote=False)
PRINCIPAL_KEY = "synapolis.principal"  # where the HTTP app's authentication leaves it, in the ASGI scope
LOCAL_CLIENT = ("local",)


def principal_of(ctx) -> Principal:
    """The principal of the request `ctx` belongs to (a tool's Context, or a low-level handler's or middleware's
    request context): LOCAL over stdio (and in-process), else the HTTP token."""
    request = getattr(getattr(ctx, "request_context", ctx), "request", None) if ctx is not None else None
    if request is None:
        return LOCAL
    principal = getattr(request, "scope", {}).get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):  # the app always authenticates first; never act on a gap
        raise ForbiddenError("this request carries no valid token")
    return principal


class ServerState:
    """What one server holds across its clients: the state directory, its environment, each client's
    remembered identity, and the subscriptions with their watcher."""

    def __init__(self, state_dir, env=None, *, force_polling: bool = False, fast: bool = True):
        self.root = Path(state_dir).absolute()
        self.env = dict(os.environ if env is None else env)
        self.memory = IdentityMemory()  # client key -> what start_session made it (memory_key)
        self.bus = InMemorySubscriptionBus()
        self.subscriptions = watch.Subscriptions()
        self.connections: dict[Any, Any] = {}  # legacy subscriber key -> ServerSession to notify
        self.force_polling = force_polling
        self.fast = fast
        self.watcher: watch.SessionWatcher | None = None
        self.change_feed = False  # the team server: the watcher also reports any change (the dashboard)
        self.changes = 0  # counted by the watcher's thread; read on the loop
        self._change_event = None
        self._listeners = 0  # next_change calls waiting on the loop: only they need it woken
        self._loop = None  # the event loop (asyncio's: uvicorn's), for the watcher's thread to wake
        # stores held open, callers resolved, refreshes coalesced between calls (live.LongLived)
        self.live = LongLived(max_sessions=MAX_KEPT)
        self._ws: tuple | None = None  # (config file signature, Workspace)
        self._config_path = os.path.join(self.root, CONFIG_NAME)
        self._kind: tuple | None = None  # (Workspace, whether its store is SQLite)
        self._users = 0
        self._token = None  # the event loop's, for the watcher's thread to deliver on
        self._lock = threading.Lock()

    def workspace(self, create: bool = False) -> Workspace:
        """The state directory and its config, re-read only when synapolis.json changed (an edit applies
        to the next call without restarting the harness)."""
        signature = file_signature(self._config_path)
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

    def on_sqlite(self, ws) -> bool:
        """Whether `ws` (a workspace() answer) keeps its sessions in SQLite, rather than a shared store."""
        kept = self._kind
        if kept is None or kept[0] is not ws:
            kept = self._kind = (ws, ws.store.kind == "sqlite")
        return kept[1]

    # -- identity: one rule per transport (docs/MCP.md, "Identity") ----------------------------------
    def _memory_key(self, ctx, principal: Principal):
        """Under which key this client's identity lives: over stdio (and in-process) the process's one client,
        in either protocol era; over HTTP in the handshake era its MCP session (one client for its whole
        life, owned by one token); over HTTP in the 2026-07-28 era, which has no sessions, what each request
        carries: its bearer token and the client identity in its `_meta`, when it sends one."""
        key = client_key(ctx)
        if not principal.remote:
            return key
        request_context = getattr(ctx, "request_context", ctx)
        if request_context.protocol_version not in MODERN_PROTOCOL_VERSIONS and key != LOCAL_CLIENT:
            return key
        return stateless_key(principal.key or principal.name or "", client_info(ctx))

    def recall(self, ctx, principal: Principal) -> Remembered | None:
        """What start_session made this client (with this same token)."""
        key = self._memory_key(ctx, principal)
        # only a stateless client's identity may be in the file (a restarted server's): no workspace otherwise
        ws = self.workspace() if key[0] == "stateless" else None
        return self.memory.recall(key, principal.key or principal.name, ws, principal.secret)

    def remember(self, ctx, result: dict) -> None:
        principal = principal_of(ctx)
        key = self._memory_key(ctx, principal)
        self.memory.remember(key, Remembered(result["agent_id"], result["session_id"], result.get("run_token"),
                                             principal.key or principal.name),
                             self.workspace() if principal.remote else None, principal.secret)

    def forget(self, key) -> None:
        """A client ended (an HTTP session's DELETE): its identity and subscriptions go with it."""
        self.memory.forget(key)
        self.subscriptions.drop_holder(key)
        self.connections.pop(key, None)

    def who(self, ctx, agent_id=None, session_id=None, run_token=None, *, writes: bool = True):
        """Who a tool call acts as. A pinned token acts only as its agent and that agent's sub-agents, and
        vouches for them (no run token needed; a wrong one presented is still refused). Explicit arguments
        first; this client's remembered identity fills what they leave out (its run token only for that
        agent in that session); a pinned token with nothing remembered is its own agent; a local caller then
        falls back to env and identity.json, a remote one never does. A read-only token may not write and
        reads as nobody (a read as an agent refreshes it)."""
        principal = principal_of(ctx)
        if principal.read_only:
            if writes:
                principal.check_may_write()
            if agent_id is not None or run_token is not None:
                raise ForbiddenError(f"token {principal.name} is read-only: it reads as no agent")
            return Who(None, session_id, None, named_only=True)
        if agent_id is not None:
            principal.acting_as(agent_id)  # a pinned token names only its agent and sub-agents
        pinned = principal.agent_id is not None
        mem = self.recall(ctx, principal)
        if mem is not None and (agent_id not in (None, mem.agent_id)
                                or not principal.covers(mem.agent_id)):
            mem = None
        if mem is None:
            agent = agent_id if agent_id is not None else principal.agent_id
            return Who(agent, session_id, run_token, named_only=principal.remote, vouched=pinned)
        same_session = session_id in (None, mem.session_id)
        # a vouched caller needs no remembered run token: the agent may since have been taken back (a
        # restarted harness) under a new one, which the remembered one would now contradict
        kept = None if pinned or not same_session else mem.run_token
        return Who(mem.agent_id, session_id or mem.session_id, run_token or kept,
                   named_only=principal.remote, vouched=pinned)

    def check_may_watch(self, ctx, uri: str) -> None:
        """May this client be told of changes to `uri`? An inbox's news (a signal arrived for that agent) is
        the inbox's to hear, as its content is: a read-only token reads no inbox, and a token pinned to an
        agent watches only that agent's and its sub-agents'. ForbiddenError otherwise; UsageError for a URI
        that is not ours. Notes are everyone's to read, and so to watch."""
        kind, _session_id, agent_id = watch.parse_uri(uri)
        principal = principal_of(ctx)
        if kind != "inbox" or not principal.remote:
            return
        if principal.read_only:
            raise ForbiddenError(f"token {principal.name} is read-only: it watches no inbox")
        principal.acting_as(agent_id)

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
                    if self.change_feed:  # an HTTP session that ended: its subscriptions go with it
                        self.subscriptions.drop_holder(holder)
                        self.connections.pop(holder, None)

    # -- the change feed (the dashboard's live updates) -------------------------------------------------
    def _counted(self) -> None:
        """On the watcher's thread: something in the state directory changed. The count goes up at once; the
        loop is woken only when a listener waits (a page's /events): with no page open, a write costs the
        loop nothing (a blocking call into it per write was two thread wake-ups, ~0.1-0.3 ms of CPU)."""
        self.changes += 1  # only this thread writes it
        if self._listeners:  # read after the count: a listener that missed the count is counted here
            self._loop.call_soon_threadsafe(self._wake_listeners)

    def _wake_listeners(self) -> None:
        """On the event loop: wake every waiting listener."""
        event, self._change_event = self._change_event, anyio.Event()
        event.set()

    async def next_change(self, seen: int, timeout_s: float) -> int:
        """The change count once it passes `seen`, or after `timeout_s` (then unchanged)."""
        self._listeners += 1  # before looking at the count (see _counted)
        try:
            if self.changes == seen:
                with anyio.move_on_after(timeout_s):
                    await self._change_event.wait()
        finally:
            self._listeners -= 1
        return self.changes

    async def subscribe(self, uri: str, holder) -> None:
        """Watch `uri` for `holder` from now on: what it holds now is the baseline, not news."""
        ws = self.workspace()
        watch.parse_uri(uri)  # a URI that is not ours starts no watcher

        def watch_and_measure():
            self._start_watcher()  # before the baseline, so nothing stored after it goes unseen
            return watch.current_value(ws, uri)

        baseline = await anyio.to_thread.run_sync(watch_and_measure)
        self.subscriptions.add(uri, holder, baseline)
        if self.watcher is not None:
            # a signal stored between the baseline and the registration woke a check that did not
            # know this URI yet; look once more so it is not missed until the next event
            self.watcher.mark_dirty(watch.parse_uri(uri)[1])

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

            self.watcher = watch.SessionWatcher(ws, self.subscriptions, notify, force_polling=self.force_polling,
                                                on_change=self._counted if self.change_feed else None).start()

    async def start_change_feed(self) -> None:
        """The team server: watch the whole state directory from the start, for the dashboard (and push)."""
        import asyncio

        self.change_feed = True
        self._change_event = anyio.Event()
        self._loop = asyncio.get_running_loop()  # uvicorn runs asyncio (or uvloop, an asyncio loop)
        await anyio.to_thread.run_sync(self._start_watcher)

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


def client_info(ctx) -> dict | None:
    """The client identity a request carries: `_meta`'s clientInfo in the 2026-07-28 era (each request
    sends it), else the handshake's; None when there is none."""
    from mcp_types import CLIENT_INFO_META_KEY

    request_context = getattr(ctx, "request_context", ctx)
    meta = getattr(request_context, "meta", None)
    info = None
    if meta is not None:
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else getattr(meta, "model_extra", {}).get(
            CLIENT_INFO_META_KEY)
    if info is None:
        try:
            params = request_context.session.client_params
            info = params.client_info.model_dump(mode="json", exclude_none=True) if params and params.client_info \
                else None
        except (AttributeError, ValueError):
            info = None
    return info if isinstance(info, dict) else None


def client_key(ctx) -> tuple:
    """Which client a request (a tool's Context, or a low-level handler's request context) comes from, told
    apart as the SDK's migration guide says (the per-connection object is not reachable from a request): a
    stateful HTTP session by its `mcp-session-id` (the SDK refuses that id to any token but the one that
    opened the session); anything else is the server's one local client, since stdio serves one connection
    per process. An in-process server object shared by several in-memory clients sees them as one."""
    request_context = getattr(ctx, "request_context", ctx)
    headers = getattr(request_context.request, "headers", None)
    session_id = headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None
    return ("http", session_id) if session_id else LOCAL_CLIENT

