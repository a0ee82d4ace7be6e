"""The claim operations on one item's record through the store: acquire, renew, release, check, list, reap."""

from __future__ import annotations

from datetime import datetime, timedelta

from .errors import ConflictError, ForbiddenError, InternalError, NotFoundError, SynapolisError, UsageError
from .names import is_name, validate_agent_id, validate_claim_item
from .rules.claims import (REAPED_HOLDER_STATUSES, SCHEMA_VERSION, _push, _require_live, check_force, check_ttl,
                           claim_state)
from .store import clock
from .store.claim_keys import is_claim_record as _is_record  # a record's shape: the store reads by it too
from .timeutil import format_ts, humanize_age, parse_ts


def holder_status(ws, agent_id: str, now: datetime) -> str:
    """The holder's effective status by the monitor's own function; 'invalid' for a name no agent has.
    On a shared store a holder on another machine is judged by its heartbeat copy there."""
    from .status import status_of_agent_anywhere  # only a claim that meets another's lease asks

    try:
        return status_of_agent_anywhere(ws, agent_id, now)
    except UsageError:
        return "invalid"


def _claimable_from() -> frozenset:
    """The holder statuses a claim may take over from (status.CLAIMABLE_FROM, the monitor's own rule)."""
    from .status import CLAIMABLE_FROM

    return CLAIMABLE_FROM


def _commit(ws, slot, record: dict, transition: dict) -> None:
    """Persist the record (the token's high-water mark) and log its event: both or neither."""
    _push(record, transition)
    event = {"at": transition["at"], "item": record["item"], **{k: v for k, v in transition.items() if k != "at"}}
    slot.write(record, event)


def _slot(ws, item: str):
    return ws.store.claim_slot(item)


def acquire(ws, item: str, agent_id: str, session_id: str | None, ttl: float, now: datetime):
    now_s = format_ts(now)
    expires_s = format_ts(now + timedelta(seconds=ttl))
    with _slot(ws, item) as slot:
        record, existed = slot.record, slot.existed
        state = claim_state(record, now) if record else None
        renewing = state == "held" and record["claimed_by"] == agent_id
        # a path pattern is refused while a live other holds an overlapping one (§14); a renewal is not
        # (the lease is the holder's already), but it too reports the caller's own overlapping items
        overlaps = [] if is_name(item) else _overlaps(ws, slot, item, agent_id, now, check=not renewing)
        if renewing:
            record.update(renewed_at=now_s, ttl_s=ttl, expires_at=expires_s,
                          session_id=session_id or record.get("session_id"))
            _commit(ws, slot, record, {"at": now_s, "event": "renewed", "by": agent_id,
                                       "token": record["token"], "expires_at": expires_s})
            return record, "renewed", overlaps
        transition = {"at": now_s, "event": "claimed", "by": agent_id}
        taken_over_from = None
        if state in ("held", "expired"):
            holder = record["claimed_by"]
            status = holder_status(ws, holder, now)
            if state == "held" and status not in _claimable_from():
                expires = parse_ts(record["expires_at"])
                raise ConflictError(
                    f"{item} is held by {holder} (token {record['token']}, {status}) until "
                    f"{record['expires_at']} ({humanize_age((now - expires).total_seconds())}); "
                    "retry with --wait, or ask the holder to release it",
                    item=item, holder=holder, holder_item=item, holder_status=status,
                    expires_at=record["expires_at"], token=record["token"])
            reason = "expired" if state == "expired" else status
            if holder != agent_id:
                taken_over_from = {"agent_id": holder, "token": record["token"], "reason": reason,
                                   "holder_status": status, "expires_at": record["expires_at"]}
                transition.update(event="taken_over", **{"from": holder, "from_token": record["token"]})
            transition["reason"] = reason
        token = slot.high_water() + 1
        if existed and record is None:
            transition["recovered"] = True  # the old file was unreadable; the token came from the log
        history = list(record["transitions"]) if record else []
        record = {
            "schema_version": SCHEMA_VERSION,
            "item": item,
            "claimed_by": agent_id,
            "session_id": session_id,
            "token": token,
            "claimed_at": now_s,
            "renewed_at": None,
            "ttl_s": ttl,
            "expires_at": expires_s,
            "released_at": None,
            "released_by": None,
            "release_reason": None,
            "taken_over_from": taken_over_from,
            "transitions": history,
        }
        transition.update(token=token, expires_at=expires_s)
        _commit(ws, slot, record, transition)
        return record, transition["event"], overlaps


