"""People who post (the dashboard): a reserved sender form, never an agent, and their notes and signals.

A person is `synapolis.person.<name>`, the name being the bearer token's: an id under the system's reserved
root, so no agent can ever register, act or send as one, and it fits both stores' sender and note columns as
they are. Posting as a person writes the note or the signal only: no registry row, no heartbeat, no delivery.
Every note and signal shown carries `person: <name>` when a person wrote it (docs/MCP.md, "People").
"""

from __future__ import annotations

from datetime import datetime

from . import retries, signals as sig
from .errors import UsageError
from .names import PERSON_PREFIX as PREFIX, sha256_hex, validate_session_id
from .sessions import read_session
from .store import clock, open_session
from .store.base import KeyTaken


def person_id(name: str) -> str:
    """The sender id of the person whose token is named `name` (a token name that is no id, `a..b`, is
    spelled by its hash)."""
    candidate = PREFIX + name
    parts = candidate.split(".")
    if all(parts) and len(candidate) <= 128:
        return candidate
    return PREFIX + "token-" + sha256_hex(name.encode("utf-8", "surrogatepass"))[:16]


def person_of(sender) -> str | None:
    """The person's name when `sender` (a signal's sender, a note's agent_id) is a person, else None."""
    if isinstance(sender, str) and sender.startswith(PREFIX):
        return sender[len(PREFIX):]
    return None


def mark(record: dict, key: str) -> dict:
    """`record` (a signal: key `sender`; a note: `agent_id`) with `person` added when a person wrote it."""
    name = person_of(record.get(key))
    if name is not None:
        record["person"] = name
    return record


def shown(who: str) -> str:
    """How text output names a writer: `NAME (person)` for a person, else the agent id."""
    name = person_of(who)
    return who if name is None else f"{name} (person)"


def _active(ws, session_id: str) -> str:
    validate_session_id(session_id)
    if read_session(ws, session_id).get("status") != "active":
        raise UsageError(f"session {session_id} is not active: a person posts to an active session")
    return session_id


def note(ws, name: str, session_id: str, text: str, now: datetime | None = None, *,
         idempotency_key: str | None = None) -> dict:
    """A person's note: appended to the session's notes bus, and nothing else written. With `idempotency_key`, a
    post sent again answers with the note stored the first time and appends nothing (retries.py)."""
    from . import board

    board.check_note(text, ws.config)
    key = retries.check_key(idempotency_key)
    _active(ws, session_id)
    now = clock(ws, now)
    writer = person_id(name)
    try:
        with ws.store.note_appender(session_id) as add, open_session(ws, session_id) as store, \
                store.write() as conn:
            written = add(conn, writer, text, now, key)
        replayed = {}
    except KeyTaken:
        with open_session(ws, session_id) as store, store.write() as conn:
            written = conn.note_by_key(writer, key)
        if written is None or written["text"] != text:
            raise retries.different(key, writer, "note") from None
        replayed = {"replayed": True}
    return {"note": mark(dict(written), "agent_id"), "session_id": session_id, "pending_signals": [],
            "pending_remaining": 0, **replayed}


def signal(ws, name: str, session_id: str, to: str, content: str, *, type: str = "inform",
           now: datetime | None = None, idempotency_key: str | None = None) -> dict:
    """A person's signal to `to` (`*`, an agent, a sub-agent): stored, and nothing else written. With
    `idempotency_key`, a post sent again answers with the signal stored the first time (retries.py)."""
    if not to:
        raise UsageError("name whom the signal is to: * or an agent")
    key = retries.check_key(idempotency_key)
    _active(ws, session_id)
    now = clock(ws, now)
    sender = person_id(name)
    replayed = {}
    with open_session(ws, session_id) as store:
        try:
            with store.write() as conn:
                doc, audience = sig.send(conn, caller=None, recipient=to, content=content, now=now,
                                         config=ws.config, type_=type, sender=sender, rate_limited=False,
                                         idempotency_key=key)
        except KeyTaken:
            with store.write() as conn:
                row = conn.signal_by_key(sender, key)
                doc = sig.as_dict(row) if row is not None else None
                if doc is None or (doc["recipient"], doc["type"], doc["content"]) != (to, type, content):
                    raise retries.different(key, sender, "signal") from None
                rows, _mine = sig.audience_rows(conn, doc["recipient"], sender, None)
                audience = sig.audience(rows, now, ws.config)
            replayed = {"replayed": True}
    return {"signal": mark(dict(doc), "sender"), "audience": audience, "session_id": session_id,
            "pending_signals": [], "pending_remaining": 0, **replayed}
