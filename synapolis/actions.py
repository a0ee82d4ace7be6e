"""Every verb of §3/§5/§7 as a library function, each returning the contract's JSON object for its verb.

The CLI prints these answers, the MCP server returns them and the hooks use them; none rebuilds one.
Each verb acts as its caller through `agent_call.as_agent` (identity, heartbeat refresh, piggyback).
"""

from __future__ import annotations

import os
from datetime import datetime

from . import identity, retries
from .agent_call import as_agent, in_session, registrations
from .atomic import locked
from . import signals as sig
from .errors import (AmbiguousIdentityError, BusyError, ConflictError, ForbiddenError, NotFoundError, SynapolisError,
                     UsageError)
from .heartbeat import check_fields, write_heartbeat
from .identity import Who
from .names import (check_limit, check_text, generate_agent_id, refuse_reserved, validate_agent_id,
                    validate_claim_item, validate_session_id)
from .sessions import (active_sessions, agent_row, create_session, each_store, ensure_session, is_live, read_session,
                       reopen_session, session_exists, sessions_of_agent, ts)
from .store import clock, open_session, store_for
from .timeutil import format_ts, humanize_age, parse_ts

ENV_HARNESS = "SYNAPOLIS_HARNESS"
ENV_SUBSTRATE = "SYNAPOLIS_SUBSTRATE"


# -- start -----------------------------------------------------------------------------------------

def _choose_session(ws, session_id, new_session, now) -> tuple[str, bool]:
    """(session id, created?) for start: the named one, a new one, or the only active one."""
    if session_id is not None:
        if not session_exists(ws, session_id):
            return ensure_session(ws, session_id, now)
        if read_session(ws, session_id).get("status") != "active":
            reopen_session(ws, session_id, now)
        open_session(ws, session_id, create=True).close()  # a crash may have left only session.json
        return session_id, False
    if new_session:
        return create_session(ws, None, now), True
    active = active_sessions(ws)
    if len(active) == 1:
        return active[0], False
    if len(active) > 1:
        raise AmbiguousIdentityError(f"{len(active)} sessions are active ({', '.join(active[:5])}"
                                     f"{', ...' if len(active) > 5 else ''}): pass --session-id or --new-session")
    return create_session(ws, None, now), True


def _may_join(ws, agent_id: str, run_token: str | None, elsewhere: list, now: datetime) -> None:
    """Whether `start` may register `agent_id` in one more session, given its registrations `elsewhere`:
    a presented token must be one of theirs (exit 7); with none presented (require_run_token), the id
    must not be live in another active session (exit 3: it is active elsewhere); a stale one is free."""
    if run_token is not None:
        if not any(identity.token_matches(run_token, row["run_token"]) for _active, row in elsewhere):
            raise ForbiddenError(f"wrong run token for agent {agent_id}: it matches none of its registrations")
        return
    if any(active and is_live(row, now, ws.config) for active, row in elsewhere):
        raise ConflictError(f"agent {agent_id} is active in another session: present its run token to join "
                            "this one as well, or pick another --agent-id")


