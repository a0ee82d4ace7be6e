"""What one MCP server holds across its clients: the state directory, the stores kept open, the
subscriptions and their watcher, and who each client is."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
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
from ..store import store_for
from ..workspace import Workspace
from . import watch
from .live import LongLived

log = logging.getLogger(__name__)

MAX_KEPT = 16  # sessions whose database one server holds open (LongLived pools)


@dataclass
class Remembered:
    """The identity start_session gave one client, for its later calls; `principal` is the token it came with."""

    agent_id: str
    session_id: str
    run_token: str | None
    principal: str | None = None


class Principal:
    """Who is at the other end of a transport, as the transport proved it: a local stdio client (the harness
    that started this process), or an HTTP client by its token (name, the agent it is pinned to, read-only)."""

    __slots__ = ("name", "agent_id", "read_only", "remote")

    def __init__(self, name: str | None, agent_id: str | None = None, read_only: bool = False,
                 remote: bool = True):
        self.name, self.agent_id, self.read_only, self.remote = name, agent_id, read_only, remote

    def acting_as(self, agent_id: str | None) -> str | None:
        """The agent a call naming `agent_id` acts as: a pinned token's own agent (or one of its sub-agents,
        `agent.name`, when the call names one); ForbiddenError for anyone else."""
        if self.agent_id is None:
            return agent_id
        if agent_id is not None and agent_id != self.agent_id and not agent_id.startswith(self.agent_id + "."):
            raise ForbiddenError(f"token {self.name} acts only as {self.agent_id}")
        return agent_id or self.agent_id

    def check_may_write(self) -> None:
        if self.read_only:
            raise ForbiddenError(f"token {self.name} is read-only: it may only read")


LOCAL = Principal(None, remote=False)
PRINCIPAL_KEY = "synapolis.principal"  # where the HTTP app's authentication leaves it, in the ASGI scope
LOCAL_CLIENT = ("local",)
MAX_REMEMBERED = 10_000  # HTTP sessions whose identity one server remembers (the SDK's own session limit)


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
        self.remembered: OrderedDict[Any, Remembered] = OrderedDict()  # client_key -> identity, newest last
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
            kept = self._kind = (ws, store_for(ws).kind == "sqlite")
        return kept[1]

    # -- identity: per MCP session, never per server process ------------------------------------------
    def _memory_key(self, ctx, principal: Principal):
        """Under which key this client's remembered identity lives: its HTTP session in the handshake era (a
        session is one client for its whole life); the server's one local client over stdio (one connection
        per process), in either era; nothing for a remote client in the 2026-07-28 era, which has no
        sessions: each call names its agent, or the token pins it."""
        key = client_key(ctx)
        if not principal.remote:
            return key
        modern = ctx.request_context.protocol_version in MODERN_PROTOCOL_VERSIONS
        return None if modern or key == LOCAL_CLIENT else key

    def recall(self, ctx, principal: Principal) -> Remembered | None:
        """What start_session remembered for this client (made with this same token)."""
        key = self._memory_key(ctx, principal)
        mem = self.remembered.get(key) if key is not None else None
        if mem is None or mem.principal != principal.name:
            return None
        self.remembered.move_to_end(key)
        return mem

    def remember(self, ctx, result: dict) -> None:
        principal = principal_of(ctx)
        key = self._memory_key(ctx, principal)
        if key is None:
            return
        self.remembered[key] = Remembered(result["agent_id"], result["session_id"], result.get("run_token"),
                                          principal.name)
        self.remembered.move_to_end(key)
        while len(self.remembered) > MAX_REMEMBERED:  # sessions that ended without a DELETE (idle, gone)
            self.remembered.popitem(last=False)

    def forget(self, key) -> None:
        """A client ended (an HTTP session's DELETE): its identity and subscriptions go with it."""
        self.remembered.pop(key, None)
        self.subscriptions.drop_holder(key)
        self.connections.pop(key, None)

    def who(self, ctx, agent_id=None, session_id=None, run_token=None, *, writes: bool = True):
        """Who a tool call acts as. A pinned token fixes the agent (naming another is refused); explicit
        arguments next; this client's remembered identity fills what they leave out (its run token only for
        that agent in that session); a local caller then falls back to env and identity.json, a remote one
        never does. A read-only token may not write and reads as nobody (a read as an agent refreshes it)."""
        principal = principal_of(ctx)
        if principal.read_only:
            if writes:
                principal.check_may_write()
            if agent_id is not None or run_token is not None:
                raise ForbiddenError(f"token {principal.name} is read-only: it reads as no agent")
            return Who(None, session_id, None, named_only=True)
        agent_id = principal.acting_as(agent_id)
        mem = self.recall(ctx, principal)
        if mem is None or agent_id not in (None, mem.agent_id):
            return Who(agent_id, session_id, run_token, named_only=principal.remote)
        same_session = session_id in (None, mem.session_id)
        return Who(mem.agent_id, session_id or mem.session_id,
                   run_token or (mem.run_token if same_session else None), named_only=principal.remote)

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

