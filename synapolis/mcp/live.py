"""What the long-lived MCP server keeps between the verbs it runs (`LongLived`): session stores held open,
resolved callers, and its own recent heartbeat refreshes, so a pure refresh within a second is coalesced."""

from __future__ import annotations

import contextlib
import contextvars
import os
from datetime import datetime

from .. import agent_call, identity
from ..atomic import file_signature
from ..config import Config
from ..errors import BusyError, SynapolisError
from ..identity import Who
from ..sessions import registry_status, ts
from ..store.pool import SessionPool
from ..workspace import Workspace

COALESCE_S = 1.0  # a pure refresh within this long of this process's last write of it is skipped


class NoWait:
    """One attempt at a verb that must not wait (the MCP server runs a verb on its event loop this way):
    the session stores it gets from LongLived wait for no lock, and `blocked` says one was locked. A store
    refuses a locked transaction as it begins (or commits, rolled back) with BusyError, so a verb whose store
    work is one transaction at its end has then changed nothing in the store and may run again elsewhere."""

    __slots__ = ("blocked",)

    def __init__(self):
        self.blocked = False


_NO_WAIT: contextvars.ContextVar = contextvars.ContextVar("synapolis_no_wait", default=None)


@contextlib.contextmanager
def not_waiting(attempt: NoWait):
    """Run the verbs called inside as `attempt`: their LongLived session stores never wait for a lock."""
    token = _NO_WAIT.set(attempt)
    try:
        yield attempt
    finally:
        _NO_WAIT.reset(token)


class _NotWaitingStore:
    """A session store (one that waits for no lock) lent to a NoWait attempt: a BusyError the store raises
    itself (as a transaction begins or commits, or for a statement of its body: a read takes its lock at its
    first statement) is its refusal to wait, noted on the attempt. One the body raised is something else (a
    file lock that waited its time) and is left alone."""

    __slots__ = ("_store", "_attempt")

    def __init__(self, store, attempt: NoWait):
        self._store, self._attempt = store, attempt

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read(self):
        return self._noted(self._store.read())

    def write(self):
        return self._noted(self._store.write())

    @contextlib.contextmanager
    def _noted(self, transaction):
        from_body = None
        try:
            with transaction as tx:
                try:
                    yield tx
                except BaseException as exc:
                    from_body = exc
                    raise
        except BusyError as exc:
            if exc is not from_body:
                self._attempt.blocked = True
            raise


def refresh_is_redundant(last: dict | None, fields: dict, row, signature, now: datetime, window_s: float) -> bool:
    """Whether a refresh with `fields` at `now` may be skipped, given what this process last wrote (`last`:
    at, doc, signature, registry) and what is there now (the registry `row`, the file's `signature`).

    Only when it changes nothing: written less than the window ago (and not in the future), the same status,
    task, ttl, harness and substrate, no note (a note belongs to one beat), the file still the one written
    here, and the registry row still saying what was written there. The window is at most a quarter of the
    agent's ttl (or stale_after_s), so a coalesced agent is never near stale.
    """
    if last is None:
        return False
    doc = last["doc"]
    age = (now - last["at"]).total_seconds()
    if not 0 <= age < window_s:
        return False
    if fields.get("note"):
        return False
    for key in ("status", "task", "ttl_s", "harness", "substrate"):
        if key in fields and fields[key] != doc.get(key):
            return False
    if signature is None or signature != last["signature"]:
        return False
    expected = last["registry"]
    if (row is None) != (expected is None):
        return False
    return row is None or (row["last_heartbeat"], row["status"]) == expected