def start(ws, *, agent_id: str | None = None, session_id: str | None = None, harness: str | None = None,
          substrate: str | None = None, conversation_id: str | None = None, run_token: str | None = None,
          new_session: bool = False, deterministic_id: bool = False, env=None, piggyback: bool = True,
          now: datetime | None = None, write_identity: bool = True, vouched: bool = False) -> dict:
    """`start_session`: register the agent in a session, beat, write identity.json, drain (startup_drain).

    `vouched`: the transport proved the caller is `agent_id` by its own credential (a bearer token pinned to
    it, docs/MCP.md): it takes its agent back at once, live or not, under a fresh run token (a presented
    one must still be right)."""
    env = os.environ if env is None else env
    now = clock(ws, now)
    if agent_id is not None:
        validate_agent_id(agent_id)
    if session_id is not None:
        validate_session_id(session_id)
    if run_token is not None and not (isinstance(run_token, str) and run_token.strip()):
        raise UsageError("run token must not be empty")
    env_agent = env.get(identity.ENV_AGENT) or None
    if agent_id is None and env_agent and conversation_id is None:
        agent_id = validate_agent_id(env_agent, identity.ENV_AGENT)
        env_session = env.get(identity.ENV_SESSION) or None
        if run_token is None and env.get(identity.ENV_TOKEN) and (session_id is None or env_session in (None, session_id)):
            run_token = env[identity.ENV_TOKEN]
    if session_id is None and not new_session and env.get(identity.ENV_SESSION):
        session_id = validate_session_id(env[identity.ENV_SESSION], identity.ENV_SESSION)
    harness = harness or env.get(ENV_HARNESS) or "cli"
    substrate = substrate or env.get(ENV_SUBSTRATE) or None
    for value, what in ((harness, "harness"), (substrate or "", "substrate")):
        if len(check_text(value, what)) > 128:
            raise UsageError(f"{what} is longer than 128 characters")
    for value, what in ((conversation_id, "conversation id"), (run_token, "run token")):
        if value is not None:
            check_text(value, what)
    if agent_id is None:
        agent_id = generate_agent_id(substrate, harness, conversation_id, deterministic=deterministic_id)
    refuse_reserved(agent_id)
    ws.ensure()
    with locked(ws.paths.lock("sessions")):  # two first agents must not each create a session
        session_id, created = _choose_session(ws, session_id, new_session, now)
    # the id's registrations in other sessions: an id is one agent across the state directory (one
    # heartbeat file, claims held by name), so joining another session must not mint a second token
    # for someone else's id (docs/SECURITY.md)
    elsewhere = registrations(ws, agent_id, skip=session_id) \
        if run_token is not None or (ws.config.require_run_token and not vouched) else []
    with open_session(ws, session_id) as store, store.write() as conn:
        row = agent_row(conn, agent_id)
        stamp = ts(now)
        if row is None and elsewhere:
            _may_join(ws, agent_id, run_token, elsewhere, now)
        if row is not None:
            if run_token is not None:
                if not identity.token_matches(run_token, row["run_token"]):
                    raise ForbiddenError(f"wrong run token for agent {agent_id} in session {session_id}")
                token, how = run_token, "reclaimed"
            elif vouched:
                token, how = identity.new_token(), "reclaimed"
            elif is_live(row, now, ws.config):
                age = (now - parse_ts(row["last_heartbeat"])).total_seconds()
                raise ConflictError(
                    f"agent {agent_id} is already active in session {session_id} (last heartbeat "
                    f"{humanize_age(age)}): present its run token to reclaim it, or pick another --agent-id")
            else:
                token, how = identity.new_token(), "taken_over"
            conn.restart_agent(agent_id, harness=harness, substrate=substrate or "", stamp=stamp,
                               run_token=identity.hash_token(token))
        else:
            token, how = run_token or identity.new_token(), "joined"
            conn.register_agent(agent_id, harness=harness, substrate=substrate or "", stamp=stamp,
                                run_token=identity.hash_token(token))
        pending, remaining = sig.drain_page(conn, agent_id, "startup_drain", now, ws.config,
                                            limit=sig.PIGGYBACK_LIMIT, budget_chars=sig.PIGGYBACK_BUDGET_CHARS) \
            if piggyback else ([], 0)
        # the files before the commit: when one cannot be written (identity.json is a folder, the disk is
        # full) the registration and the drain roll back, instead of committing an agent whose run token
        # nobody was shown (locked out until stale) and signals marked delivered that no answer carried.
        # No lock is taken here that is ever held while waiting for the store's write lock.
        doc = write_heartbeat(ws.paths, agent_id, harness=harness, substrate=substrate, session_id=session_id,
                              status="active", now=format_ts(now))
        if store_for(ws).kind != "sqlite":  # the copy other machines read (§12), after the local file
            conn.put_heartbeat(doc, ts(now))
        if write_identity:
            identity.write_identity_file(ws, agent_id, session_id, token, harness=harness, substrate=substrate)
    return {"agent_id": agent_id, "session_id": session_id, "run_token": token, "status": "active",
            "registration": how, "created_session": created, "harness": harness, "substrate": substrate,
            "heartbeat": doc, "pending_signals": pending, "pending_remaining": remaining}


# -- beat ------------------------------------------------------------------------------------------