def _overlaps(ws, slot, item: str, agent_id: str, now: datetime, check: bool) -> list[str]:
    """The caller's own held items overlapping the path pattern `item`; with `check`, ConflictError (exit 3)
    naming the first live other holding one (§14). Its holder's status is judged as for the same item (§9)."""
    from .claim_index import overlapping
    from .project import project_of

    own = []
    for other in overlapping(slot, item, now, project_of(ws)[1]):
        holder = other["claimed_by"]
        if holder == agent_id:
            own.append(other["item"])
            continue
        if not check:
            continue
        status = holder_status(ws, holder, now)
        if status in _claimable_from():
            continue
        expires = parse_ts(other["expires_at"])
        raise ConflictError(
            f"{item} overlaps {other['item']}, held by {holder} (token {other['token']}, {status}) until "
            f"{other['expires_at']} ({humanize_age((now - expires).total_seconds())}); "
            "retry with --wait, or ask the holder to release it",
            item=item, holder=holder, holder_item=other["item"], holder_status=status,
            expires_at=other["expires_at"], token=other["token"])
    return sorted(own)


def _existing(ws, item: str, slot=None):
    """The record of an item that was claimed (from `slot` when held), else NotFoundError; nothing is created."""
    validate_claim_item(item)
    record, existed = (slot.record, slot.existed) if slot is not None else ws.store.claim_document(item)
    if not existed:
        raise NotFoundError(f"{item} was never claimed", item=item)
    if record is None:
        raise InternalError(f"the claim record of {item} is unreadable; claim {item} again to repair it", item=item)
    return record


def renew_record(ws, item: str, agent_id: str, token: int, ttl_s: float | None = None,
                 now: datetime | None = None) -> dict:
    """Extend the live lease `token` of `agent_id` (same token); StaleToken once it is not live.

    A token that stopped being live (expired, released, taken over) never becomes live again.
    """
    validate_agent_id(agent_id)
    ttl = check_ttl(ttl_s, ws.config)
    _existing(ws, item)  # NotFound before any lock file is made
    now = clock(ws, now)
    with _slot(ws, item) as slot:
        record = _existing(ws, item, slot)
        _require_live(record, token, now, agent_id)
        now_s, expires_s = format_ts(now), format_ts(now + timedelta(seconds=ttl))
        record.update(renewed_at=now_s, ttl_s=ttl, expires_at=expires_s)
        _commit(ws, slot, record, {"at": now_s, "event": "renewed", "by": agent_id, "token": token,
                                   "expires_at": expires_s})
    return record


def release_record(ws, item: str, agent_id: str, force: bool = False, reason: str | None = None,
                   now: datetime | None = None, token: int | None = None) -> tuple[dict, str | None]:
    """Release `item`. Only its holder may, unless `force` with a reason (recorded).

    With `token`, only that lease is released (StaleToken when it is no longer live); releasing an
    already released claim changes nothing (`event` None).
    """
    validate_claim_item(item)
    validate_agent_id(agent_id)
    check_force(force, reason)
    now = clock(ws, now)
    _existing(ws, item)  # NotFound before any lock file is made
    with _slot(ws, item) as slot:
        record = _existing(ws, item, slot)
        if token is not None:
            _require_live(record, token, now, agent_id, allow_expired=True)
        if record.get("released_at"):
            slot.settle()  # a crashed change of it may still owe its log line
            return record, None
        holder = record["claimed_by"]
        now_s = format_ts(now)
        transition = {"at": now_s, "event": "released", "by": agent_id, "token": record["token"]}
        if holder != agent_id:
            if not force:
                raise ForbiddenError(
                    f"{item} is held by {holder}, not {agent_id}: only the holder may release it "
                    "(or --force --reason TEXT)", item=item, holder=holder)
            transition.update(event="force_released", **{"from": holder})
        if reason:
            transition["reason"] = reason.strip()
        record.update(released_at=now_s, released_by=agent_id, release_reason=transition.get("reason"))
        _commit(ws, slot, record, transition)
        return record, transition["event"]


