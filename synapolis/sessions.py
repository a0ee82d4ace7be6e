"""Sessions: creating, finding and ending them (through the store), and the registry rules on their agents."""

from __future__ import annotations

from datetime import datetime

from .errors import NotFoundError, SynapolisError
from .names import generate_session_id, validate_session_id
from .store import clock, open_session
from .timeutil import format_ts, micro_stamp

# registry statuses (EP-0118's CHECK); a declared `stopped` is `sleeping` there
REGISTRY_STATUSES = ("active", "idle", "sleeping", "stale")


def registry_status(declared: str) -> str:
    """The agents-table status for a declared heartbeat status."""
    return "sleeping" if declared == "stopped" else declared


def ts(moment: datetime) -> str:
    """The timestamp format of the session store: fixed-width RFC 3339 with microseconds."""
    return micro_stamp(moment)


def is_live(row, now: datetime, config) -> bool:
    """A registry row that counts as live: active or idle with a fresh last_heartbeat (status.registry_live)."""
    from .status import registry_live  # here and below: the hot verbs that import sessions never judge liveness

    return registry_live(row, now, config)


def create_session(ws, session_id: str | None = None, now: datetime | None = None) -> str:
    """Create a session (its store and session document); an existing one is left as it is."""
    return ensure_session(ws, session_id, now)[0]


def ensure_session(ws, session_id: str | None = None, now: datetime | None = None) -> tuple[str, bool]:
    """(session id, created?): create the session unless it exists; of several processes on several
    machines creating one session at once, exactly one is told it created it."""
    now = clock(ws, now)
    ws.ensure()
    session_id = validate_session_id(session_id) if session_id is not None else generate_session_id()
    return session_id, ws.store.create_session(session_id, format_ts(now))


def session_exists(ws, session_id: str) -> bool:
    return ws.store.session_exists(session_id)


def read_session(ws, session_id: str) -> dict:
    """The document of `session_id` (session.json on SQLite); NotFoundError when there is no such session."""
    return ws.store.read_session(session_id)


def end_session(ws, session_id: str, now: datetime | None = None) -> dict:
    """Mark a session `ended` (the last agent's consensus sleep does this)."""
    return ws.store.set_session_status(session_id, "ended", format_ts(clock(ws, now)))


def reopen_session(ws, session_id: str, now: datetime | None = None) -> dict:
    """Mark an ended session `active` again (an agent started in it by name)."""
    return ws.store.set_session_status(session_id, "active", format_ts(clock(ws, now)))


def all_sessions(ws) -> list[dict]:
    """Every readable session document, oldest id first."""
    return ws.store.list_sessions()


def active_sessions(ws) -> list[str]:
    """Ids of the sessions whose document says `active`."""
    return [d.get("session_id") for d in all_sessions(ws)
            if d.get("status") == "active" and isinstance(d.get("session_id"), str)]


def agent_row(tx, agent_id: str):
    return tx.agent(agent_id)


def each_store(ws, session_ids, write: bool = False, skip_broken: bool = False):
    """Yield (session_id, tx) for each of `session_ids` that has a store, inside a read (or write)
    transaction that ends when the consumer moves on; missing stores are skipped, and with
    `skip_broken` (for readers that show what they can) so are stores that cannot be opened or read."""
    for session_id in session_ids:
        try:
            store = open_session(ws, session_id)
        except SynapolisError as exc:
            if skip_broken or isinstance(exc, NotFoundError):
                continue
            raise
        try:
            with (store.write() if write else store.read()) as tx:
                yield session_id, tx
        except SynapolisError:
            if not skip_broken:
                raise
        finally:
            store.close()


def sessions_of_agent(ws, agent_id: str, active_only: bool = True) -> list[str]:
    """Sessions whose registry holds `agent_id`, the most recently heard from first."""
    candidates = active_sessions(ws) if active_only else [d["session_id"] for d in all_sessions(ws)]
    found = []
    for session_id, tx in each_store(ws, candidates):
        row = agent_row(tx, agent_id)
        if row is not None:
            found.append((row["last_heartbeat"] or "", session_id))
    found.sort(reverse=True)
    return [session_id for _beat, session_id in found]


def count_live_agents(tx, now: datetime, config, exclude: str | None = None) -> int:
    """Agents whose registry status is `active` with a fresh last_heartbeat (EP-0118 §4's count)."""
    from .status import registry_window

    cutoff, ceiling = registry_window(now, config)
    return tx.count_live(cutoff, exclude, ceiling=ceiling)


def flag_stale_in(tx, now: datetime, config) -> list[dict]:
    """Inside a write transaction: registry rows `active`/`idle` that are not fresh (status.registry_window:
    not heard from in stale_after_s, or stamped beyond the clock skew) -> `stale`."""
    from .status import registry_window

    cutoff, ceiling = registry_window(now, config)
    rows = tx.flag_stale(cutoff, ceiling=ceiling)
    return [{"agent_id": r["id"], "from": r["status"], "last_heartbeat": r["last_heartbeat"]} for r in rows]


def flag_stale(ws, now: datetime | None = None) -> list[dict]:
    """For the watchdog: flag stale registry rows in every active session; returns what changed."""
    now = clock(ws, now)
    changed = []
    for session_id, tx in each_store(ws, active_sessions(ws), write=True):
        changed += [{"session_id": session_id, **item} for item in flag_stale_in(tx, now, ws.config)]
    return changed