def beat(ws, who: Who | None = None, *, status: str | None = None, task: str | None = None,
         ttl_s: float | None = None, note: str | None = None, env=None, piggyback: bool = True,
         method: str = "piggyback", now: datetime | None = None) -> dict:
    """Write the caller's heartbeat (default status active) and its registry row; an agent in no session
    still gets its heartbeat file."""
    env = os.environ if env is None else env
    check_fields(status=status, task=task, note=note, ttl_s=ttl_s)  # before anything is written (§2)
    fields = {"status": status or "active"}
    if task is not None:
        fields["task"] = task
    if ttl_s is not None:
        fields["ttl_s"] = ttl_s
    if note is not None:
        fields["note"] = note
    calls = []
    try:
        with as_agent(ws, who, env=env, piggyback=piggyback, method=method, need_session=False,
                      need_registration=False, now=now) as call:
            calls.append(call)
            if not call.registered and env.get(ENV_HARNESS):
                fields["harness"] = env[ENV_HARNESS]
            result = call.finish({}, beat=fields, durable=True)
            return {"heartbeat": call.heartbeat, "agent_id": call.agent_id, "session_id": call.session_id,
                    "registered": call.registered, "pending_signals": result["pending_signals"],
                    "pending_remaining": result["pending_remaining"]}
    except BusyError:
        if not calls or calls[0].heartbeat is None:
            _beat_file_anyway(ws, who, env, fields)
        raise


def _beat_file_anyway(ws, who, env, fields: dict) -> None:
    """The store is away (exit 8): the beat still lands in the agent's own heartbeat file (§12: the file is
    written first), as the caller's names say (the store that would prove them is what is away). Not for a
    caller that require_run_token refuses whatever the store says (no token at all)."""
    caller = identity.named(ws, who, env)
    if caller is None or (ws.config.require_run_token and caller.run_token is None):
        return
    beat = dict(fields)
    if env.get(ENV_HARNESS):
        beat.setdefault("harness", env[ENV_HARNESS])
    try:
        ws.ensure()
        write_heartbeat(ws.paths, caller.agent_id, session_id=caller.session_id, durable=True, **beat)
    except (SynapolisError, OSError):
        pass  # the verb fails with the store's BusyError either way


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
    listener = store_for(ws).listen(lambda sid: changed.set() if sid in (None, session) else None, listener_stop)
    observer = None if listener is not None else \
        start_observer(event_handler(on_event), ws.paths.session_dir(session), poll_interval_s=0.5,
                       event_filter=writes_only())  # our own reads of the session must not wake us
    changed.set()
    try:
        yield from first["signals"]
        last = max([s["sequence"] for s in first["signals"]] + [first["latest_sequence"]])
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


def warn_sessions(ws, incident: dict, now: datetime | None = None) -> list[dict]:
    """The escalation writer's `warn`: a broadcast from `synapolis.watchdog` into each active session
    the incident's agent is registered in (every active session for `@global`)."""
    now = clock(ws, now)
    agent = str(incident.get("agent_id") or "@global")
    targets = active_sessions(ws) if agent.startswith("@") else sessions_of_agent(ws, agent)
    condition = incident.get("condition", "failing")
    failing = [str(a) for a in incident.get("agents") or []]
    what = (f"{len(failing) or 'many'} of {incident.get('total_agents', '?')} agents are failing at once"
            f"{': ' + ', '.join(failing[:10]) if failing else ''} (incident {incident.get('id', '?')}); "
            "the machine or the monitor is the likely cause"
            if agent.startswith("@") else
            f"agent {agent} is {condition} (incident {incident.get('id', '?')}, level {incident.get('level', 1)}); "
            "its work may need taking over")
    sent = []
    for session_id in targets:
        with open_session(ws, session_id) as store, store.write() as conn:
            doc, _aud = sig.send(conn, caller=None, recipient=sig.BROADCAST, content=what, now=now,
                                 config=ws.config, type_="warn", sender=sig.SYSTEM_SENDER, rate_limited=False)
        sent.append({"session_id": session_id, "signal_id": doc["id"]})
    return sent


# -- agents, notes, whiteboard ---------------------------------------------------------------------

