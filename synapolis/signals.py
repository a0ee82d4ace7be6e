"""Signals on an open session connection: sending, visibility, honest delivery, acks, Lamport values.

Every function here runs inside a transaction the caller holds (a store.Transaction from
`SessionStore.write()`/`.read()`), so a drain marks exactly the rows it returns in the same
transaction (SPEC-037). The pure rules (visibility, audience, pages, the rate bucket) are rules/signals.py,
re-exported here; the store only fetches and stores.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .errors import ForbiddenError, NotFoundError, UsageError
from .names import PERSON_PREFIX, check_content, is_subagent_of, sha256_hex, validate_agent_id
from .rules.signals import (BROADCAST, audience, bucket_tokens, fit, is_visible, json_cost,  # noqa: F401 - as before
                            next_lamport, rate_limited_error, recipient_chain)
from .sessions import agent_row, ts
from .timeutil import micro_stamp

TYPES = ("inform", "query", "delegate", "ack", "warn", "sleep_event", "sleep_request")
METHODS = ("startup_drain", "piggyback", "poll", "push", "hook")
# who system messages (the escalation writer's `warn`) come from; not a registered agent
SYSTEM_SENDER = "synapolis.watchdog"
MAX_HOOK_OFFERS = 3
MIN_PREFIX = 8
_HEX = "0123456789abcdef"


def signal_id(sender: str, recipient: str, type_: str, content: str, timestamp: str) -> str:
    """EP-0118 §3: SHA-256 hex of `sender|recipient|type|content|timestamp`."""
    return sha256_hex(f"{sender}|{recipient}|{type_}|{content}|{timestamp}".encode("utf-8"))


def as_dict(row) -> dict:
    """A signal as the contract shows it; reader fields when the row carries them."""
    out = {"id": row["id"], "sequence": row["sequence"], "timestamp": row["timestamp"], "sender": row["sender"],
           "recipient": row["recipient"], "type": row["type"], "content": row["content"],
           "lamport": row["lamport"], "reply_to": row["reply_to"]}
    if out["sender"].startswith(PERSON_PREFIX):  # a person wrote it (synapolis.people)
        out["person"] = out["sender"][len(PERSON_PREFIX):]
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


MAX_SEQUENCE = 2 ** 63 - 1  # the largest signal sequence a store holds (SQLite's and PostgreSQL's bigint)


def _floors(state, unread_only: bool, include_history: bool, after: int) -> tuple[int, int]:
    """(broadcast floor, directed floor): the reader's signals above `after`, unread ones above its watermark."""
    # a sequence is a 64-bit integer in either store: an `after` beyond that (a client's 10**23) was an
    # OverflowError from the driver; no signal is above the largest sequence either
    after = min(after, MAX_SEQUENCE)
    dfloor = max(state["read_upto"], after) if unread_only else after
    return max(dfloor, 0 if include_history else state["joined_seq"]), dfloor


def query(tx, agent_id: str, *, unread_only: bool = True, include_history: bool = False,
          after: int | None = None, limit: int | None = None) -> list[dict]:
    """Pure: the reader's signals oldest first, unbounded unless `limit` is given (`page` is the bounded
    read). The oldest `limit` above `after`; everything (not unread_only) without `after`: the newest."""
    state = _reader(tx, agent_id)
    bfloor, dfloor = _floors(state, unread_only, include_history, after or 0)
    rows = tx.visible_signals(agent_id, bfloor, dfloor, unread=unread_only,
                              newest_first=not unread_only and after is None, limit=limit, reader_fields=True)
    return [as_dict(r) for r in rows]


# -- bounded answers -------------------------------------------------------------------------------
# Every answer that carries signals is a page: at most `limit` signals and about `budget_chars`
# characters of them as JSON, with a count of what is left (up to COUNT_CAP: counting a backlog of
# 100,000 on every page would make paging through it quadratic) and a cursor to the next page.
# An MCP answer carries the JSON twice (structured, and as text, escaped once more inside JSON-RPC,
# which at worst doubles it): 80 KB of signals is at most ~240 KB on the wire, under the 256 KB every
# answer must stay below; ~180 KB for ordinary text.

