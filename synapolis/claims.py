"""Claims (contract §9): the claimed_by lock helper — leases, fencing tokens, take-over and reaping."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta

# hashlib (OpenSSL), threading, random, filelock and the holder-status rules (status) are imported where they
# are used, and the context managers are classes (no contextlib): `synapolis claim` runs on an agent's every
# edit, and an uncontended claim of a short name needs none of them
from .errors import (BusyError, ConflictError, ForbiddenError, InternalError, NotFoundError, StaleToken,
                     SynapolisError, UsageError)
from .names import check_text, is_name, validate_agent_id, validate_claim_item, validate_session_id
from .store import clock
# the claim files, their locks and a record's shape are the store's (store/local/claims.py, store/claim_keys.py);
# the names below are where people and tests have always found them
from .store.claim_keys import is_claim_record as _is_record
from .store.local.claims import (MAX_STEM, PATHS_LOCK, FileSlot, claim_file as _claim_file,  # noqa: F401
                                 claim_path, encode_item, file_document, file_documents, file_slot,
                                 item_lock as _item_lock, lock_file as _lock_file, try_item_lock as _try_item_lock)
from .timeutil import format_ts, humanize_age, parse_ts

SCHEMA_VERSION = 1
# The history in the claim file is capped; claims.jsonl keeps every event.
MAX_TRANSITIONS = 100
MAX_TTL_S = 10 * 366 * 86400
MAX_REASON = 4096
# a claim whose holder is in one of these is released by the watchdog (stale holders may come back)
REAPED_HOLDER_STATUSES = frozenset({"dead"})


# --- decisions -----------------------------------------------------------------------------------

def claim_state(record: dict, now: datetime) -> str:
    """held, expired or released: what a claim record means at `now`."""
    if record.get("released_at"):
        return "released"
    return "expired" if now >= parse_ts(record["expires_at"]) else "held"


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


def _number(value, what: str, *, minimum: float, strict: bool, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{what} must be a number of seconds, not {value!r}")
    if value < minimum or (strict and value == minimum) or value > maximum:
        bound = f"more than {minimum:g}" if strict else f"at least {minimum:g}"
        raise UsageError(f"{what} must be {bound} and at most {maximum:g} seconds, not {value!r}")
    return value


def check_ttl(ttl_s, config) -> float:
    return _number(config.claim_ttl_s if ttl_s is None else ttl_s, "ttl", minimum=0, strict=True,
                   maximum=MAX_TTL_S)


def check_wait(wait_s) -> float:
    return _number(wait_s or 0, "wait", minimum=0, strict=False, maximum=MAX_TTL_S)


def check_force(force: bool, reason) -> None:
    if reason is not None:
        check_text(reason, "the reason")
    if force and not (reason and reason.strip()):
        raise UsageError("--force needs --reason TEXT: say why you release another agent's claim")
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"the reason is longer than {MAX_REASON} characters")


def _push(record: dict, transition: dict) -> None:
    """Append to the file's history; consecutive renewals of one token collapse into one entry."""
    history = record["transitions"]
    last = history[-1] if history else None
    if (transition["event"] == "renewed" and last and last.get("event") == "renewed"
            and last.get("token") == transition["token"] and last.get("by") == transition["by"]):
        transition = {**transition, "count": int(last.get("count", 1)) + 1}
        history[-1] = transition
    else:
        history.append(transition)
    del history[:-MAX_TRANSITIONS]


def _commit(ws, slot, record: dict, transition: dict) -> None:
    """Persist the record (the token's high-water mark) and log its event: both or neither."""
    _push(record, transition)
    event = {"at": transition["at"], "item": record["item"], **{k: v for k, v in transition.items() if k != "at"}}
    slot.write(record, event)


