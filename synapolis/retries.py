"""Idempotency keys: a `signal` or `note` retried with its key answers as the first time and stores nothing twice.

Exit 8 (BusyError) says the verb could not be confirmed, not that nothing happened: on PostgreSQL the answer to
a COMMIT can be lost with the COMMIT done. A caller that retries after exit 8 passes the same key. The key is
stored with the signal (or note) under a unique index per (session, sender, key) on both stores, so a retry, from
any machine, runs into it (store.KeyTaken), rolls its own transaction back and answers with what was stored
(docs/SIGNALS.md, "Retries and idempotency keys"). The send costs one more parameter and column; the lookup runs
only on a retry.
"""

from __future__ import annotations

from .errors import ConflictError, RateLimitedError, UsageError
from .store.base import KeyTaken

MAX_KEY = 200  # characters: a UUID is 36; room for a caller's own scheme ("run-42/step-7/attempt")


def check_key(key) -> str | None:
    """The key, or UsageError (exit 2) before anything is written; None stays None (no key, nothing kept)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise UsageError(f"idempotency key must be 1 to {MAX_KEY} characters, not {key!r:.60}")
    if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UsageError("idempotency key may not contain control characters or start or end with white space")
    return key


def replays(key: str | None, exc: BaseException) -> bool:
    """Whether a keyed verb that failed with `exc` may be a retry to answer from what is stored: the key is
    taken (KeyTaken), or the rate limit refused it (the retry of a stored send is not a new send)."""
    return key is not None and isinstance(exc, (KeyTaken, RateLimitedError))


def different(key: str, agent_id: str, kind: str, when: str = "earlier") -> ConflictError:
    """The refusal of a key that was used for another call (exit 3)."""
    return ConflictError(f"idempotency key {key!r} of {agent_id} was used for a different {kind} ({when}): a retry "
                         "repeats the call exactly; a new call takes a new key")


def replay_signal(call, key: str, exc: BaseException, *, to: str, content: str, type_: str, sender: str | None,
                  config) -> dict:
    """`signal`'s answer for the signal stored with `key` (its audience as of now), `"replayed": true`, with this
    call's piggyback; `exc` again when nothing is stored under the key (a rate limit refused a first call)."""
    from . import signals as sig

    sender = sender or call.agent_id
    with call.store.write() as conn:
        row = conn.signal_by_key(sender, key)
        if row is None:
            raise exc
        stored = sig.as_dict(row)
        if (stored["recipient"], stored["type"], stored["content"]) != (to, type_, content):
            raise different(key, sender, "signal", stored["timestamp"])
        rows, _mine = sig.audience_rows(conn, stored["recipient"], sender, call.agent_id)
        stored["idempotency_key"] = key
        return call.finish({"signal": stored, "audience": sig.audience(rows, call.now, config),
                            "session_id": call.session_id, "replayed": True}, conn)


def replay_note(call, key: str, exc: BaseException, *, text: str) -> dict:
    """`note`'s answer for the note appended with `key`, `"replayed": true`, with this call's piggyback."""
    with call.store.write() as conn:
        note = conn.note_by_key(call.agent_id, key)
        if note is None:
            raise exc
        if note["text"] != text:
            raise different(key, call.agent_id, "note", note["at"])
        return call.finish({"note": note, "replayed": True}, conn)
