"""What the team server's dashboard shows (contract §13), as one JSON object, and what a person may post.

`collect` is `status --json` (every agent with its effective status, age, host, task and claims; open
incidents) plus, for each active session, its newest signals and notes and its whiteboard. `Poster` sends a
note or a signal as a person, or as the agent a pinned token is. The web page (synapolis/web/) only renders these.
"""

from __future__ import annotations

from datetime import datetime

from . import actions, board, overview, people, signals
from .errors import NoIdentityError, SynapolisError, UsageError
from .identity import Who
from .sessions import active_sessions, each_store
from .store import store_for
from .timeutil import utcnow

SIGNALS_SHOWN = 20
NOTES_SHOWN = 20


def collect(ws, now: datetime | None = None, *, signals_shown: int = SIGNALS_SHOWN,
            notes_shown: int = NOTES_SHOWN) -> dict:
    now = now or utcnow()
    data = overview.collect(ws, now)
    shown = []
    try:
        ids = shown_sessions(ws)
    except SynapolisError as exc:
        data["problems"].append(f"sessions: {exc.message}")
        ids = []
    # a damaged or locked session store is left out: the rest of the page still shows
    for session_id, tx in each_store(ws, ids, skip_broken=True):
        shown.append({"session_id": session_id,
                      "signals": [people.mark(g, "sender") for g in signals.recent(tx, signals_shown)],
                      "whiteboard": board.read_entries(tx)})
    for entry in shown:
        try:
            entry["notes"] = [people.mark(n, "agent_id")
                              for n in store_for(ws).read_notes(entry["session_id"], notes_shown)]
        except (OSError, SynapolisError) as exc:
            entry["notes"] = []
            data["problems"].append(f"notes of {entry['session_id']}: {exc}")
    data["activity"] = shown
    return data


def shown_sessions(ws) -> list[str]:
    """The sessions whose activity the page shows: the active ones."""
    return active_sessions(ws)


class Poster:
    """Posts notes and signals from the page. A token pinned to an agent posts as that agent (the token vouches
    for it, require_run_token or not; it must be registered in the session). Any other token that may write
    posts as a person (people.py): the note or signal says a person wrote it, and no agent's heartbeat or
    registry entry is touched, so no dead agent comes back and no name typed becomes an agent."""

    def __init__(self, ws_of):
        self._ws_of = ws_of  # () -> the Workspace as of now (its config may change)

    def post(self, token_name: str, pinned: str | None, session_id: str, *, note: str | None = None,
             to: str | None = None, content: str | None = None, type: str = "inform") -> dict:
        ws = self._ws_of()
        if (note is None) == (content is None):
            raise UsageError("post a note or a signal")
        if pinned is None:
            if note is not None:
                return people.note(ws, token_name, session_id, note)
            return people.signal(ws, token_name, session_id, to, content, type=type)
        who = Who(pinned, session_id, None, named_only=True, vouched=True)
        try:
            if note is not None:
                return actions.note(ws, who, note, env={}, piggyback=False)
            return actions.signal(ws, who, to, content, type=type, env={}, piggyback=False)
        except NoIdentityError:
            raise NoIdentityError(f"agent {pinned} is not in session {session_id}: this token posts as that agent, "
                                  "which must join the session first (start_session)") from None
