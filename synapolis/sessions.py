"""Sessions: creating, finding and ending them (`session.json`), and the registry rules on their agents."""

from __future__ import annotations

import os
from datetime import datetime

from .atomic import atomic_write_json, locked, read_json
from .errors import NotFoundError, SynapolisError, UsageError
from .names import generate_session_id, validate_session_id
from .status import registry_live, registry_window
from .store import SessionStore
from .timeutil import format_ts, utcnow

# registry statuses (EP-0118's CHECK); a declared `stopped` is `sleeping` there
REGISTRY_STATUSES = ("active", "idle", "sleeping", "stale")


def registry_status(declared: str) -> str:
    """The agents-table status for a declared heartbeat status."""
    return "sleeping" if declared == "stopped" else declared


def ts(moment: datetime) -> str:
    """The timestamp format of the session store: fixed-width RFC 3339 with microseconds."""
    return format_ts(moment, micro=True)


def is_live(row, now: datetime, config) -> bool:
    """A registry row that counts as live: active or idle with a fresh last_heartbeat (status.registry_live)."""
    return registry_live(row, now, config)


def create_session(ws, session_id: str | None = None, now: datetime | None = None) -> str:
    """Create a session (its database and session.json); an existing one is left as it is."""
    now = now or utcnow()
    ws.ensure()
    session_id = validate_session_id(session_id) if session_id is not None else generate_session_id()
    path = ws.paths.session_json(session_id)
    with locked(ws.paths.lock(f"session.{session_id}")):
        SessionStore.open(ws, session_id, create=True).close()
        if not path.exists():
            atomic_write_json(path, {"session_id": session_id, "status": "active",
                                     "created_at": format_ts(now), "ended_at": None})
    return session_id


def read_session(ws, session_id: str) -> dict:
    """session.json of `session_id`; NotFoundError when there is no such session."""
    path = ws.files.session_json(session_id)  # a str: hooks read this on every call, without pathlib
    try:
        document = read_json(path)
    except FileNotFoundError:
        raise NotFoundError(f"unknown session {session_id!r}") from None
    except (OSError, ValueError) as exc:
        raise NotFoundError(f"session {session_id!r} has an unreadable session.json ({exc})") from None
    if not isinstance(document, dict):
        raise NotFoundError(f"session {session_id!r} has a malformed session.json")
    return document


def _set_status(ws, session_id: str, status: str, now: datetime) -> dict:
    with locked(ws.paths.lock(f"session.{session_id}")):
        document = read_session(ws, session_id)
        document["status"] = status
        if status == "ended":
            document["ended_at"] = format_ts(now)
        else:
            document["ended_at"] = None
            document["reopened_at"] = format_ts(now)
        atomic_write_json(ws.paths.session_json(session_id), document)
    return document


def end_session(ws, session_id: str, now: datetime | None = None) -> dict:
    """Mark a session `ended` (the last agent's consensus sleep does this)."""
    return _set_status(ws, session_id, "ended", now or utcnow())


def reopen_session(ws, session_id: str, now: datetime | None = None) -> dict:
    """Mark an ended session `active` again (an agent started in it by name)."""
    return _set_status(ws, session_id, "active", now or utcnow())


def all_sessions(ws) -> list[dict]:
    """Every readable session.json, oldest id first."""
    folder = ws.files.sessions  # plain strings: a beat that names no session looks here, without pathlib
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        if name.startswith(".") or not os.path.isdir(os.path.join(folder, name)):
            continue
        try:
            document = read_session(ws, name)
        except (NotFoundError, UsageError):  # a stray folder or broken file is simply not a session
            continue
        found.append(document)
    return found


def active_sessions(ws) -> list[str]:
    """Ids of the sessions whose session.json says `active`."""
    return [d.get("session_id") for d in all_sessions(ws)
            if d.get("status") == "active" and isinstance(d.get("session_id"), str)]


def agent_row(conn, agent_id: str):
    return conn.execute("SELECT * FROM agents WHERE id = ?", (agent_id,)).fetchone()


def each_store(ws, session_ids, write: bool = False, skip_broken: bool = False):
    """Yield (session_id, conn) for each of `session_ids` that has a store, inside a read (or write)
    transaction that ends when the consumer moves on; missing stores are skipped, and with
    `skip_broken` (for readers that show what they can) so are stores that cannot be opened or read."""
    for session_id in session_ids:
        try:
            store = SessionStore.open(ws, session_id)
        except SynapolisError as exc:
            if skip_broken or isinstance(exc, NotFoundError):
                continue
            raise
        try:
            with (store.write() if write else store.read()) as conn:
                yield session_id, conn
        except SynapolisError:
            if not skip_broken:
                raise
        finally:
            store.close()


def sessions_of_agent(ws, agent_id: str, active_only: bool = True) -> list[str]:
    """Sessions whose registry holds `agent_id`, the most recently heard from first."""
    candidates = active_sessions(ws) if active_only else [d["session_id"] for d in all_sessions(ws)]
    found = []
    for session_id, conn in each_store(ws, candidates):
        row = agent_row(conn, agent_id)
        if row is not None:
            found.append((row["last_heartbeat"] or "", session_id))
    found.sort(reverse=True)
    return [session_id for _beat, session_id in found]


def count_live_agents(conn, now: datetime, config, exclude: str | None = None) -> int:
    """Agents whose registry status is `active` with a fresh last_heartbeat (EP-0118 §4's count)."""
    cutoff, ceiling = registry_window(now, config)
    row = conn.execute(
        "SELECT COUNT(*) FROM agents WHERE status = 'active' AND last_heartbeat >= ? AND last_heartbeat <= ? "
        "AND id IS NOT ?", (cutoff, ceiling, exclude)).fetchone()
    return int(row[0])


def flag_stale_in(conn, now: datetime, config) -> list[dict]:
    """Inside a write transaction: registry rows `active`/`idle` that are not fresh (status.registry_fresh:
    not heard from in stale_after_s, or stamped beyond the clock skew) -> `stale`."""
    cutoff, ceiling = registry_window(now, config)
    stale = "status IN ('active', 'idle') AND (last_heartbeat IS NULL OR last_heartbeat < ? OR last_heartbeat > ?)"
    rows = conn.execute(f"SELECT id, status, last_heartbeat FROM agents WHERE {stale}", (cutoff, ceiling)).fetchall()
    if rows:
        conn.execute(f"UPDATE agents SET status = 'stale' WHERE {stale}", (cutoff, ceiling))
    return [{"agent_id": r["id"], "from": r["status"], "last_heartbeat": r["last_heartbeat"]} for r in rows]


def flag_stale(ws, now: datetime | None = None) -> list[dict]:
    """For the watchdog: flag stale registry rows in every active session; returns what changed."""
    now = now or utcnow()
    changed = []
    for session_id, conn in each_store(ws, active_sessions(ws), write=True):
        changed += [{"session_id": session_id, **item} for item in flag_stale_in(conn, now, ws.config)]
    return changed