class LongLived:
    """What one long-lived process (the MCP server) keeps between the verbs it runs, so that it does not
    repeat per call what did not change: session stores held open, resolved callers, its own recent refreshes.

    Turned on per verb with `agent_call.as_agent(..., live=...)` or `with agent_call.long_lived(live):`; only
    `synapolis mcp` does. Other processes resolve and refresh everything on every call and borrow stores from
    the process's smaller pool (store.lend_session). Thread-safe: the SDK runs tools on worker threads; each
    verb gets a store of its own from the pool.
    """

    def __init__(self, window_s: float = COALESCE_S, max_sessions: int = 16, idle_per_session: int = 4):
        agent_call.enable_long_lived()  # before any verb runs in this process (the server builds one at start)

        self.window_s = window_s
        self.pool = SessionPool(max_sessions, idle_per_session)  # session stores held open
        self._callers: dict = {}  # everything a resolution read -> Caller
        self._refreshes: dict = {}  # (root, agent_id, session_id) -> what this process last wrote
        self._ensured: dict = {}  # root -> when ws.ensure() last ran
        self._not_waiting: tuple | None = None  # (a workspace, its copy whose stores wait for no lock)

    # -- identity ---------------------------------------------------------------------------------
    def resolve(self, ws, who: Who | None, *, env=None, required: bool = True, need_session: bool = True, now=None):
        """`identity.resolve`, remembered when nothing it read can change: an agent and a session named by
        the call or the environment. identity.json (which may lend the run token) is part of the key by
        its signature; a resolution that needs identity.json's agent or a session search is never kept."""
        who = who or Who()
        env = {} if who.named_only else os.environ if env is None else env
        names = (who.agent_id, who.session_id, who.run_token, env.get(identity.ENV_AGENT) or None,
                 env.get(identity.ENV_SESSION) or None, env.get(identity.ENV_TOKEN) or None)
        if (names[0] or names[3]) is None or (names[1] or names[4]) is None:
            return identity.resolve(ws, who, env=env, required=required, need_session=need_session, now=now)
        key = (os.fspath(ws.paths.root), names, who.named_only, who.vouched, required, need_session,
               file_signature(ws.paths.identity))
        caller = self._callers.get(key)
        if caller is None:
            caller = identity.resolve(ws, who, env=env, required=required, need_session=need_session, now=now)
            if caller is not None and caller.source in ("options", "env"):
                if len(self._callers) >= 256:
                    self._callers.clear()
                self._callers[key] = caller
        return caller

    # -- stores -----------------------------------------------------------------------------------
    def _without_waiting(self, ws):
        """`ws` with a busy timeout of 0: the stores opened through it refuse a lock at once (BusyError)."""
        kept = self._not_waiting
        if kept is not None and kept[0] is ws:
            return kept[1]
        copy = Workspace(ws.paths, Config({**ws.config.values, "busy_timeout_ms": 0}))
        self._not_waiting = (ws, copy)
        return copy

    @contextlib.contextmanager
    def store(self, ws, session_id: str):
        """A store for one verb, from this process's pool (store.pool.SessionPool: an idle one when its
        database is still the same file, else a new one; NotFoundError for a missing session). Inside
        `not_waiting`, one that waits for no lock (the pool keeps both kinds)."""
        attempt = _NO_WAIT.get()
        if attempt is not None:
            ws = self._without_waiting(ws)
        loan = self.pool.lend(ws, session_id)
        try:
            store = loan.__enter__()
        except BusyError:
            if attempt is not None:  # opening reads the schema's version: refused like any read
                attempt.blocked = True
            raise
        try:
            yield store if attempt is None else _NotWaitingStore(store, attempt)
        except BaseException as exc:
            loan.__exit__(type(exc), exc, exc.__traceback__)
            raise
        loan.__exit__(None, None, None)

    def hold(self, ws, session_id: str | None) -> None:
        """Keep one connection to a session this process works in (see docs/MCP.md): when the last
        connection to a WAL database closes, SQLite checkpoints and deletes the WAL, and the next opener,
        the CLI's and hooks' included, rebuilds its index."""
        if not session_id or self.pool.holds(ws, session_id):
            return
        try:
            with self.store(ws, session_id):
                pass
        except SynapolisError:
            pass

    def close(self) -> None:
        self.pool.close()

    # -- the heartbeat refresh --------------------------------------------------------------------
    def ensure(self, ws, now: datetime) -> None:
        """`ws.ensure()`, at most once per window: the folders it creates do not come and go."""
        root = os.fspath(ws.paths.root)
        last = self._ensured.get(root)
        if last is None or not 0 <= (now - last).total_seconds() < self.window_s:
            ws.ensure()
            self._ensured[root] = now

    def recent_refresh(self, ws, agent_id: str, session_id: str | None, fields: dict, row, now: datetime):
        """The heartbeat this process wrote for the agent, when a refresh with `fields` now would change
        nothing (refresh_is_redundant); else None, and the caller writes."""
        last = self._refreshes.get((os.fspath(ws.paths.root), agent_id, session_id))
        if last is None:
            return None
        ttl = last["doc"].get("ttl_s") or ws.config.stale_after_s
        window = min(self.window_s, float(ttl) / 4)
        if not refresh_is_redundant(last, fields, row, file_signature(ws.paths.heartbeat(agent_id)), now, window):
            return None
        return dict(last["doc"])

    def refreshed(self, ws, agent_id: str, session_id: str | None, doc: dict, now: datetime) -> None:
        """Remember a refresh this process wrote: the document, the file, and what the registry now says."""
        self._refreshes[(os.fspath(ws.paths.root), agent_id, session_id)] = {
            "at": now, "doc": dict(doc), "signature": file_signature(ws.paths.heartbeat(agent_id)),
            "registry": (ts(now), registry_status(doc["status"])) if session_id is not None else None}
