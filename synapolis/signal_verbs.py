"""The signal verbs (§3, §5): signal, read-signals, ack-signals, signals-pending, the MCP inbox and --follow."""

from __future__ import annotations

from datetime import datetime

from . import retries
from .agent_call import as_agent, in_session
from . import signals as sig
from .errors import ForbiddenError, UsageError
from .identity import Who
from .names import check_limit, validate_agent_id, validate_session_id

from .store import open_session


# -- signals ---------------------------------------------------------------------------------------

def signal(ws, who: Who | None, to: str, content: str, *, type: str = "inform", sender_id: str | None = None,
           reply_to: str | None = None, env=None, piggyback: bool = True, now: datetime | None = None,
           idempotency_key: str | None = None) -> dict:
    """Send one signal; the answer names its audience (live, waiting) and carries pending signals. With
    `idempotency_key`, a retry of the same call answers as the first did and stores nothing (retries.py)."""
    key = retries.check_key(idempotency_key)
    with as_agent(ws, who, env=env, piggyback=piggyback, now=now) as call:
        call.beat_now()  # outside the write lock: the file write need not serialize writers
        try:
            with call.store.write() as conn:
                signal_doc, audience = sig.send(conn, caller=call.agent_id, recipient=to, content=content,
                                                now=call.now, config=ws.config, type_=type, sender=sender_id,
                                                reply_to=reply_to, idempotency_key=key)
                return call.finish({"signal": signal_doc, "audience": audience, "session_id": call.session_id}, conn)
        except Exception as exc:
            if not retries.replays(key, exc):
                raise
            return retries.replay_signal(call, key, exc, to=to, content=content, type_=type, sender=sender_id,
                                         config=ws.config)


def read_signals(ws, who: Who | None = None, *, unread_only: bool = True, limit: int | None = None, env=None,
                 after: int | None = None, budget_chars: int | None = None, now: datetime | None = None) -> dict:
    """Pure query: one page of the caller's signals oldest first (unread only, or everything including
    history): `signals`, `remaining`, `next_after` (signals.page; at most `limit`, default PAGE_LIMIT).

    Marks nothing delivered and nothing read (EP-0118's CQS); it only refreshes the heartbeat.
    """
    check_limit(limit)
    _check_after(after)
    with as_agent(ws, who, env=env, piggyback=False, mutation=False, now=now) as call:
        with call.store.read() as conn:
            found = sig.page(conn, call.agent_id, unread_only=unread_only, after=after, limit=limit,
                             budget_chars=budget_chars)
            latest = sig.latest_visible_sequence(conn, call.agent_id)
        call.finish()
        return {**found, "agent_id": call.agent_id, "session_id": call.session_id, "latest_sequence": latest}


def _check_after(after) -> None:
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise UsageError(f"after must be a signal sequence (a whole number >= 0), not {after!r}")


def ack_signals(ws, who: Who | None, ids, *, all: bool = False, env=None, piggyback: bool = True,
                now: datetime | None = None) -> dict:
    """Mark signals read: full ids or unique prefixes of 8+ hex characters, or every unread one."""
    if not all and not ids:
        raise UsageError("name the signals to ack (comma-separated ids or prefixes), or pass --all")
    with as_agent(ws, who, env=env, piggyback=piggyback, now=now) as call:
        call.beat_now()  # outside the write lock: the file write need not serialize writers
        with call.store.write() as conn:
            acked = sig.ack(conn, call.agent_id, ids, call.now, all_visible=all)
            # bounded like every answer: `--all` over a backlog of 100,000 would list 6 MB of ids
            return call.finish({"acked": acked[:ACKED_SHOWN], "acked_count": len(acked)}, conn)


ACKED_SHOWN = 1000  # ids an ack answer lists (the oldest); `acked_count` says how many were acked


WITHHELD_SHOWN = 500  # undelivered signals a `withheld` answer lists (the oldest)