PAGE_LIMIT = 200  # read_signals, signals_pending, the inbox resource
PAGE_BUDGET_CHARS = 80 * 1024
PIGGYBACK_LIMIT = 20  # attached to the answer of any other verb (whose own part stays under 48 KB)
PIGGYBACK_BUDGET_CHARS = 32 * 1024
COUNT_CAP = 1000  # `remaining` counts up to this; COUNT_CAP means "this many or more"


def page(tx, agent_id: str, *, unread_only: bool = True, after: int | None = None, limit: int | None = None,
         budget_chars: int | None = None) -> dict:
    """Pure: one page of the reader's signals, oldest first: `signals`, `remaining` (not in the page, in
    paging order, counted up to COUNT_CAP) and `next_after` (the `after` of the next page; None at the end).

    Unread: the oldest unread above `after`. Everything (not unread_only, history included): with `after`,
    the oldest above it; without, the newest page, and `remaining` counts the older ones (page through
    them from `after=0`).
    """
    limit = PAGE_LIMIT if limit is None else limit
    budget_chars = PAGE_BUDGET_CHARS if budget_chars is None else budget_chars
    state = _reader(tx, agent_id)
    newest = not unread_only and after is None
    bfloor, dfloor = _floors(state, unread_only, not unread_only, after or 0)
    rows = tx.visible_signals(agent_id, bfloor, dfloor, unread=unread_only, newest_first=newest,
                              limit=int(limit) + 1, reader_fields=True)
    rows = [as_dict(r) for r in (rows[::-1] if newest else rows)]  # newest: the newest first, to fit from
    chosen = rows[:fit(rows, limit, budget_chars)]
    remaining = 0
    if newest:
        chosen.reverse()
        if len(chosen) < len(rows):
            remaining = tx.count_visible(agent_id, 0, 0, below=chosen[0]["sequence"], cap=COUNT_CAP)
    elif len(chosen) < len(rows):
        bfloor, dfloor = _floors(state, unread_only, not unread_only, chosen[-1]["sequence"])
        remaining = tx.count_visible(agent_id, bfloor, dfloor, unread=unread_only, cap=COUNT_CAP)
    next_after = chosen[-1]["sequence"] if remaining and not newest else None
    return {"signals": chosen, "remaining": remaining, "next_after": next_after}


def unread(tx, agent_id: str, limit: int | None = None) -> list[dict]:
    """Pure: the reader's unread signals, oldest first (history broadcasts are not unread)."""
    return query(tx, agent_id, unread_only=True, limit=limit)


def latest_visible_sequence(tx, agent_id: str) -> int:
    """The newest sequence the reader can see (0 when none): "is there something new for this inbox?"."""
    return tx.latest_visible_sequence(agent_id)


# -- sending ---------------------------------------------------------------------------------------

def audience_rows(tx, recipient: str, sender: str, caller: str | None = None) -> tuple[list, object]:
    """(registered agents who will see a signal, the caller's own row or None), in one query;
    NotFoundError for a recipient nobody can be."""
    if recipient == BROADCAST:
        rows = tx.agents()
        mine = next((r for r in rows if r["id"] == caller), None) if caller is not None else None
        return [r for r in rows if r["id"] != sender and not is_subagent_of(sender, r["id"])], mine
    candidates = recipient_chain(recipient)
    found = tx.agents(candidates + ([caller] if caller is not None and caller not in candidates else []))
    mine = next((r for r in found if r["id"] == caller), None) if caller is not None else None
    rows = [r for r in found if r["id"] in candidates]
    if not rows:
        raise _unknown_recipient(recipient)
    return rows, mine