class Claim(dict):
    """A claim record — a plain mapping, exactly the claim file — that is also a context manager.

    `with claim(...) as c:` renews the lease from a background thread every ttl/3 (refreshing the
    holder's heartbeat too, so a script that never beats is not taken over as 'missing') and
    releases on exit. `event` says what the call that produced it did (None: nothing changed).
    """

    def __init__(self, record: dict, *, ws=None, agent_id: str | None = None, session_id: str | None = None,
                 ttl_s: float | None = None, event: str | None = None, beat: bool = True):
        super().__init__(record)
        self.event = event
        self.lost: Exception | None = None  # why renewal stopped, when it did
        self._ws, self._agent_id, self._session_id, self._ttl_s = ws, agent_id, session_id, ttl_s
        self._beat = beat
        # the renewal thread and its stop event exist only while held (`with`): threading stays unloaded
        # for the CLI, which only claims
        self._stop = None
        self._thread = None
        self.overlaps: list[str] = []  # the caller's own held items overlapping this path claim (§14)

    @property
    def token(self) -> int:
        return self["token"]

    @property
    def item(self) -> str:
        return self["item"]

    def _refresh(self, record: dict) -> None:
        self.update(record)

    def check(self, now: datetime | None = None) -> dict:
        """The live record, or StaleToken when this claim's token is no longer the live one."""
        record = check(self._ws, self.item, self.token, now=now)
        self._refresh(record)
        return record

    def renew(self, now: datetime | None = None) -> dict:
        record = renew(self._ws, self.item, self._agent_id, self.token, ttl_s=self._ttl_s, now=now)
        self._refresh(record)
        return record

    def release(self, reason: str | None = None) -> dict:
        self._stop_renewing()
        record = release(self._ws, self.item, self._agent_id, reason=reason, token=self.token)
        self._refresh(record)
        return record

    def _renew_loop(self, beat_every: float | None) -> None:
        """Renew the lease every ttl/3 and, when beating, the heartbeat every third of its own ttl
        (a lease of an hour must not let the heartbeat go stale, which would invite a take-over)."""
        renew_every = max(self._ttl_s / 3.0, 0.05)
        next_renew = time.monotonic() + renew_every
        next_beat = time.monotonic() + beat_every if beat_every else math.inf
        while not self._stop.wait(max(0.0, min(next_renew, next_beat) - time.monotonic())):
            moment = time.monotonic()
            if moment >= next_beat:
                next_beat = moment + beat_every
                try:
                    beat_holder(self._ws, self._agent_id, self._session_id)
                except (OSError, UsageError, InternalError):
                    pass  # the lease is what matters here; the next beat tries again
            if moment < next_renew:
                continue
            try:
                self.renew()
                next_renew = moment + renew_every
            except BusyError:
                continue  # the lock stayed busy for busy_timeout_ms: try again at once
            except Exception as exc:  # noqa: BLE001 - lost (StaleToken) or broken: stop and say why
                self.lost = exc
                return

    def _stop_renewing(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            import threading

            if self._thread is not threading.current_thread():
                self._thread.join(timeout=max(5.0, self._ws.config.busy_timeout_ms / 1000.0 + 1))
        self._thread = None

    def __enter__(self) -> "Claim":
        if self._ws is None or self._agent_id is None:
            raise InternalError("this claim record was not made by claim() and cannot be held")
        beat_every = None
        if self._beat:
            doc = beat_holder(self._ws, self._agent_id, self._session_id)
            beat_every = max((doc.get("ttl_s") or self._ws.config.stale_after_s) / 3.0, 0.05)
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, args=(beat_every,),
                                        name=f"claim-renew {self.item}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._stop_renewing()
        try:
            self._refresh(release(self._ws, self.item, self._agent_id, token=self.token))
        except (StaleToken, NotFoundError):
            pass  # lost already (taken over, reaped or force-released): nothing of ours to release
        except Exception:  # noqa: BLE001
            if exc_type is None:
                raise  # never hide the body's own exception behind a failed release
        return False


def beat_holder(ws, agent_id: str, session_id: str | None = None) -> dict:
    """Refresh the holder's heartbeat (same status and task), as every act of an agent does (§7)."""
    from .heartbeat import write_heartbeat

    # a refresh, not a declaration: atomic but not fsynced, like every other verb's refresh
    return write_heartbeat(ws.paths, agent_id, session_id=session_id, durable=False)


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
                record, event, overlaps = _acquire(ws, item, agent_id, session_id, ttl, moment)
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


def _slot(ws, item: str):
    from .store import store_for

    return store_for(ws).claim_slot(item)


def _acquire(ws, item: str, agent_id: str, session_id: str | None, ttl: float, now: datetime):
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
    from .store import store_for

    validate_claim_item(item)
    record, existed = (slot.record, slot.existed) if slot is not None else store_for(ws).claim_document(item)
    if not existed:
        raise NotFoundError(f"{item} was never claimed", item=item)
    if record is None:
        raise InternalError(f"the claim record of {item} is unreadable; claim {item} again to repair it", item=item)
    return record


def renew(ws, item: str, agent_id: str, token: int, ttl_s: float | None = None,
          now: datetime | None = None) -> Claim:
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
    return Claim(record, event="renewed")


def release(ws, item: str, agent_id: str, force: bool = False, reason: str | None = None,
            now: datetime | None = None, token: int | None = None) -> Claim:
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
            return Claim(record, event=None)
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
        return Claim(record, event=transition["event"])


def _require_live(record: dict, token, now: datetime, agent_id: str | None = None,
                  allow_expired: bool = False) -> None:
    item, live = record["item"], record["token"]
    state = claim_state(record, now)
    if token != live:
        why = f"the live token is {live} (held by {record['claimed_by']})" if state != "released" else \
            f"the claim was released with token {live}"
    elif state == "released":
        why = f"it was released {humanize_age((now - parse_ts(record['released_at'])).total_seconds())}"
    elif state == "expired" and not allow_expired:
        why = (f"{record['claimed_by']}'s lease expired "
               f"{humanize_age((now - parse_ts(record['expires_at'])).total_seconds())}")
    elif agent_id is not None and record["claimed_by"] != agent_id:
        why = f"it is held by {record['claimed_by']}"
    else:
        return
    raise StaleToken(f"token {token} of {item} is not live: {why}", item=item, token=token,
                     live_token=live, holder=record["claimed_by"], state=state)


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
    from .store import store_for

    now = clock(ws, now)
    held: dict[str, list[str]] = {}
    for doc, _name, _error in store_for(ws).claim_documents():
        if _is_record(doc) and claim_state(doc, now) == "held":
            held.setdefault(doc["claimed_by"], []).append(doc["item"])
    return {agent: sorted(items) for agent, items in held.items()}


def list_claims(ws, now: datetime | None = None, *, held_only: bool = False) -> list[dict]:
    """Every claim file with its `state` (held/expired/released), the holder's effective status and
    whether another agent could take it now; an unreadable file is listed with state 'invalid'.
    `held_only`: only the claims held at `now` (`synapolis claims --held`)."""
    from .store import store_for

    now = clock(ws, now)
    statuses: dict[str, str] = {}
    out = []
    for doc, name, error in store_for(ws).claim_documents():
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
