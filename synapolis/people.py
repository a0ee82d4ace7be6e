"""People who post (the dashboard): a reserved sender form, never an agent, and their notes and signals.

A person is `synapolis.person.<name>`, the name being the bearer token's: an id under the system's reserved
root, so no agent can ever register, act or send as one, and it fits both stores' sender and note columns as
they are. Posting as a person writes the note or the signal only: no registry row, no heartbeat, no delivery.
Every note and signal shown carries `person: <name>` when a person wrote it (docs/MCP.md, "People").
"""

from __future__ import annotations

from datetime import datetime

from . import signals as sig
from .errors import UsageError
from .names import PERSON_PREFIX as PREFIX, sha256_hex, validate_session_id
from .sessions import read_session
from .store import clock, open_session, store_for


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


def note(ws, name: str, session_id: str, text: str, now: datetime | None = None) -> dict:
    """A person's note: appended to the session's notes bus, and nothing else written."""
    from . import board

    board.check_note(text, ws.config)
    _active(ws, session_id)
    now = clock(ws, now)
    with store_for(ws).note_appender(session_id) as add, open_session(ws, session_id) as store, \
            store.write() as conn:
        written = add(conn, person_id(name), text, now)
    return {"note": mark(dict(written), "agent_id"), "session_id": session_id, "pending_signals": [],
            "pending_remaining": 0}


def signal(ws, name: str, session_id: str, to: str, content: str, *, type: str = "inform",
           now: datetime | None = None) -> dict:
    """A person's signal to `to` (`*`, an agent, a sub-agent): stored, and nothing else written."""
    if not to:
        raise UsageError("name whom the signal is to: * or an agent")
    _active(ws, session_id)
    now = clock(ws, now)
    with open_session(ws, session_id) as store, store.write() as conn:
        doc, audience = sig.send(conn, caller=None, recipient=to, content=content, now=now, config=ws.config,
                                 type_=type, sender=person_id(name), rate_limited=False)
    return {"signal": mark(dict(doc), "sender"), "audience": audience, "session_id": session_id,
            "pending_signals": [], "pending_remaining": 0}