def _unknown_recipient(recipient: str) -> NotFoundError:
    return NotFoundError(f"unknown recipient {recipient!r}: no agent {recipient_chain(recipient)[0]!r} is "
                         "registered in this session (use '*' to broadcast)")


def _unknown_caller(caller: str) -> NotFoundError:
    return NotFoundError(f"agent {caller!r} is not registered in this session")


def take_token(tx, agent_id: str, now: datetime, config) -> None:
    """The per-agent token bucket: rate_limit_per_min, refilled continuously; RateLimitedError past it."""
    rate = float(config.rate_limit_per_min)
    moment = now.timestamp()
    tokens = bucket_tokens(tx.rate_bucket(agent_id), moment, rate)
    if tokens < 1.0:
        raise rate_limited_error(agent_id, tokens, rate)
    tx.set_rate_bucket(agent_id, tokens - 1.0, moment)


def find_signal(tx, ref: str, agent_id: str | None = None):
    """The one signal a full id or a unique prefix (8+ hex) names; visible to `agent_id` when given."""
    text = ref.strip().lower() if isinstance(ref, str) else ""
    if len(text) < MIN_PREFIX or len(text) > 64 or text.strip(_HEX):
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
         rate_limited: bool = True, idempotency_key: str | None = None) -> tuple[dict, dict]:
    """Store one signal (marking nothing delivered); returns (signal, audience).

    `caller` is the registered agent acting (None for the system sender); `sender` is the caller or
    one of its sub-agents. The Lamport value is above the caller's clock, which every delivery and
    ack to it raises, and above the signal it replies to. `idempotency_key` is stored with the signal, under a
    unique index per sender: a second send with it raises store.KeyTaken (retries.py replays the first).
    """
    if type_ not in TYPES:
        raise UsageError(f"signal type must be one of {', '.join(TYPES)}, not {type_!r}")
    check_content(content, "signal content", config)
    if recipient != BROADCAST:
        validate_agent_id(recipient, "recipient")
    sender = sender or caller or SYSTEM_SENDER
    validate_agent_id(sender, "sender id")
    if caller is not None and sender != caller and not is_subagent_of(sender, caller):
        raise ForbiddenError(f"sender {sender!r} is neither the caller {caller!r} nor one of its sub-agents")
    if not reply_to and tx.offers_send_signal:
        return _send_in_one_call(tx, caller=caller, sender=sender, recipient=recipient, type_=type_, content=content,
                                 now=now, config=config, rate_limited=rate_limited, key=idempotency_key)
    rows, mine = audience_rows(tx, recipient, sender, caller)
    if caller is not None and mine is None:
        raise _unknown_caller(caller)
    if rate_limited and caller is not None:
        take_token(tx, caller, now, config)
    if caller is not None:
        clock = int(mine["lamport"])
    else:
        clock = tx.max_lamport()
    reply_id = replied_clock = None
    if reply_to:
        replied = find_signal(tx, reply_to)
        reply_id, replied_clock = replied["id"], int(replied["lamport"])
    lamport = next_lamport(clock, replied_clock)
    moment = now
    while True:
        signal = _new_signal(sender, recipient, type_, content, moment, lamport, reply_id, idempotency_key)
        signal["sequence"] = tx.insert_signal(signal, caller)  # and the caller's clock goes up to `lamport`
        if signal["sequence"] is not None:
            break
        moment = moment + timedelta(microseconds=1)  # the same message twice in one microsecond: a new id
    return signal, audience(rows, now, config)


def _new_signal(sender, recipient, type_, content, moment: datetime, lamport, reply_id, key=None) -> dict:
    """The row a send stores, stamped `moment` (its id hashes the stamp: a retry one microsecond later is new)."""
    stamp = micro_stamp(moment)  # sessions.ts, without its call
    signal = {"id": signal_id(sender, recipient, type_, content, stamp), "sequence": None, "timestamp": stamp,
              "sender": sender, "recipient": recipient, "type": type_, "content": content, "lamport": lamport,
              "reply_to": reply_id}
    if key is not None:
        signal["idempotency_key"] = key
    return signal