def _read_scope(ws, call, session_id: str | None, several_ok: bool = False) -> list[str]:
    """Sessions a read-only verb reads: the named one, the caller's, else the only active one."""
    if session_id is not None:
        read_session(ws, validate_session_id(session_id))
        return [session_id]
    if call is not None and call.session_id is not None:
        return [call.session_id]
    active = active_sessions(ws)
    if len(active) > 1 and not several_ok:
        raise AmbiguousIdentityError(f"{len(active)} sessions are active: pass --session-id")
    return active


def _finish_read(call, result: dict) -> dict:
    if call is None:
        result["pending_signals"], result["pending_remaining"] = [], 0
        return result
    return call.finish(result)


def _stores(ws, call, session_ids):
    """each_store, but the caller's own session is read through the store its call already holds (in
    the MCP server a kept connection): one open less on every read verb."""
    own = call.store if call is not None else None
    for sid in session_ids:
        if own is not None and sid == call.session_id:
            with own.read() as conn:
                yield sid, conn
        else:
            yield from each_store(ws, [sid])


def list_agents(ws, who: Who | None = None, *, session_id: str | None = None, env=None, piggyback: bool = True,
                now: datetime | None = None) -> dict:
    """The session's agents (every active session's when none is named or resolved) with registry
    status and their heartbeat's effective status."""
    from .status import heartbeat_anywhere

    now = clock(ws, now)
    with as_agent(ws, in_session(who, session_id), env=env, piggyback=piggyback, mutation=False, required=False,
                  now=now) as call:
        agents = []
        copies: dict = {}  # a shared store's heartbeat copies, read once at the first agent with no file here
        for sid, conn in _stores(ws, call, _read_scope(ws, call, session_id, several_ok=True)):
            for r in conn.agents():
                effective, beat = heartbeat_anywhere(ws, r["id"], now, copies)
                host = beat.get("host") if isinstance(beat, dict) else None
                agents.append({"id": r["id"], "session_id": sid, "harness": r["harness"],
                               "substrate": r["substrate"] or None, "status": r["status"],
                               "effective_status": effective, "host": host if isinstance(host, str) else None,
                               "last_heartbeat": r["last_heartbeat"], "joined_at": r["joined_at"],
                               "live": is_live(r, now, ws.config)})
        return _finish_read(call, {"agents": agents})


def note(ws, who: Who | None, text: str, *, env=None, piggyback: bool = True, now: datetime | None = None,
         idempotency_key: str | None = None) -> dict:
    """Append to the session's notes bus. With `idempotency_key`, a retry answers as the first call did and
    appends nothing (retries.py)."""
    from . import board  # here and in the whiteboard's verbs: no other hot verb loads the board

    board.check_note(text, ws.config)
    key = retries.check_key(idempotency_key)
    with as_agent(ws, who, env=env, piggyback=piggyback, now=now) as call:
        call.beat_now()  # outside the locks: the file write need not serialize writers
        # all or nothing: the store's write lock first (busy: nothing appended, exit 8), and a failure
        # after the append (the commit, a key stored already) takes the note back
        try:
            with store_for(ws).note_appender(call.session_id) as add, call.store.write() as conn:
                return call.finish({"note": add(conn, call.agent_id, text, call.now, key)}, conn)
        except Exception as exc:
            if not retries.replays(key, exc):
                raise
            return retries.replay_note(call, key, exc, text=text)


NOTES_BUDGET_CHARS = 48 * 1024  # JSON characters of notes in one answer (a note may be max_content_bytes long)


def read_notes(ws, who: Who | None = None, *, session_id: str | None = None, limit: int = 50,
               before: int | None = None, budget_chars: int | None = None, env=None, piggyback: bool = True,
               now: datetime | None = None) -> dict:
    """A page of the session's notes, oldest first: the newest `limit` (below seq `before` when given) that
    fit `budget_chars`, with `remaining` (older notes) and `next_before` (the next page's `before`)."""
    check_limit(limit)
    if before is not None and (not isinstance(before, int) or isinstance(before, bool) or before < 1):
        raise UsageError(f"before must be a note seq (a whole number >= 1), not {before!r}")
    budget_chars = NOTES_BUDGET_CHARS if budget_chars is None else budget_chars
    with as_agent(ws, in_session(who, session_id), env=env, piggyback=piggyback, mutation=False, required=False,
                  now=now) as call:
        scope = _read_scope(ws, call, session_id)
        notes = _notes_page(ws, scope[0], limit, before) if scope else []
        notes = [_marked(n) for n in notes[len(notes) - _fit_newest(notes, budget_chars):]]
        remaining = max(0, notes[0]["seq"] - 1) if notes else 0  # seqs count up from 1 (board.append_note)
        return _finish_read(call, {"notes": notes, "session_id": scope[0] if scope else None,
                                   "remaining": remaining, "next_before": notes[0]["seq"] if remaining else None})


