"""The per-call plumbing every verb runs through: resolve and prove the caller (§3), open its session
store, and on leaving refresh its heartbeat and attach its undelivered signals (`as_agent`, `AgentCall`)."""

from __future__ import annotations

from datetime import datetime

from . import identity
from . import signals as sig
from .errors import ForbiddenError, NoIdentityError, NotFoundError, SynapolisError
from .heartbeat import write_heartbeat
from .identity import Who
from .sessions import agent_row, each_store, registry_status, ts
from .store import clock, lend_session
from .timeutil import format_ts


def registrations(ws, agent_id: str, skip: str | None = None) -> list[tuple[bool, object]]:
    """(session active?, registry row) for every registration of `agent_id`, in every session (ended ones
    too) but `skip`. A store that cannot be read is left out: what it would prove stays unproven."""
    from .sessions import all_sessions

    active = {d["session_id"]: d.get("status") == "active" for d in all_sessions(ws)
              if isinstance(d.get("session_id"), str) and d["session_id"] != skip}
    found = []
    for sid, conn in each_store(ws, list(active), skip_broken=True):
        row = agent_row(conn, agent_id)
        if row is not None:
            found.append((active[sid], row))
    return found


def proven(ws, caller, row, required: bool) -> bool:
    """The one identity check (docs/SECURITY.md, "Identity"): may this call act as `caller.agent_id`?

    A presented run token must be the agent's: the one of its registration in the caller's session
    (`row`), or, when it is not registered there (a bare beat, a claim naming a session of the caller's
    choosing), the one of any of its registrations anywhere; otherwise ForbiddenError (exit 7), always.
    Without a token: a caller the transport vouched for (a pinned bearer token) goes ahead; else with
    require_run_token, a verb that needs its caller is refused (exit 7) and a
    reader that needs none acts as nobody (False: it refreshes and delivers nothing); with tokens off,
    the name is the identity and the call goes ahead.
    """
    if caller.run_token is not None:
        stored = [row] if row is not None else [r for _active, r in registrations(ws, caller.agent_id)]
        if not any(identity.token_matches(caller.run_token, r["run_token"]) for r in stored):
            where = f"in session {caller.session_id}" if row is not None else "in any session"
            raise ForbiddenError(f"wrong run token for agent {caller.agent_id} {where}")
        return True
    if getattr(caller, "vouched", False) or not ws.config.require_run_token:
        return True  # vouched: the transport's own credential (a pinned bearer token) proved it
    if not required:
        return False
    raise ForbiddenError(f"require_run_token is on: agent {caller.agent_id} must present its run token "
                         "(--run-token or SYNAPOLIS_RUN_TOKEN; `synapolis start` gives one)")


