"""Claims (contract §9): the claimed_by lock helper and its public API.

The rules live in rules/claims.py, the operations on a record in claim_ops.py, the `with` lease in
claim_lease.py, the claim files in the local store (store/local/claims.py); every public name stays
importable from here (docs/CLAIMS.md)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

# hashlib (OpenSSL), threading, random, filelock and the holder-status rules (status) are imported where they
# are used, and the context managers are classes (no contextlib): `synapolis claim` runs on an agent's every
# edit, and an uncontended claim of a short name needs none of them
from .errors import BusyError, ConflictError, SynapolisError, UsageError
from .names import validate_agent_id, validate_claim_item, validate_session_id
from .claim_lease import Claim, beat_holder  # noqa: F401 - public here (docs/CLAIMS.md)
from .claim_ops import (acquire, check, held_items, holder_status, list_claims, reap,  # noqa: F401 - public here
                        release_record, renew_record)
from .rules.claims import (MAX_REASON, MAX_TRANSITIONS, MAX_TTL_S, REAPED_HOLDER_STATUSES,  # noqa: F401 - as before
                           SCHEMA_VERSION, check_force, check_ttl, check_wait, claim_state)
from .store import clock
# the claim files and their locks are the store's (store/local/claims.py); the names below are where people and
# tests have always found them
from .store.local.claims import (MAX_STEM, PATHS_LOCK, FileSlot, claim_path, encode_item,  # noqa: F401
                                 file_document, file_documents, file_slot, item_lock as _item_lock,
                                 lock_file as _lock_file, try_item_lock as _try_item_lock)


# --- the API -------------------------------------------------------------------------------------

def _open_ws(ws):
    if ws is None:
        from .workspace import Workspace

        return Workspace.open()
    return ws


def claim(ws, item: str | None = None, agent_id: str | None = None, session_id: str | None = None,
          ttl_s: float | None = None, wait_s: float = 0, now: datetime | None = None) -> Claim:
    """Claim `item` for `agent_id`, renew it when the agent holds it, or take it over when the holder
    is gone; returns the record as a Claim (usable as `with` to renew while held and release after).

    Raises ConflictError when a live other holds it (after waiting up to `wait_s` seconds),
    BusyError when the lock stays busy. The issue's spelling `claim("ticket:142", agent_id=...)`
    (the item first, the workspace found as the CLI finds it) works too.
    """
    if isinstance(ws, str):
        if item is not None:
            raise TypeError("claim(ws, item, agent_id) or claim(item, agent_id=...), not both")
        ws, item = None, ws
    validate_claim_item(item)
    if agent_id is None:
        raise UsageError("claim needs the agent id of the claimer")
    validate_agent_id(agent_id)
    if session_id is not None:
        validate_session_id(session_id)
    ws = _open_ws(ws)
    ttl = check_ttl(ttl_s, ws.config)
    wait = check_wait(wait_s)
    ws.ensure()
    started = time.monotonic()
    delay, retried = 0.05, False
    waiting = False  # recorded as a waiter (claim_waits): withdrawn however the wait ends
    try:
        while True:
            # a given `now` is exact for the first attempt; the retries of a wait move on from it
            elapsed = time.monotonic() - started if retried else 0.0
            moment = clock(ws) if now is None else clock(ws, now) + timedelta(seconds=elapsed)
            try:
                record, event, overlaps = acquire(ws, item, agent_id, session_id, ttl, moment)
                granted = Claim(record, ws=ws, agent_id=agent_id, session_id=session_id, ttl_s=ttl, event=event)
                granted.overlaps = overlaps
                return granted
            except (ConflictError, BusyError) as exc:
                remaining = wait - (time.monotonic() - started)
                if remaining <= 0:
                    raise
                if isinstance(exc, ConflictError):
                    # a wait that would close a cycle is refused here, at once (contract §14)
                    from .claim_waits import wait_for

                    wait_for(ws, agent_id, item, exc, moment, moment + timedelta(seconds=remaining))
                    waiting = True
                # jittered, growing poll: waiters do not stampede the lock the moment it frees
                from random import uniform

                time.sleep(min(remaining, delay * uniform(0.5, 1.0)))
                delay, retried = min(delay * 1.5, 0.5), True
    finally:
        if waiting:
            from .claim_waits import withdraw

            try:
                withdraw(ws, agent_id, item)
            except SynapolisError:
                pass  # a record left behind goes stale by itself (claim_waits.stale_wait_s)


def renew(ws, item: str, agent_id: str, token: int, ttl_s: float | None = None,
          now: datetime | None = None) -> Claim:
    """Extend the live lease `token` of `agent_id` (same token); StaleToken once it is not live.

    A token that stopped being live (expired, released, taken over) never becomes live again.
    """
    return Claim(renew_record(ws, item, agent_id, token, ttl_s=ttl_s, now=now), event="renewed")


def release(ws, item: str, agent_id: str, force: bool = False, reason: str | None = None,
            now: datetime | None = None, token: int | None = None) -> Claim:
    """Release `item`. Only its holder may, unless `force` with a reason (recorded).

    With `token`, only that lease is released (StaleToken when it is no longer live); releasing an
    already released claim changes nothing (`event` None).
    """
    record, event = release_record(ws, item, agent_id, force=force, reason=reason, now=now, token=token)
    return Claim(record, event=event)


def held(item: str, *, agent_id: str, ws=None, session_id: str | None = None, ttl_s: float | None = None,
         wait_s: float = 0, beat: bool = True) -> Claim:
    """`with held("ticket:142", agent_id="a") as c:` — claim, renew every ttl/3 while the body runs
    (and keep the holder's heartbeat fresh, unless `beat=False`), release on exit.
    `c.token`, `c.check()` (StaleToken once lost), `c.lost` (why renewal stopped)."""
    record = claim(ws, item, agent_id, session_id=session_id, ttl_s=ttl_s, wait_s=wait_s)
    record._beat = beat
    return record


claim_context = held

__all__ = ["Claim", "claim", "held", "claim_context", "release", "renew", "check", "list_claims", "reap",
           "encode_item", "claim_path", "claim_state", "holder_status", "check_ttl", "check_wait", "check_force",
           "beat_holder"]
