"""A hook's quiet path: nothing sent in its session since it last found its inbox empty, so it answers from
files alone (the heartbeat refreshed, no store opened).

Hooks run on every tool call, and most calls find nothing new. The SQLite store bumps a counter file
beside the session's database before each commit that inserts a signal or registers or restarts an
agent, under its write lock (`changes_path`, store/local/connection.py). A hook whose drain found no unread signal at
all remembers the counter's text it read inside that same write transaction; while the counter still
reads the same, no signal has been inserted and nobody took a slot over since, so the inbox is still
empty: nothing to show, nothing to mark delivered (honest delivery, contract §6/§8, is untouched: the
quiet path shows and marks nothing). The memory lasts at most QUIET_FOR_S (and a quarter of
stale_after_s), so the registry row is still refreshed that often, and a sender that does not bump the
counter (an older synapolis on the same state directory) delays a hook by that much at worst. Anything
unusual (another store, an ended session, a counter it cannot read, an idle or stopped agent) takes the
full path. docs/HOOKS.md, "The quiet path", says why this never loses a signal.
"""

from __future__ import annotations

import time

QUIET_FOR_S = 30.0
KEY = "quiet"


def clock(now=None) -> tuple[float, str]:
    """(seconds since the epoch, its RFC 3339 stamp as timeutil.format_ts writes it) for `now` (a datetime)
    or, when None, the local clock read without importing datetime (about 1.5 ms of a quiet call)."""
    if now is not None:
        from ..timeutil import format_ts

        return now.timestamp(), format_ts(now)
    micros = time.time_ns() // 1000
    return micros / 1e6, stamp(micros)


def stamp(micros: int) -> str:
    """format_ts's text for the moment `micros` microseconds after the epoch: seconds, and a fraction
    of six digits only when it is not zero."""
    seconds, fraction = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + (f".{fraction:06d}Z" if fraction else "Z")


def _sqlite(ws, env) -> bool:
    # store.store_url's choice, without importing the store: only the SQLite store keeps the counter
    url = env.get("SYNAPOLIS_STORE_URL") or ws.config.values.get("store") or "sqlite"
    # exactly "sqlite": a value naming no store we know takes the full path, which reports it
    return isinstance(url, str) and url.strip() == "sqlite"


def window_s(config) -> float:
    return min(QUIET_FOR_S, float(config.stale_after_s) / 4)


def still_quiet(ws, state: dict, env, now: float) -> bool:
    """Whether `state` (hooks/<key>.json) proves the agent's inbox still empty at `now` (seconds since the
    epoch): a memory younger than the window, its session active, the counter unchanged since."""
    memory = state.get(KEY)
    session_id = state.get("session_id")
    if not (isinstance(memory, dict) and isinstance(memory.get("at"), (int, float)) and isinstance(memory.get("mark"), str)
            and isinstance(session_id, str) and state.get("agent_id") and state.get("run_token")):
        return False
    if not 0 <= now - memory["at"] < window_s(ws.config) or not _sqlite(ws, env):
        return False
    from ..atomic import read_counter, read_json_or

    try:
        if read_counter(ws.files.session_changes(session_id)) != memory["mark"]:
            return False
        session = read_json_or(ws.files.session_json(session_id), None)
    except (OSError, ValueError):  # a malformed session id, an unreadable file: the full path decides
        return False
    return isinstance(session, dict) and session.get("status") == "active"


def refresh(ws, state: dict, now_stamp: str) -> dict:
    """The heartbeat refresh the full path would write for a hook's delivering event: status active, the
    registered harness and substrate, the session (an atomic replace, not fsynced, as every refresh)."""
    from ..heartbeat import write_heartbeat

    memory = state[KEY]
    return write_heartbeat(ws.paths, state["agent_id"], harness=memory.get("harness"), status="active",
                           substrate=memory.get("substrate"), session_id=state["session_id"], now=now_stamp,
                           durable=False)


# -- which state file a conversation keeps, without hashing its id ------------------------------------
# The agent id a hook acts as is derived from the conversation id by SHA-256 (contract §2): 3 ms through
# hashlib (it loads OpenSSL), more than a quiet call needs to spend on it. The first full path writes
# hooks/conversations/<harness>~<substrate>~<conversation>.json naming the state file; later calls read it
# instead of hashing. The state file itself records its harness and conversation, so a wrong or planted
# index entry is never followed (the caller checks, then hashes as before).

def index_name(harness: str, conversation: str, env) -> str | None:
    """The index file's name for this conversation, or None when a part is not made of id characters."""
    from ..names import ID_CHARS

    substrate = env.get("SYNAPOLIS_SUBSTRATE") or ""
    parts = (harness, substrate, conversation)
    if len(conversation) > 128 or len(substrate) > 128 or any(p.strip(ID_CHARS) for p in parts) or not conversation:
        return None
    return "~".join(parts)


def known_key(ws, harness: str, conversation: str, env) -> str | None:
    """The hooks/<key>.json this conversation's hooks keep, as the index says (unchecked: see above)."""
    from ..atomic import read_json_or

    name = index_name(harness, conversation, env)
    if name is None:
        return None
    document = read_json_or(ws.files.hook_conversation(name), None)
    key = document.get("key") if isinstance(document, dict) else None
    return key if isinstance(key, str) and key else None


def remember_key(ws, harness: str, conversation: str, env, key: str) -> None:
    """Write the index entry (best effort: without it the next call hashes, as before)."""
    import os

    from ..atomic import atomic_write_json

    name = index_name(harness, conversation, env)
    if name is None:
        return
    path = ws.files.hook_conversation(name)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        atomic_write_json(path, {"key": key}, durable=False, mode=0o600)
    except OSError:
        pass


def remembered(state: dict, found: dict | None, now: float) -> dict | None:
    """The state to save after a full path: with the memory of `found` ({"mark", "harness", "substrate"}:
    the drain found no unread signal), without one otherwise; None when nothing changes."""
    if found is None:
        if KEY not in state:
            return None
        return {k: v for k, v in state.items() if k != KEY}
    return {**state, KEY: {**found, "at": now}}