class AgentCall:
    """One verb acting as an agent: its identity, its session store, and the closing refresh + piggyback."""

    def __init__(self, ws, caller, store, row, now, piggyback, method, live=None):
        self.ws = ws
        self.caller = caller
        self.store = store
        self.row = row
        self.now = now
        self.piggyback = piggyback
        self.method = method
        self.live = live  # a LongLived (the MCP server) may coalesce a pure refresh; None: always write
        self.heartbeat: dict | None = None
        self.coalesced = False  # the refresh was coalesced: neither the file nor the registry was written
        self.finished = False

    @property
    def agent_id(self) -> str:
        return self.caller.agent_id

    @property
    def session_id(self) -> str | None:
        return self.caller.session_id

    @property
    def registered(self) -> bool:
        return self.row is not None

    def _refresh_heartbeat(self, beat: dict | None, durable: bool) -> dict:
        fields = dict(beat or {})
        if self.row is not None:
            fields.setdefault("harness", self.row["harness"])
            if self.row["substrate"]:
                fields.setdefault("substrate", self.row["substrate"])
        session_id = self.session_id if self.registered else None
        if self.live is not None:
            recent = self.live.recent_refresh(self.ws, self.agent_id, session_id, fields, self.row, self.now)
            if recent is not None:
                self.coalesced = True
                return recent
        doc = write_heartbeat(self.ws.paths, self.agent_id, session_id=session_id, now=format_ts(self.now),
                              durable=durable, **fields)
        if self.live is not None:
            self.live.refreshed(self.ws, self.agent_id, session_id, doc, self.now)
        return doc

    def beat_now(self, beat: dict | None = None, *, durable: bool = False) -> dict:
        """Write the heartbeat refresh now, before the verb takes the store's write lock (finish reuses it).

        `beat`: the heartbeat's fields for this refresh (status, task, ttl_s, note, harness; default: status
        active, the registration's harness); `durable`: fsync it (an explicit beat, going idle)."""
        if self.heartbeat is None:
            self.heartbeat = self._refresh_heartbeat(beat, durable)
        return self.heartbeat

    def _nothing_to_write(self) -> bool:
        """Coalesced, and a cheap read finds nothing to deliver: finish needs no write transaction.

        Hooks (method `hook`) also redeliver, which only the drain itself decides; they never coalesce anyway.
        """
        if not self.coalesced or self.method == "hook":
            return False
        if not self.piggyback:
            return True
        with self.store.read() as conn:
            return not sig.has_undelivered(conn, self.agent_id)

    def finish(self, result: dict | None = None, conn=None, *, beat: dict | None = None, durable: bool = False,
               limit: int | None = None, budget_chars: int | None = None, best_effort: bool = False,
               fits=None) -> dict:
        """Refresh the heartbeat and the registry, and attach the caller's undelivered signals.

        `beat` and `durable` are the refresh's, as for `beat_now` (when the verb has not refreshed yet).
        With `conn` (a write transaction the verb holds) everything commits together with the verb.
        A coalesced refresh (LongLived) writes neither the registry row nor, when nothing waits, anything.
        `best_effort` (a verb whose work is done and durable outside the store: claim, release): a busy
        or failing store costs only the refresh and the piggyback, rolled back so nothing is marked
        delivered, and the answer says so under `piggyback_skipped`; the verb still succeeds.
        """
        result = {} if result is None else result
        self.beat_now(beat, durable=durable)
        pending: tuple = ([], 0)
        if self.registered:
            def work(c):
                if not self.coalesced:
                    c.refresh_agent(self.agent_id, ts(self.now), registry_status(self.heartbeat["status"]))
                    c.put_heartbeat(self.heartbeat, ts(self.now))  # a shared store's copy (§12); the file was first
                if self.piggyback:
                    # a piggyback is a small page (every answer is bounded); signals_pending pages further
                    return sig.drain_page(
                        c, self.agent_id, self.method, self.now, self.ws.config,
                        limit=sig.PIGGYBACK_LIMIT if limit is None else limit,
                        budget_chars=sig.PIGGYBACK_BUDGET_CHARS if budget_chars is None and fits is None
                        else budget_chars, fits=fits)
                return [], 0
            if conn is not None:
                pending = work(conn)
            elif best_effort:
                try:
                    if not self._nothing_to_write():
                        with self.store.write() as c:
                            pending = work(c)
                except (SynapolisError, OSError) as exc:
                    pending, result["piggyback_skipped"] = ([], 0), getattr(exc, "message", None) or str(exc)
            elif not self._nothing_to_write():
                with self.store.write() as c:
                    pending = work(c)
        elif self.heartbeat is not None:
            # an agent in no session: its beat still reaches a shared store's readers (§12), after the file
            try:
                self.ws.store.put_heartbeat_copy(self.heartbeat, ts(self.now))
            except (SynapolisError, OSError) as exc:
                if not best_effort:
                    raise
                result["piggyback_skipped"] = getattr(exc, "message", None) or str(exc)
        self.finished = True
        result["pending_signals"], result["pending_remaining"] = pending
        return result


# -- what a long-lived process keeps between verbs (synapolis.mcp.live.LongLived) --------------------------

# the LongLived of the verbs running now (a contextvars.ContextVar), made by the first LongLived: the CLI,
# which never makes one, does not even import contextvars
_LIVE = None


def enable_long_lived() -> None:
    """Make the context variable `long_lived` sets: once, before any verb runs with a LongLived (its
    constructor calls this), so that no two threads ever make two."""
    global _LIVE
    if _LIVE is None:
        import contextvars

        _LIVE = contextvars.ContextVar("synapolis_long_lived", default=None)


class long_lived:
    """`with long_lived(live):` run the verbs called inside with `live` (the MCP server wraps each tool call in
    this). A class, as as_agent below."""

    def __init__(self, live):
        self.live = live
        self.token = None

    def __enter__(self):
        if _LIVE is not None:  # else no LongLived was ever made: there is nothing to set, and None is what verbs see
            self.token = _LIVE.set(self.live)
        return self.live

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            _LIVE.reset(self.token)