def _marked(note: dict) -> dict:
    """A note with `person` when a person wrote it (synapolis.people)."""
    from .names import PERSON_PREFIX

    if note.get("agent_id", "").startswith(PERSON_PREFIX):
        return {**note, "person": note["agent_id"][len(PERSON_PREFIX):]}
    return note


def _notes_page(ws, session_id: str, limit: int, before: int | None) -> list[dict]:
    """The newest `limit` notes below `before`: the store reads them from the end, and seqs are unique
    and increasing, so the newest `limit + (last - before + 1)` notes hold them all."""
    store = store_for(ws)
    if before is None:
        return store.read_notes(session_id, limit)
    newest = store.read_notes(session_id, 1)
    if not newest:
        return []
    skip = max(0, newest[-1]["seq"] - before + 1)
    return [n for n in store.read_notes(session_id, limit + skip) if n["seq"] < before][-limit:]


def _fit_newest(notes: list[dict], budget_chars: int) -> int:
    """How many of the newest `notes` fit `budget_chars` as JSON (at least one, so paging never stalls)."""
    import json

    used = 0
    for count, item in enumerate(reversed(notes)):
        used += len(json.dumps(item["text"])) + len(item["agent_id"]) + 80
        if used > budget_chars and count > 0:
            return count
    return len(notes)


def whiteboard_write(ws, who: Who | None, key: str, value: str, *, env=None, piggyback: bool = True,
                     now: datetime | None = None) -> dict:
    """Set a whiteboard entry (last writer wins)."""
    from . import board

    with as_agent(ws, who, env=env, piggyback=piggyback, now=now) as call:
        call.beat_now()  # outside the write lock: the file write need not serialize writers
        with call.store.write() as conn:
            entry = board.write_entry(conn, key, value, call.agent_id, call.now, ws.config)
            return call.finish({"entry": entry}, conn)


WHITEBOARD_PAGE = 100  # entries in one answer without a key
WHITEBOARD_BUDGET_CHARS = 48 * 1024


def whiteboard_read(ws, who: Who | None = None, key: str | None = None, *, session_id: str | None = None,
                    after: str | None = None, limit: int | None = None, env=None, piggyback: bool = True,
                    now: datetime | None = None) -> dict:
    """One whiteboard entry (`entry`; NotFoundError when missing), or a page of them by key (`entries`, the
    keys after `after`: at most `limit` (100) and 48 KB, with `remaining` and `next_after`)."""
    from . import board

    if key is not None:
        board.check_key(key)
    if after is not None:
        board.check_key(after)
    check_limit(limit)
    with as_agent(ws, in_session(who, session_id), env=env, piggyback=piggyback, mutation=False, required=False,
                  now=now) as call:
        scope = _read_scope(ws, call, session_id)
        if not scope:
            if key is not None:
                raise NotFoundError(f"no whiteboard key {key!r}: there is no active session")
            return _finish_read(call, {"entries": [], "session_id": None})
        with open_session(ws, scope[0]) as store, store.read() as conn:
            result = {"entry": board.read_entry(conn, key)} if key is not None else \
                _entries_page(board.read_entries(conn), after, WHITEBOARD_PAGE if limit is None else limit)
        result["session_id"] = scope[0]
        return _finish_read(call, result)


