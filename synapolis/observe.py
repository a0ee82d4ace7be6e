"""What a person (a read-only token, the dashboard) reads of signals: as nobody, so nothing beats or is delivered."""

from __future__ import annotations

from . import signals as sig
from .names import check_limit, validate_agent_id, validate_session_id
from .sessions import active_sessions, read_session
from .store import open_session
from .errors import AmbiguousIdentityError, NotFoundError, UsageError


def _session(ws, session_id: str | None) -> str:
    if session_id is not None:
        read_session(ws, validate_session_id(session_id))
        return session_id
    active = active_sessions(ws)
    if len(active) != 1:
        if not active:
            raise NotFoundError("there is no active session: pass session_id")
        raise AmbiguousIdentityError(f"{len(active)} sessions are active: pass session_id")
    return active[0]


def read_signals(ws, *, session_id: str | None = None, agent_id: str | None = None, unread_only: bool = True,
                 limit: int | None = None, after: int | None = None) -> dict:
    """A page of signals as a person sees them, changing nothing: with `agent_id`, that agent's (its unread
    ones by default, exactly as its own read_signals pages them); without, the session's newest `limit`
    (default 50) whoever they are for, oldest first. Neither marks anything delivered nor refreshes anyone."""
    check_limit(limit)
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise UsageError(f"after must be a signal sequence (a whole number >= 0), not {after!r}")
    session_id = _session(ws, session_id)
    with open_session(ws, session_id) as store, store.read() as conn:
        if agent_id is not None:
            found = sig.page(conn, validate_agent_id(agent_id), unread_only=unread_only, after=after, limit=limit)
        else:
            found = {"signals": sig.recent(conn, 50 if limit is None else limit), "remaining": None,
                     "next_after": None}
    return {**found, "agent_id": agent_id, "session_id": session_id, "pending_signals": [], "pending_remaining": 0}