def signals_pending(ws, who: Who | None = None, *, env=None, method: str = "poll", limit: int | None = None,
                    budget_chars: int | None = None, fits=None, status: str | None = None,
                    withheld: bool = False, change_mark: bool = False, now: datetime | None = None) -> dict:
    """Drain the caller's undelivered signals (`poll`; hooks pass `hook`, which also redelivers).

    A page as big as read_signals' unless `limit`/`budget_chars` say otherwise; `fits(taken, candidate)`
    (a hook's answer budget) instead decides signal by signal, oldest first, so exactly the signals that
    fit are marked delivered. `status` goes into the heartbeat refresh (a hook: `active`). `withheld` adds
    the caller's unread signals still undelivered after the drain (the oldest WITHHELD_SHOWN), read in
    the same transaction: what a hook summarises instead of showing. `change_mark` adds, when nothing at
    all is unread after the drain, the store's change counter read in that transaction and the caller's
    registered harness and substrate (else None): what a hook's quiet path remembers (harness.quiet).
    """
    check_limit(limit)
    if budget_chars is None and fits is None:
        budget_chars = sig.PAGE_BUDGET_CHARS
    with as_agent(ws, who, env=env, piggyback=True, method=method, now=now) as call:
        # outside the write lock: the file write need not serialize writers
        call.beat_now({"status": status} if status else None)
        with call.store.write() as conn:
            result = call.finish({}, conn, limit=sig.PAGE_LIMIT if limit is None else limit,
                                 budget_chars=budget_chars, fits=fits)
            if withheld:
                result["withheld"] = [s for s in sig.unread(conn, call.agent_id, limit=WITHHELD_SHOWN)
                                      if s.get("delivered_at") is None]
            if change_mark:
                mark = None if sig.unread(conn, call.agent_id, limit=1) else conn.change_mark()
                result["change_mark"] = None if mark is None else {
                    "mark": mark, "harness": call.row["harness"], "substrate": call.row["substrate"] or None}
            return result


def inbox(ws, who: Who | None, session_id: str, agent_id: str, *, env=None, method: str = "push",
          limit: int | None = None, after: int | None = None, now: datetime | None = None) -> dict:
    """The MCP inbox resource: a page of the caller's own unread signals (signals.page); the ones in it not
    yet delivered are marked with `method`: exactly what the answer holds.

    Only the agent itself may read it, proven as for any verb (its run token included): the read marks
    signals delivered, so anyone else's read would steal the delivery. A stranger gets ForbiddenError, and
    nothing is marked.
    """
    validate_session_id(session_id)
    validate_agent_id(agent_id)
    check_limit(limit)
    _check_after(after)
    who = who or Who()
    refusal = f"the inbox of {agent_id} in session {session_id} is read only by that agent itself"
    if who.agent_id is not None and who.agent_id != agent_id:
        raise ForbiddenError(refusal)
    with as_agent(ws, in_session(who, session_id), env=env, piggyback=False, now=now) as call:
        if (call.agent_id, call.session_id) != (agent_id, session_id):
            raise ForbiddenError(refusal)
        with call.store.write() as conn:
            found = sig.page(conn, agent_id, unread_only=True, after=after, limit=limit)
            sig.mark_delivered(conn, agent_id, found["signals"], method, call.now)
            result = call.finish(found, conn)
    del result["pending_signals"], result["pending_remaining"]
    return result


def follow_signals(ws, who: Who | None = None, *, unread_only: bool = True, limit: int | None = None, env=None,
                   stop=None, safety_wait_s: float = 5.0):
    """Yield the caller's signals, then each new one as it is stored, until `stop` (an Event) is set.

    New signals are noticed by the store's push (PostgreSQL's LISTEN/NOTIFY), or by watching the session
    folder (synapolis.watching: inotify where the system has it, polling otherwise); `safety_wait_s`
    re-checks in case an event was missed.
    """
    import threading

    from .rules.signals import follow_from
    from .watching import event_handler, start_observer, stop_observer, writes_only

    stop = stop or threading.Event()
    changed = threading.Event()
    first = read_signals(ws, who, unread_only=unread_only, limit=limit, env=env)
    agent, session = first["agent_id"], first["session_id"]

    def on_event(event):
        if not event.is_directory:
            changed.set()

    # watching starts before the first signals are handed out, so whoever has seen them knows that
    # every later one is noticed at once: a shared store pushes (LISTEN/NOTIFY); the SQLite store's
    # session folder is watched. What came between the first read and now is read by the first check.
    listener_stop = threading.Event()
    listener = ws.store.listen(lambda sid: changed.set() if sid in (None, session) else None, listener_stop)
    observer = None if listener is not None else \
        start_observer(event_handler(on_event), ws.paths.session_dir(session), poll_interval_s=0.5,
                       event_filter=writes_only())  # our own reads of the session must not wake us
    changed.set()
    try:
        yield from first["signals"]
        last = follow_from(first, limit)  # past a page cut by its size, the rest of the unread come next
        with open_session(ws, session) as store:
            while not stop.is_set():
                changed.wait(safety_wait_s)
                changed.clear()
                if stop.is_set():
                    break
                with store.read() as conn:
                    new = sig.query(conn, agent, unread_only=unread_only, include_history=True, after=last)
                for item in new:
                    last = max(last, item["sequence"])
                    yield item
    finally:
        listener_stop.set()
        if observer is not None:
            stop_observer(observer)