def _entries_page(entries: list[dict], after: str | None, limit: int) -> dict:
    """The entries (sorted by key) after `after` that fit `limit` and the budget (at least one)."""
    import json

    rest = [e for e in entries if after is None or e["key"] > after]
    page, used = [], 0
    for entry in rest[:limit]:
        used += len(json.dumps(entry["value"])) + len(entry["key"]) + 120
        if page and used > WHITEBOARD_BUDGET_CHARS:
            break
        page.append(entry)
    remaining = len(rest) - len(page)
    return {"entries": page, "remaining": remaining, "next_after": page[-1]["key"] if remaining else None}


# -- claims (contract §9; the lock helper itself is synapolis.claims) ------------------------------

def claim(ws, who: Who | None, item: str, *, ttl_s: float | None = None, wait_s: float = 0, env=None,
          piggyback: bool = True, now: datetime | None = None) -> dict:
    """Claim (or renew) `item` as the caller."""
    from . import claims

    # refuse bad input before as_agent writes anything (a heartbeat refresh is a write)
    item = validate_claim_item(_item(ws, item))
    claims.check_ttl(ttl_s, ws.config)
    claims.check_wait(wait_s)
    with as_agent(ws, who, env=env, piggyback=piggyback, need_session=False, need_registration=False,
                  now=now) as call:
        call.beat_now()  # first: a refresh that fails (a full disk) leaves the claim untouched
        try:
            record = claims.claim(ws, item, call.agent_id, session_id=call.session_id, ttl_s=ttl_s,
                                  wait_s=wait_s, now=now)
        except ConflictError as exc:
            if "cycle" in exc.details:
                _tell_deadlock(ws, call.agent_id, item, exc)
            raise
        # the claim happened: a busy store only costs the piggyback, never the verb's exit code
        answer = dict(record)
        answer["overlaps"] = list(getattr(record, "overlaps", []))
        return call.finish({"claim": answer, "event": getattr(record, "event", None)}, best_effort=True)


def _tell_deadlock(ws, agent_id: str, item: str, refused) -> None:
    """Record the refused wait for the dashboard and hand its cycle to the notify targets (contract §15:
    io.synapolis.claims.deadlock); never raises (guard_events.tell)."""
    from .guard_events import deadlock

    deadlock(ws, agent_id, item, refused.details["cycle"])


def _item(ws, item):
    """A path item normalised (`./`, `//`, an absolute path inside the project; contract §14); a name as given."""
    from .names import is_name

    if not isinstance(item, str) or is_name(item):
        return item  # a name's claim loads none of the path machinery
    from .project import normalize_item

    return normalize_item(ws, item)


def release(ws, who: Who | None, item: str, *, force: bool = False, reason: str | None = None, env=None,
            piggyback: bool = True, now: datetime | None = None) -> dict:
    """Release `item` as the caller (another's only with force and a reason)."""
    from . import claims

    item = validate_claim_item(_item(ws, item))
    claims.check_force(force, reason)
    with as_agent(ws, who, env=env, piggyback=piggyback, need_session=False, need_registration=False,
                  now=now) as call:
        call.beat_now()  # first: a refresh that fails (a full disk) leaves the claim untouched
        record = claims.release(ws, item, call.agent_id, force=force, reason=reason, now=now)
        return call.finish({"claim": dict(record), "event": getattr(record, "event", None)}, best_effort=True)


def claim_check(ws, who: Who | None, item: str, token, *, env=None, now: datetime | None = None) -> dict:
    """The fencing check: the live claim record, StaleToken (exit 7) or NotFoundError (exit 6).

    It acts as nobody (a guarded write checks on its own, whoever runs it), so it delivers nothing; `who`
    and `env` are accepted so every surface calls it like any verb, and a wrong run token in them is
    refused. (Listing the claims is no agent's verb either: the CLI's `claims` calls `claims.list_claims`,
    as the status screen does.)"""
    from . import claims
    from .agent_call import check_presented

    check_presented(ws, who, env=env)  # a run token it is given must still be right (exit 7)
    return {"claim": claims.check(ws, _item(ws, item), token, now=now), "live": True, "pending_signals": [],
            "pending_remaining": 0}


def guard(ws, who: Who | None = None, paths=(), *, env=None, now: datetime | None = None) -> dict:
    """May the caller write `paths`? (contract §14; synapolis.guard.guard). A pure query: no refresh, no delivery."""
    from .guard import guard as ask

    return ask(ws, who, paths, now=now, env=env)