def _send_in_one_call(tx, *, caller, sender, recipient, type_, content, now, config, rate_limited, key=None):
    """`send` through the store's fused operation (`Transaction.send_signal`: the same checks, token bucket,
    Lamport value and insert in one round trip)."""
    candidates = None if recipient == BROADCAST else recipient_chain(recipient)
    rate = float(config.rate_limit_per_min) if rate_limited and caller is not None else None
    moment = now
    # a store that judges a broadcast's audience itself (SQLite: from an index, no row per recipient) gets the
    # live window; the others answer the rows signals.audience judges
    window = None
    if candidates is None and tx.judges_audience:
        from .status import registry_window

        window = registry_window(now, config)
    while True:
        signal = _new_signal(sender, recipient, type_, content, moment, None, None, key)
        outcome = tx.send_signal(signal, caller=caller, candidates=candidates, rate=rate, moment=now.timestamp(),
                                 window=window)
        refused = outcome.get("refused")
        if refused == "recipient":
            raise _unknown_recipient(recipient)
        if refused == "caller":
            raise _unknown_caller(caller)
        if refused == "rate":
            raise rate_limited_error(caller, float(outcome["tokens"]), rate)
        signal["lamport"] = int(outcome["lamport"])
        if outcome.get("sequence") is not None:
            signal["sequence"] = int(outcome["sequence"])
            heard = outcome.get("audience")
            return signal, heard if heard is not None else audience(outcome["rows"], now, config)
        rate = None  # that id is stored already: a new one, with the token this transaction spent
        moment = moment + timedelta(microseconds=1)


# -- delivery and acks -----------------------------------------------------------------------------

def _raise_clock(tx, agent_id: str, lamports) -> None:
    top = max(lamports, default=0)
    if top:
        tx.raise_lamport(agent_id, top)


def drain(tx, agent_id: str, method: str, now: datetime, config, limit: int | None = None,
          budget_chars: int | None = None, fits=None) -> list[dict]:
    """`drain_page` without the count of what is left."""
    return drain_page(tx, agent_id, method, now, config, limit=limit, budget_chars=budget_chars, fits=fits)[0]