class as_agent:
    """`with as_agent(ws, who, ...) as call:` resolve the caller (§3), prove it (`proven`: the one identity
    check), give an AgentCall; on leaving without an error, refresh it (`call.finish`, unless the verb did).

    `required=False` (read-only verbs) gives None when no identity resolves, it is ambiguous, the
    agent is not registered in the session, or (require_run_token) it presented no token; a wrong run
    token is refused even then. `mutation` says the verb writes (the state directory is created for
    it); every verb that acts as an agent is checked alike, since each refreshes the caller's
    heartbeat and hands out its signals. `live` (a synapolis.mcp.live.LongLived; default: the one
    `long_lived` set, normally none) reuses what a long-lived process keeps and may coalesce a pure
    refresh; without it every call resolves and writes afresh, and borrows its session's store from the
    process's pool (store.lend_session). The session's store stays open for the body and is left with its
    outcome. (A class, as atomic.locked: contextlib, which would make this
    a generator, stays off the hot verbs' imports.)
    """

    def __init__(self, ws, who: Who | None = None, *, env=None, piggyback: bool = True, method: str = "piggyback",
                 mutation: bool = True, required: bool = True, need_session: bool = True,
                 need_registration: bool = True, now: datetime | None = None, live=None):
        self.ws, self.who, self.env, self.now, self.live = ws, who, env, now, live
        self.piggyback, self.method, self.mutation = piggyback, method, mutation
        self.required, self.need_session, self.need_registration = required, need_session, need_registration
        self.opened = None  # the session store's loan (the process's pool, or the LongLived's)
        self.call: AgentCall | None = None

    def __enter__(self) -> AgentCall | None:
        ws, required = self.ws, self.required
        live = self.live if self.live is not None or _LIVE is None else _LIVE.get()
        now = clock(ws, self.now)
        caller = (live if live is not None else identity).resolve(
            ws, self.who, env=self.env, required=required, need_session=self.need_session, now=now)
        if caller is None:
            return None
        store = row = None
        if caller.session_id is not None:
            try:
                opened = (live.store if live is not None else lend_session)(ws, caller.session_id)
                store = opened.__enter__()
            except NotFoundError:
                if required:  # a session that was named (or remembered) but does not exist
                    raise
                if caller.source == "identity.json":
                    # identity.json remembers a session since removed: its run token can be proven nowhere
                    # (it is not wrong, only orphaned), and a reader that needs nobody reads as nobody
                    return None
            else:
                self.opened = opened
        try:
            if store is not None:
                with store.read() as conn:
                    row = agent_row(conn, caller.agent_id)
            if row is None and self.need_registration and required:
                raise NoIdentityError(f"agent {caller.agent_id} is not registered in session {caller.session_id}: "
                                      f"run `synapolis start --agent-id {caller.agent_id} --session-id "
                                      f"{caller.session_id}`")
            # a reader that finds its caller unregistered reads as nobody, but a wrong token is refused first
            if not proven(ws, caller, row, required) or (row is None and self.need_registration):
                return None
            if self.mutation or row is not None:
                if live is not None:
                    live.ensure(ws, now)
                else:
                    ws.ensure()
        except BaseException as exc:
            self._leave(type(exc), exc, exc.__traceback__)
            raise
        self.call = AgentCall(ws, caller, store, row, now, self.piggyback, self.method, live)
        return self.call

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and self.call is not None and not self.call.finished:
            try:
                self.call.finish()
            except BaseException as exc:
                self._leave(type(exc), exc, exc.__traceback__)
                raise
        self._leave(kind, value, traceback)

    def _leave(self, kind, value, traceback) -> None:
        """Leave the session's store, telling it how the call ended (a pool keeps a store after a refusal)."""
        opened, self.opened = self.opened, None
        if opened is not None:
            opened.__exit__(kind, value, traceback)


def check_presented(ws, who: Who | None, *, env=None) -> None:
    """For a verb that acts as nobody (claim_check) called with a run token: refuse a wrong one (exit 7), as
    every verb does, without acting as anyone (nothing refreshed, nothing delivered)."""
    if who is None or who.run_token is None:
        return
    with as_agent(ws, who, env=env, piggyback=False, mutation=False, required=False) as call:
        if call is not None:
            call.finished = True  # proven: nothing to refresh, it acts as nobody


def in_session(who: Who | None, session_id: str | None = None) -> Who:
    """`who`, with the session named when one is (a read verb's --session-id)."""
    who = who or Who()
    if session_id is not None:
        return Who(who.agent_id, session_id, who.run_token, who.named_only, who.vouched)
    return who
