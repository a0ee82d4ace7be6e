"""Every verb of §3/§5/§7/§9 as a library function, each returning the contract's JSON object for its verb.

The CLI prints these answers, the MCP server returns them and the hooks use them; none rebuilds one.
Each verb acts as its caller through `agent_call.as_agent` (identity, heartbeat refresh, piggyback).
Here: start, beat and the claim verbs (a claim loads no more than `synapolis.claims`). The signal verbs live in
signal_verbs.py, list-agents/notes/whiteboard in board_verbs.py, the escalation's `warn` in alerts.py;
`actions.<verb>` finds each (imported on first use).
"""

from __future__ import annotations

import os
from datetime import datetime

from . import identity
from .agent_call import as_agent, registrations
from .atomic import locked
from . import signals as sig
from .errors import AmbiguousIdentityError, BusyError, ConflictError, ForbiddenError, SynapolisError, UsageError
from .heartbeat import check_fields, write_heartbeat
from .identity import Who
from .names import (check_text, generate_agent_id, refuse_reserved, validate_agent_id, validate_claim_item,
                    validate_session_id)
from .sessions import (active_sessions, agent_row, create_session, ensure_session, is_live, read_session,
                       reopen_session, session_exists, ts)
from .store import clock, open_session
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
        if ws.store.kind != "sqlite":  # the copy other machines read (§12), after the local file
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


def guard(ws, who: Who | None = None, paths=(), *, commit: bool = False, env=None,
          now: datetime | None = None) -> dict:
    """May the caller write `paths`? (contract §14; synapolis.guard.guard). A pure query: no refresh, no delivery.
    `commit`: asked by git's pre-commit hook, so a refusal is a refused commit, recorded and told (guard_events)
    where the store is: beside it, or on the team server for a machine that goes through one (§16)."""
    from .guard import guard as ask

    answer = ask(ws, who, paths, now=now, env=env)
    if commit and not answer["allowed"]:
        from .guard_events import commit_refused

        commit_refused(ws, answer, now=now)
    return answer


# -- the other verbs live in one module per area; `actions.<verb>` still finds each (docs/API.md) --------

_MOVED = {
    "signal": "signal_verbs",
    "read_signals": "signal_verbs",
    "ack_signals": "signal_verbs",
    "signals_pending": "signal_verbs",
    "inbox": "signal_verbs",
    "follow_signals": "signal_verbs",
    "ACKED_SHOWN": "signal_verbs",
    "WITHHELD_SHOWN": "signal_verbs",
    "list_agents": "board_verbs",
    "note": "board_verbs",
    "read_notes": "board_verbs",
    "whiteboard_write": "board_verbs",
    "whiteboard_read": "board_verbs",
    "NOTES_BUDGET_CHARS": "board_verbs",
    "WHITEBOARD_PAGE": "board_verbs",
    "WHITEBOARD_BUDGET_CHARS": "board_verbs",
    "warn_sessions": "alerts",
}


def __getattr__(name):
    # imported on first use: a `beat` does not load the signal, board or claim verbs
    if name in _MOVED:
        # the builtin, not importlib.import_module: that would load the importlib package on a hot call
        value = getattr(__import__(f"{__package__}.{_MOVED[name]}", fromlist=[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
