"""The claim rules (contract §9): a record's state, the bounds of ttl/wait/reason, history, fencing. Pure."""

from __future__ import annotations

import math
from datetime import datetime

from ..errors import StaleToken, UsageError
from ..names import check_text
from ..timeutil import humanize_age, parse_ts

SCHEMA_VERSION = 1
# The history in the claim file is capped; claims.jsonl keeps every event.
MAX_TRANSITIONS = 100
MAX_TTL_S = 10 * 366 * 86400
MAX_REASON = 4096
# a claim whose holder is in one of these is released by the watchdog (stale holders may come back)
REAPED_HOLDER_STATUSES = frozenset({"dead"})


def claim_state(record: dict, now: datetime) -> str:
    """held, expired or released: what a claim record means at `now`."""
    if record.get("released_at"):
        return "released"
    return "expired" if now >= parse_ts(record["expires_at"]) else "held"


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
