"""What the team server's dashboard shows (contract §13), as one JSON object, and what a person may post.

`collect` is `status --json` (every agent with its effective status, age, host, task and claims; open
incidents) plus, for each active session, its newest signals and notes and its whiteboard. `post` sends a
note or a signal as the token's identity. The web page (synapolis/web/) only renders these.
"""

from __future__ import annotations

import hmac
import threading
from datetime import datetime

from . import actions, board, overview, signals
from .errors import NoIdentityError, SynapolisError, UsageError
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
    `stopped`, so the watchdog never treats them as an agent that died. Their run token is derived from the
    bearer token that posts (`person_run_token`), not kept: after a restart the same token presents the same
    run token, and another token presents another one, which require_run_token refuses.
    """

    def __init__(self, ws_of):
        self._ws_of = ws_of  # () -> the Workspace as of now (its config may change)
        # one post at a time per agent: two first posts at once (a double click, two tabs) each registered
        # them, and the second registration was ConflictError (already active)
        self._locks: dict = {}

    def post(self, bearer: str, agent_id: str, session_id: str, *, note: str | None = None,
             to: str | None = None, content: str | None = None, type: str = "inform",
             idempotency_key: str | None = None) -> dict:
        ws = self._ws_of()
        if (note is None) == (content is None):
            raise UsageError("post a note or a signal")
        run_token = person_run_token(bearer, agent_id, session_id)

        def act(who):
            # the page's key for this post: a post sent again (an answer lost, a second click) stores nothing twice
            if note is not None:
                return actions.note(ws, who, note, env={}, piggyback=False, idempotency_key=idempotency_key)
            return actions.signal(ws, who, to, content, type=type, env={}, piggyback=False,
                                  idempotency_key=idempotency_key)

        # setdefault: atomic, the posts' threads race here; per agent, whichever token posts as it
        with self._locks.setdefault((agent_id, session_id), threading.Lock()):
            # without require_run_token an unpinned token may act as anyone registered, as over MCP: the run
            # token is shown only where it is required
            presented = run_token if ws.config.require_run_token else None
            try:
                return act(Who(agent_id, session_id, presented, named_only=True))
            except NoIdentityError:
                pass  # not in the session yet: registered below
            started = actions.start(ws, agent_id=agent_id, session_id=session_id, harness=PAGE_HARNESS, env={},
                                    run_token=run_token, piggyback=False, write_identity=False)
            who = Who(agent_id, session_id, started["run_token"], named_only=True)
            try:
                return act(who)
            finally:
                actions.beat(ws, who, status="stopped", env={}, piggyback=False)


def person_run_token(bearer: str, agent_id: str, session_id: str) -> str:
    """The run token of the page's person `agent_id` in `session_id` posting with the bearer token `bearer`: an
    HMAC under that bearer token, so only its holder's posts present it, the same one after a restart of the
    server, and no secret of the server's need be kept for it."""
    mac = hmac.new(bearer.encode("utf-8", "surrogatepass"), f"dashboard-person\0{session_id}\0{agent_id}".encode(),
                   "sha256")
    return mac.hexdigest()[:32]  # 128 bits, as identity.new_token's