def drain_page(tx, agent_id: str, method: str, now: datetime, config, limit: int | None = None,
               budget_chars: int | None = None, fits=None) -> tuple[list[dict], int]:
    """Inside a write transaction: a page of the reader's undelivered unread signals, marked delivered with
    `method`; (the page, how many undelivered are left, counted up to COUNT_CAP).

    For `hook`, also signals a hook delivered that are still unacked after redeliver_after_s, up to
    three offers in all. `limit`, `budget_chars` (JSON characters, `fit`; defaults PAGE_LIMIT and
    PAGE_BUDGET_CHARS) and `fits(chosen, next)` (False: the next one would not fit what the caller can
    show) cut the oldest-first list, and only what is returned is marked. A hook's budget is a hard cap;
    any other page holds at least one signal, so paging never stalls.
    """
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    if not tx.try_exclusive("drain:" + agent_id):
        return [], 0  # another drain of this agent is delivering these right now: never wait behind it
    state = agent_row(tx, agent_id)
    if state is None:
        return [], 0
    limit = PAGE_LIMIT if limit is None else int(limit)
    if budget_chars is None and fits is None:  # a caller's own `fits` (a hook's exact measure) replaces it
        budget_chars = PAGE_BUDGET_CHARS
    floor = state["delivered_upto"]
    newest = tx.signals_above(floor, QUICK_LOOK) if method != "hook" else None  # a hook also redelivers
    if newest is not None and len(newest) <= QUICK_LOOK and not _any_new(newest, agent_id, state):
        # nothing here for the reader: no inbox query. The watermark moves past what it cannot see once
        # half a quick look has gathered above it (one UPDATE every few calls of a busy sender, not each)
        if len(newest) > QUICK_LOOK // 2:
            tx.set_delivered_upto(agent_id, newest[0]["sequence"])
        return [], 0
    fresh = [dict(as_dict(r), offers=0) for r in tx.visible_signals(
        agent_id, max(floor, state["joined_seq"]), floor, unread=True, undelivered=True, limit=limit + 1)]
    again = []
    if method == "hook":
        cutoff = ts(now - timedelta(seconds=float(config.redeliver_after_s)))
        again = [dict(as_dict(r), offers=r["offers"]) for r in tx.hook_redeliveries(agent_id, MAX_HOOK_OFFERS, cutoff)]
    candidates = sorted(fresh + again, key=lambda s: s["sequence"])
    chosen = candidates[:fit(candidates, limit, budget_chars, at_least_one=method != "hook")]
    if fits is not None:
        for count, item in enumerate(chosen):
            if not fits(chosen[:count], item):
                chosen = chosen[:count]
                break
    complete = len(chosen) == len(candidates) and len(fresh) <= limit
    remaining = 0
    if not complete:
        # the page is a prefix by sequence: what is left is everything undelivered above its last signal
        above = max([floor] + [s["sequence"] for s in chosen])
        remaining = tx.count_visible(agent_id, max(above, state["joined_seq"]), above, unread=True,
                                     undelivered=True, cap=COUNT_CAP)
    if not chosen:
        if not fresh and newest:
            # every signal the reader sees up to the newest one is delivered, read or history: the next
            # drain looks only above it (and, when nothing new is there, with signals_above alone)
            tx.set_delivered_upto(agent_id, newest[0]["sequence"])
        return [], remaining
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
    return out, remaining


QUICK_LOOK = 16  # signals above the watermark a drain inspects itself before it runs the inbox query


def _any_new(above, agent_id: str, state) -> bool:
    """Whether any of `above` (signals above the reader's delivered watermark, Transaction.signals_above)
    may be one a drain hands the reader: one it sees, a broadcast only above the floor of its history."""
    bfloor = max(state["delivered_upto"], state["joined_seq"])
    return any(is_visible(row, agent_id) and (row["recipient"] != BROADCAST or row["sequence"] > bfloor)
               for row in above)


def mark_delivered(tx, agent_id: str, signals: list, method: str, now: datetime) -> None:
    """Inside a write transaction: mark those of `signals` (a page just put into an answer to the reader)
    not yet delivered to it as delivered with `method`, and set their reader fields to say so."""
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    stamp = ts(now)
    fresh = [s for s in signals if not s.get("delivered_at")]
    if fresh:
        tx.add_deliveries(agent_id, [s["id"] for s in fresh], stamp, method)
    for s in fresh:
        s.update(delivered_at=stamp, delivery_method=method)
    _raise_clock(tx, agent_id, [s["lamport"] for s in signals])
    state = _reader(tx, agent_id)
    floor = state["delivered_upto"]
    first = tx.first_visible_sequence(agent_id, max(floor, state["joined_seq"]), floor, unread=True,
                                      undelivered=True)
    mark = (first - 1) if first is not None else tx.max_sequence()
    if mark > floor:
        tx.set_delivered_upto(agent_id, mark)


def has_undelivered(tx, agent_id: str) -> bool:
    """Pure: whether `drain` would find a first delivery for the reader now (hook redelivery aside).

    The same selection as `drain`, one row at most, in a read transaction: a long-lived caller whose
    refresh was coalesced needs no write transaction when this says no (nothing is marked either way).
    """
    state = agent_row(tx, agent_id)
    if state is None:
        return False
    floor = state["delivered_upto"]
    above = tx.signals_above(floor, QUICK_LOOK)
    if above is not None and len(above) <= QUICK_LOOK and not _any_new(above, agent_id, state):
        return False
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