def check(ws, item: str, token, now: datetime | None = None) -> dict:
    """The fencing check: the record when `token` is the live holder's token (unreleased, unexpired);
    StaleToken otherwise, NotFoundError for an item never claimed. Reads only; takes no lock."""
    validate_claim_item(item)
    if isinstance(token, bool) or not isinstance(token, int):
        raise UsageError(f"a token is a whole number, not {token!r}")
    record = _existing(ws, item)
    _require_live(record, token, clock(ws, now))
    return record


def held_items(ws, now: datetime | None = None) -> dict[str, list[str]]:
    """{agent_id: [items it holds now]} (unreleased, unexpired leases), for the monitor document."""
    now = clock(ws, now)
    held: dict[str, list[str]] = {}
    for doc, _name, _error in ws.store.claim_documents():
        if _is_record(doc) and claim_state(doc, now) == "held":
            held.setdefault(doc["claimed_by"], []).append(doc["item"])
    return {agent: sorted(items) for agent, items in held.items()}


def list_claims(ws, now: datetime | None = None, *, held_only: bool = False) -> list[dict]:
    """Every claim file with its `state` (held/expired/released), the holder's effective status and
    whether another agent could take it now; an unreadable file is listed with state 'invalid'.
    `held_only`: only the claims held at `now` (`synapolis claims --held`)."""
    now = clock(ws, now)
    statuses: dict[str, str] = {}
    out = []
    for doc, name, error in ws.store.claim_documents():
        if not _is_record(doc):
            out.append({"item": None, "file": name, "state": "invalid", "error": error})
            continue
        entry = dict(doc)
        entry["state"] = claim_state(doc, now)
        if entry["state"] == "released":
            entry["holder_status"], entry["takeable"] = None, True
        else:
            holder = doc["claimed_by"]
            if holder not in statuses:
                statuses[holder] = holder_status(ws, holder, now)
            entry["holder_status"] = statuses[holder]
            entry["takeable"] = entry["state"] == "expired" or statuses[holder] in _claimable_from()
        out.append(entry)
    out.sort(key=lambda e: (e["item"] is None, e["item"] or e.get("file", "")))
    return [e for e in out if e["state"] == "held"] if held_only else out


def reap(ws, now: datetime | None = None) -> list[dict]:
    """Release every claim whose lease expired or whose holder is dead, an event each (the watchdog).

    A stale holder may still come back, so its claim stays (others may take it over, §9). An item
    whose lock is busy is left for the next pass rather than failing the whole pass.
    """
    now = clock(ws, now)
    reaped = []
    for entry in list_claims(ws, now):
        if entry["state"] != "expired" and entry.get("holder_status") not in REAPED_HOLDER_STATUSES:
            continue
        item = entry["item"]
        try:
            with _slot(ws, item) as slot:
                record = _existing(ws, item, slot)
                state = claim_state(record, now)
                if state == "released":
                    continue
                status = holder_status(ws, record["claimed_by"], now)
                if state != "expired" and status not in REAPED_HOLDER_STATUSES:
                    continue  # it was renewed or the holder came back meanwhile
                reason = "expired" if state == "expired" else f"holder {status}"
                now_s = format_ts(now)
                record.update(released_at=now_s, released_by=None, release_reason=reason)
                _commit(ws, slot, record, {"at": now_s, "event": "reaped", "by": None, "token": record["token"],
                                           "from": record["claimed_by"], "reason": reason})
                reaped.append(record)
        except SynapolisError:
            continue  # busy, or a damaged file: the next pass tries again; one item never stops the pass
    return reaped
