"""Signals on an open session connection: sending, visibility, honest delivery, acks, Lamport values.

Every function here runs inside a transaction the caller holds (a store.Transaction from
`SessionStore.write()`/`.read()`), so a drain marks exactly the rows it returns in the same
transaction (SPEC-037). The decisions are here; the store only fetches and stores.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from .errors import ForbiddenError, NotFoundError, RateLimitedError, UsageError
from .names import check_text, is_subagent_of, sha256 as _sha256, validate_agent_id
from .sessions import agent_row, is_live, ts

TYPES = ("inform", "query", "delegate", "ack", "warn", "sleep_event", "sleep_request")
METHODS = ("startup_drain", "piggyback", "poll", "push", "hook")
BROADCAST = "*"
# who system messages (the escalation writer's `warn`) come from; not a registered agent
SYSTEM_SENDER = "synapolis.watchdog"
MAX_HOOK_OFFERS = 3
MIN_PREFIX = 8
_HEX_RE = re.compile(r"^[0-9a-f]+$")


def signal_id(sender: str, recipient: str, type_: str, content: str, timestamp: str) -> str:
    """EP-0118 §3: SHA-256 hex of `sender|recipient|type|content|timestamp`."""
    return _sha256(f"{sender}|{recipient}|{type_}|{content}|{timestamp}".encode("utf-8")).hexdigest()


def is_visible(row, agent_id: str) -> bool:
    """Whether reader `agent_id` sees this signal at all (history included)."""
    recipient, sender = row["recipient"], row["sender"]
    if recipient == BROADCAST:
        return sender != agent_id and not is_subagent_of(sender, agent_id)
    return recipient == agent_id or is_subagent_of(recipient, agent_id)


def as_dict(row) -> dict:
    """A signal as the contract shows it; reader fields when the row carries them."""
    out = {"id": row["id"], "sequence": row["sequence"], "timestamp": row["timestamp"], "sender": row["sender"],
           "recipient": row["recipient"], "type": row["type"], "content": row["content"],
           "lamport": row["lamport"], "reply_to": row["reply_to"]}
    keys = row.keys()
    if "read_at" in keys:
        out["read"] = row["read_at"] is not None
        out["read_at"] = row["read_at"]
        out["delivered_at"] = row["delivered_at"]
        out["delivery_method"] = row["delivery_method"]
    return out


def recent(tx, limit: int = 20) -> list[dict]:
    """The session's newest `limit` signals, oldest first, whoever they are for (a person's view)."""
    return [as_dict(row) for row in reversed(tx.recent_signals(limit))]


def _reader(tx, agent_id: str):
    row = agent_row(tx, agent_id)
    if row is None:
        raise NotFoundError(f"agent {agent_id!r} is not registered in this session")
    return row


def query(tx, agent_id: str, *, unread_only: bool = True, include_history: bool = False,
          after: int = 0, limit: int | None = None) -> list[dict]:
    """Pure: the reader's signals oldest first. Unread: the oldest `limit`; otherwise the newest `limit`."""
    state = _reader(tx, agent_id)
    if unread_only:
        dfloor = max(state["read_upto"], after)
        bfloor = max(dfloor, 0 if include_history else state["joined_seq"])
    else:
        dfloor = after
        bfloor = max(after, 0 if include_history else state["joined_seq"])
    rows = tx.visible_signals(agent_id, bfloor, dfloor, unread=unread_only, newest_first=not unread_only,
                              limit=limit, reader_fields=True)
    return [as_dict(r) for r in rows]


def unread(tx, agent_id: str, limit: int | None = None) -> list[dict]:
    """Pure: the reader's unread signals, oldest first (history broadcasts are not unread)."""
    return query(tx, agent_id, unread_only=True, limit=limit)


def latest_visible_sequence(tx, agent_id: str) -> int:
    """The newest sequence the reader can see (0 when none): "is there something new for this inbox?"."""
    return tx.latest_visible_sequence(agent_id)


# -- sending ---------------------------------------------------------------------------------------

def audience_rows(tx, recipient: str, sender: str) -> list:
    """Registered agents who will see a signal; NotFoundError for a recipient nobody can be."""
    if recipient == BROADCAST:
        rows = tx.agents()
        return [r for r in rows if r["id"] != sender and not is_subagent_of(sender, r["id"])]
    parts = recipient.split(".")
    candidates = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    rows = tx.agents(candidates)
    if not rows:
        raise NotFoundError(f"unknown recipient {recipient!r}: no agent {candidates[0]!r} is registered in this "
                            "session (use '*' to broadcast)")
    return rows


