"""The shared-view verbs (§3, §7): list-agents, notes and the whiteboard."""

from __future__ import annotations

from datetime import datetime

from . import retries
from .agent_call import as_agent, in_session
from .errors import AmbiguousIdentityError, NotFoundError, UsageError
from .identity import Who
from .names import check_limit, validate_session_id
from .sessions import active_sessions, each_store, is_live, read_session
from .store import clock, open_session


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
            with ws.store.note_appender(call.session_id) as add, call.store.write() as conn:
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
    store = ws.store
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
