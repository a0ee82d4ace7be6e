"""Idempotency keys: a `signal` or `note` retried with its key answers as the first time and stores nothing twice.

Exit 8 (BusyError) says the verb could not be confirmed, not that nothing happened: on PostgreSQL the answer to
a COMMIT can be lost with the COMMIT done. A caller that retries after exit 8 passes the same key; the store keeps
the first answer under (session, caller, key), a unique index on both stores, so the retry, from any machine,
runs into it, rolls its own transaction back and answers with what was stored (docs/SIGNALS.md, "Retries and
idempotency keys"). The send path pays one INSERT; the lookup runs only when that INSERT finds the key taken.
"""

from __future__ import annotations

from .errors import ConflictError, RateLimitedError, UsageError

MAX_KEY = 200  # characters: a UUID is 36; room for a caller's own scheme ("run-42/step-7/attempt")


class Replay(Exception):
    """Raised inside the verb's write transaction when its key is recorded already: the transaction rolls back
    (a note appended to notes.jsonl is taken back with it) and the verb answers with the recorded first answer."""


def check_key(key) -> str | None:
    """The key, or UsageError (exit 2) before anything is written; None stays None (no key, no record)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise UsageError(f"idempotency key must be 1 to {MAX_KEY} characters, not {key!r:.60}")
    if key != key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UsageError("idempotency key may not contain control characters or start or end with white space")
    return key


def fingerprint(kind: str, *parts) -> str:
    """What a retry must repeat to replay: the call's kind and arguments, hashed."""
    from .names import sha256_hex

    return sha256_hex("\x1f".join([kind, *("" if p is None else str(p) for p in parts)]).encode("utf-8", "surrogatepass"))


def remember(tx, agent_id: str, key: str | None, kind: str, print_: str, answer: dict, stamp: str) -> None:
    """Inside the verb's write transaction, after its effect: record `answer` under the key, or raise Replay."""
    if key is None:
        return
    import json

    if not tx.remember_answer(agent_id, key, kind, print_, json.dumps(answer, ensure_ascii=False), stamp):
        raise Replay(key)


def replays(key: str | None, exc: BaseException) -> bool:
    """Whether the verb failing with `exc` may be a retry to answer from its record: the key is taken (Replay),
    or the rate limit refused it (a retry of a stored send is not a new send and is never rate limited)."""
    return key is not None and isinstance(exc, (Replay, RateLimitedError))


def replay(call, key: str, kind: str, print_: str, exc: BaseException, extra: dict | None = None) -> dict:
    """The verb's answer from the first call with `key` (marked `"replayed": true`), with this call's piggyback;
    `exc` again when nothing is recorded under the key (a rate limit that refused a first call)."""
    import json

    with call.store.write() as conn:
        row = conn.first_answer(call.agent_id, key)
        if row is None:
            raise exc
        if row["kind"] != kind or row["fingerprint"] != print_:
            raise ConflictError(f"idempotency key {key!r} of {call.agent_id} was used for a different {row['kind']} "
                                f"({row['created_at']}): a retry repeats the call exactly; a new call takes a new key")
        answer = json.loads(row["answer"])
        return call.finish({**answer, **(extra or {}), "replayed": True}, conn)
