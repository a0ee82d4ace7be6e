"""What the team server's dashboard shows (contract §13), as one JSON object, and what a person may post.

`collect` is `status --json` (every agent with its effective status, age, host, task and claims; open
incidents) plus, for each active session, its newest signals and notes and its whiteboard. `post` sends a
note or a signal as the token's identity. The web page (synapolis/web/) only renders these.
"""

from __future__ import annotations

import threading
from datetime import datetime

from . import actions, board, overview, signals
from .errors import ForbiddenError, NoIdentityError, SynapolisError, UsageError
from .identity import Who
from .sessions import active_sessions, each_store
from .store import store_for
from .timeutil import utcnow

SIGNALS_SHOWN = 20
NOTES_SHOWN = 20
PAGE_HARNESS = "dashboard"  # the harness of the people the page registers


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
        shown.append({"session_id": session_id, "signals": signals.recent(tx, signals_shown),
                      "whiteboard": board.read_entries(tx)})
    for entry in shown:
        try:
            entry["notes"] = store_for(ws).read_notes(entry["session_id"], notes_shown)
        except (OSError, SynapolisError) as exc:
            entry["notes"] = []
            data["problems"].append(f"notes of {entry['session_id']}: {exc}")
    data["activity"] = shown
    return data


def shown_sessions(ws) -> list[str]:
    """The sessions whose activity the page shows: the active ones."""
    return active_sessions(ws)


class Poster:
    """Posts notes and signals from the page as one identity per token: the agent the token is pinned to,
    or the agent the person names (a token that is not pinned may act as anyone, as over MCP).

    A person is registered in the session on their first post (harness `dashboard`) and then declared
    `stopped`, so the watchdog never treats them as an agent that died; the run token that registration
    returned is kept here for their later posts.
    """

    def __init__(self, ws_of):
        self._ws_of = ws_of  # () -> the Workspace as of now (its config may change)
        self._run_tokens: dict = {}
        # one post at a time per agent: two first posts at once (a double click, two tabs) each registered
        # them, and the second registration was ConflictError (already active) or replaced the first's run token
        self._locks: dict = {}

    def post(self, token_name: str, agent_id: str, session_id: str, *, note: str | None = None,
             to: str | None = None, content: str | None = None, type: str = "inform") -> dict:
        ws = self._ws_of()
        if (note is None) == (content is None):
            raise UsageError("post a note or a signal")
        key = (token_name, agent_id, session_id)
        # setdefault: atomic, the posts' threads race here; per agent, whichever token posts as it
        with self._locks.setdefault((agent_id, session_id), threading.Lock()):
            return self._post(ws, key, note=note, to=to, content=content, type=type)

    def _post(self, ws, key, *, note, to, content, type) -> dict:
        _token_name, agent_id, session_id = key
        who = Who(agent_id, session_id, self._run_tokens.get(key), named_only=True)

        def act(who):
            if note is not None:
                return actions.note(ws, who, note, env={}, piggyback=False)
            return actions.signal(ws, who, to, content, type=type, env={}, piggyback=False)

        try:
            return act(who)
        except NoIdentityError:
            pass  # not in the session yet: registered below
        except ForbiddenError:
            # the person's run token lives in this process's memory only: after a restart there is none (or a
            # stale one), and with require_run_token every post of theirs was refused for good. A registration
            # the page made (harness `dashboard`) is taken over again; a real agent's stays refused.
            if not _page_registered(ws, agent_id, session_id):
                raise
        started = actions.start(ws, agent_id=agent_id, session_id=session_id, harness=PAGE_HARNESS, env={},
                                piggyback=False, write_identity=False)
        self._run_tokens[key] = started["run_token"]
        who = Who(agent_id, session_id, started["run_token"], named_only=True)
        try:
            return act(who)
        finally:
            actions.beat(ws, who, status="stopped", env={}, piggyback=False)


def _page_registered(ws, agent_id: str, session_id: str) -> bool:
    """Whether `agent_id` is registered in the session by the page (a person), not by an agent's harness."""
    agents = actions.list_agents(ws, Who(named_only=True), session_id=session_id, env={}, piggyback=False)["agents"]
    return any(a["id"] == agent_id and a["harness"] == PAGE_HARNESS for a in agents)