def audience(rows, now: datetime, config) -> dict:
    """Which recipients are live and which the signal waits for (stale, asleep, stopped)."""
    live = [r["id"] for r in rows if is_live(r, now, config)]
    waiting = [r["id"] for r in rows if not is_live(r, now, config)]
    status = {r["id"]: ("stale" if r["status"] in ("active", "idle") else r["status"])
              for r in rows if r["id"] in waiting}
    return {"live": live, "waiting": waiting, "waiting_status": status}


def take_token(tx, agent_id: str, now: datetime, config) -> None:
    """The per-agent token bucket: rate_limit_per_min, refilled continuously; RateLimitedError past it."""
    rate = float(config.rate_limit_per_min)
    per_s = rate / 60.0
    moment = now.timestamp()
    row = tx.rate_bucket(agent_id)
    tokens = rate if row is None else min(rate, row["tokens"] + max(0.0, moment - row["updated_at"]) * per_s)
    if tokens < 1.0:
        wait = (1.0 - tokens) / per_s
        raise RateLimitedError(f"{agent_id} has sent {int(rate)} signals in the last minute "
                               f"(rate_limit_per_min): retry in {wait:.1f} s", retry_after_s=wait)
    tx.set_rate_bucket(agent_id, tokens - 1.0, moment)


def check_content(content, config) -> str:
    if not isinstance(content, str):
        raise UsageError("signal content must be text")
    if content == "":
        raise UsageError("signal content is empty")
    size = len(check_text(content, "signal content").encode("utf-8"))
    if size > int(config.max_content_bytes):
        raise UsageError(f"signal content is {size} bytes, more than max_content_bytes={config.max_content_bytes}")
    return content


def find_signal(tx, ref: str, agent_id: str | None = None):
    """The one signal a full id or a unique prefix (8+ hex) names; visible to `agent_id` when given."""
    text = ref.strip().lower() if isinstance(ref, str) else ""
    if len(text) < MIN_PREFIX or len(text) > 64 or not _HEX_RE.match(text):
        raise UsageError(f"signal id {ref!r} must be a full id or a prefix of at least {MIN_PREFIX} hex characters")
    rows = tx.find_signals(text, 100)
    if agent_id is not None:
        rows = [r for r in rows if is_visible(r, agent_id)]
    if not rows:
        raise NotFoundError(f"no signal {ref!r}" + (f" visible to {agent_id}" if agent_id else ""))
    if len(rows) > 1:
        raise UsageError(f"signal id prefix {ref!r} is ambiguous ({len(rows)} signals): give more characters")
    return rows[0]


def send(tx, *, caller: str | None, recipient: str, content: str, now: datetime, config,
         type_: str = "inform", sender: str | None = None, reply_to: str | None = None,
         rate_limited: bool = True) -> tuple[dict, dict]:
    """Store one signal (marking nothing delivered); returns (signal, audience).

    `caller` is the registered agent acting (None for the system sender); `sender` is the caller or
    one of its sub-agents. The Lamport value is above the caller's clock, which every delivery and
    ack to it raises, and above the signal it replies to.
    """
    if type_ not in TYPES:
        raise UsageError(f"signal type must be one of {', '.join(TYPES)}, not {type_!r}")
    check_content(content, config)
    if recipient != BROADCAST:
        validate_agent_id(recipient, "recipient")
    sender = sender or caller or SYSTEM_SENDER
    validate_agent_id(sender, "sender id")
    if caller is not None and sender != caller and not is_subagent_of(sender, caller):
        raise ForbiddenError(f"sender {sender!r} is neither the caller {caller!r} nor one of its sub-agents")
    rows = audience_rows(tx, recipient, sender)
    if rate_limited and caller is not None:
        take_token(tx, caller, now, config)
    if caller is not None:
        clock = int(_reader(tx, caller)["lamport"])
    else:
        clock = tx.max_lamport()
    reply_id = None
    if reply_to:
        replied = find_signal(tx, reply_to)
        reply_id = replied["id"]
        clock = max(clock, int(replied["lamport"]))
    lamport = clock + 1
    moment = now
    while True:
        stamp = ts(moment)
        sid = signal_id(sender, recipient, type_, content, stamp)
        if not tx.signal_exists(sid):
            break
        moment = moment + timedelta(microseconds=1)  # the same message twice in one microsecond
    signal = {"id": sid, "sequence": None, "timestamp": stamp, "sender": sender,
              "recipient": recipient, "type": type_, "content": content, "lamport": lamport, "reply_to": reply_id}
    signal["sequence"] = tx.insert_signal(signal)
    if caller is not None:
        tx.raise_lamport(caller, lamport)
    return signal, audience(rows, now, config)


# -- delivery and acks -----------------------------------------------------------------------------

def _raise_clock(tx, agent_id: str, lamports) -> None:
    top = max(lamports, default=0)
    if top:
        tx.raise_lamport(agent_id, top)


def drain(tx, agent_id: str, method: str, now: datetime, config, limit: int | None = None,
          budget_chars: int | None = None) -> list[dict]:
    """Inside a write transaction: the reader's undelivered unread signals, marked delivered with `method`.

    For `hook`, also signals a hook delivered that are still unacked after redeliver_after_s, up to
    three offers in all. `limit` and `budget_chars` (a sum of content lengths) cut the oldest-first
    list, and only what is returned is marked.
    """
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    if not tx.try_exclusive("drain:" + agent_id):
        return []  # another drain of this agent is delivering these right now: never wait behind it
    state = agent_row(tx, agent_id)
    if state is None:
        return []
    floor = state["delivered_upto"]
    fresh = [dict(as_dict(r), offers=0) for r in tx.visible_signals(
        agent_id, max(floor, state["joined_seq"]), floor, unread=True, undelivered=True,
        limit=None if limit is None else int(limit) + 1)]
    again = []
    if method == "hook":
        cutoff = ts(now - timedelta(seconds=float(config.redeliver_after_s)))
        again = [dict(as_dict(r), offers=r["offers"]) for r in tx.hook_redeliveries(agent_id, MAX_HOOK_OFFERS, cutoff)]
    candidates = sorted(fresh + again, key=lambda s: s["sequence"])
    chosen, used, complete = [], 0, True
    for item in candidates:
        cost = len(item["content"]) + 200
        if (limit is not None and len(chosen) >= limit) or (budget_chars is not None and used + cost > budget_chars):
            complete = False
            break
        chosen.append(item)
        used += cost
    if not chosen:
        return []
    stamp = ts(now)
    new_ids = [s["id"] for s in chosen if s["offers"] == 0]
    if new_ids:
        tx.add_deliveries(agent_id, new_ids, stamp, method)
    redo = [s["id"] for s in chosen if s["offers"] > 0]
    if redo:
        tx.reoffer(agent_id, redo, stamp)
    # everything visible up to the watermark is now delivered, read or history
    firsts = [s["sequence"] for s in chosen if s["offers"] == 0]
    if complete:
        mark = tx.max_sequence()
    else:
        left = [s["sequence"] for s in candidates[len(chosen):] if s["offers"] == 0]
        mark = (min(left) - 1) if left else max(firsts, default=floor)
    if mark > floor:
        tx.set_delivered_upto(agent_id, mark)
    _raise_clock(tx, agent_id, [s["lamport"] for s in chosen])
    out = []
    for s in chosen:
        offers = s.pop("offers") + 1
        s.update(read=False, read_at=None, delivered_at=stamp, delivery_method=method)
        if method == "hook":
            s["offer"] = offers
        out.append(s)
    return out


def has_undelivered(tx, agent_id: str) -> bool:
    """Pure: whether `drain` would find a first delivery for the reader now (hook redelivery aside).

    The same selection as `drain`, one row at most, in a read transaction: a long-lived caller whose
    refresh was coalesced needs no write transaction when this says no (nothing is marked either way).
    """
    state = agent_row(tx, agent_id)
    if state is None:
        return False
    floor = state["delivered_upto"]
    return tx.first_visible_sequence(agent_id, max(floor, state["joined_seq"]), floor, unread=True,
                                     undelivered=True) is not None


def _advance_read_upto(tx, agent_id: str) -> None:
    state = _reader(tx, agent_id)
    floor = state["read_upto"]
    first = tx.first_visible_sequence(agent_id, max(floor, state["joined_seq"]), floor, unread=True)
    mark = (first - 1) if first is not None else tx.max_sequence()
    if mark > floor:
        tx.set_read_upto(agent_id, mark)


def ack(tx, agent_id: str, refs, now: datetime, all_visible: bool = False) -> list[str]:
    """Inside a write transaction: mark signals read for the reader; returns the full ids acked."""
    _reader(tx, agent_id)
    if all_visible:
        rows = query(tx, agent_id, unread_only=True)
    else:
        if isinstance(refs, str):
            refs = refs.split(",")
        refs = [r.strip() for r in (refs or []) if r and r.strip()]
        if not refs:
            raise UsageError("name the signals to ack (comma-separated ids or prefixes), or pass --all")
        rows, seen = [], set()
        for ref in refs:
            row = find_signal(tx, ref, agent_id)
            if row["id"] not in seen:
                seen.add(row["id"])
                rows.append(row)
    stamp = ts(now)
    tx.add_reads(agent_id, [r["id"] for r in rows], stamp)
    _raise_clock(tx, agent_id, [r["lamport"] for r in rows])
    _advance_read_upto(tx, agent_id)
    return [r["id"] for r in rows]
