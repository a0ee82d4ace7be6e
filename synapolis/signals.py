"""Signals on an open session connection: sending, visibility, honest delivery, acks, Lamport values.

Every function here runs inside a transaction the caller holds (`SessionStore.write()`/`.read()`),
so a drain marks exactly the rows it returns in the same transaction (SPEC-037).
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
_COLS = "s.sequence, s.id, s.timestamp, s.sender, s.recipient, s.type, s.content, s.lamport, s.reply_to"


def signal_id(sender: str, recipient: str, type_: str, content: str, timestamp: str) -> str:
    """EP-0118 §3: SHA-256 hex of `sender|recipient|type|content|timestamp`."""
    return _sha256(f"{sender}|{recipient}|{type_}|{content}|{timestamp}".encode("utf-8")).hexdigest()


def _family(agent_id: str) -> tuple[str, str]:
    # ids under `a` are exactly the strings between "a." and "a/" ('/' follows '.' in ASCII and is
    # never in an id): a range an index can use, where LIKE would treat '_' as a wildcard.
    return agent_id + ".", agent_id + "/"


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


def _reader(conn, agent_id: str):
    row = agent_row(conn, agent_id)
    if row is None:
        raise NotFoundError(f"agent {agent_id!r} is not registered in this session")
    return row


def _visible_select(agent_id: str, bfloor: int, dfloor: int, extra: str = "", extra_args=()) -> tuple[str, list]:
    """The caller's visible signals after the floors, as a UNION ALL each branch of which an index serves."""
    lo, hi = _family(agent_id)
    branches = [
        ("s.recipient = '*' AND s.sequence > ? AND s.sender != ? AND NOT (s.sender > ? AND s.sender < ?)",
         [bfloor, agent_id, lo, hi]),
        ("s.recipient = ? AND s.sequence > ?", [agent_id, dfloor]),
        ("s.recipient > ? AND s.recipient < ? AND s.sequence > ?", [lo, hi, dfloor]),
    ]
    sql, args = [], []
    for where, params in branches:
        sql.append(f"SELECT {_COLS} FROM signals s WHERE {where}{extra}")
        args += params + list(extra_args)
    return " UNION ALL ".join(sql), args


_UNREAD = " AND NOT EXISTS (SELECT 1 FROM signal_reads r WHERE r.signal_id = s.id AND r.agent_id = ?)"
_UNDELIVERED = " AND NOT EXISTS (SELECT 1 FROM signal_deliveries d WHERE d.signal_id = s.id AND d.agent_id = ?)"


def _with_reader_fields(conn, agent_id: str, inner: str, args: list) -> list:
    sql = (f"SELECT v.*, r.read_at, d.delivered_at, d.delivery_method FROM ({inner}) v "
           "LEFT JOIN signal_reads r ON r.signal_id = v.id AND r.agent_id = ? "
           "LEFT JOIN signal_deliveries d ON d.signal_id = v.id AND d.agent_id = ? ORDER BY v.sequence")
    return conn.execute(sql, [*args, agent_id, agent_id]).fetchall()


def query(conn, agent_id: str, *, unread_only: bool = True, include_history: bool = False,
          after: int = 0, limit: int | None = None) -> list[dict]:
    """Pure: the reader's signals oldest first. Unread: the oldest `limit`; otherwise the newest `limit`."""
    state = _reader(conn, agent_id)
    if unread_only:
        dfloor = max(state["read_upto"], after)
        bfloor = max(dfloor, 0 if include_history else state["joined_seq"])
        inner, args = _visible_select(agent_id, bfloor, dfloor, _UNREAD, [agent_id])
        order = "ASC"
    else:
        dfloor = after
        bfloor = max(after, 0 if include_history else state["joined_seq"])
        inner, args = _visible_select(agent_id, bfloor, dfloor)
        order = "DESC"
    inner += f" ORDER BY sequence {order} LIMIT ?"
    args.append(_sql_limit(limit))
    return [as_dict(r) for r in _with_reader_fields(conn, agent_id, inner, args)]


def _sql_limit(limit, extra: int = 0) -> int:
    """SQLite's LIMIT for `limit` (+`extra`): -1 (none) when unset or beyond its 64-bit integers."""
    if limit is None or int(limit) + extra >= 2 ** 63:
        return -1
    return int(limit) + extra


def unread(conn, agent_id: str, limit: int | None = None) -> list[dict]:
    """Pure: the reader's unread signals, oldest first (history broadcasts are not unread)."""
    return query(conn, agent_id, unread_only=True, limit=limit)


def latest_visible_sequence(conn, agent_id: str) -> int:
    """The newest sequence the reader can see (0 when none): "is there something new for this inbox?"."""
    lo, hi = _family(agent_id)
    best = 0
    for sql, args in (
            ("SELECT sequence FROM signals WHERE recipient = '*' AND sender != ? AND NOT (sender > ? AND sender < ?) "
             "ORDER BY sequence DESC LIMIT 1", (agent_id, lo, hi)),
            ("SELECT max(sequence) FROM signals WHERE recipient = ?", (agent_id,)),
            ("SELECT max(sequence) FROM signals WHERE recipient > ? AND recipient < ?", (lo, hi))):
        row = conn.execute(sql, args).fetchone()
        if row is not None and row[0] is not None:
            best = max(best, int(row[0]))
    return best


def _max_sequence(conn) -> int:
    return int(conn.execute("SELECT COALESCE(max(sequence), 0) FROM signals").fetchone()[0])


# -- sending ---------------------------------------------------------------------------------------

def audience_rows(conn, recipient: str, sender: str) -> list:
    """Registered agents who will see a signal; NotFoundError for a recipient nobody can be."""
    if recipient == BROADCAST:
        rows = conn.execute("SELECT * FROM agents ORDER BY id").fetchall()
        return [r for r in rows if r["id"] != sender and not is_subagent_of(sender, r["id"])]
    parts = recipient.split(".")
    candidates = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    marks = ",".join("?" * len(candidates))
    rows = conn.execute(f"SELECT * FROM agents WHERE id IN ({marks}) ORDER BY id", candidates).fetchall()
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


def take_token(conn, agent_id: str, now: datetime, config) -> None:
    """The per-agent token bucket: rate_limit_per_min, refilled continuously; RateLimitedError past it."""
    rate = float(config.rate_limit_per_min)
    per_s = rate / 60.0
    moment = now.timestamp()
    row = conn.execute("SELECT tokens, updated_at FROM rate_buckets WHERE agent_id = ?", (agent_id,)).fetchone()
    tokens = rate if row is None else min(rate, row["tokens"] + max(0.0, moment - row["updated_at"]) * per_s)
    if tokens < 1.0:
        wait = (1.0 - tokens) / per_s
        raise RateLimitedError(f"{agent_id} has sent {int(rate)} signals in the last minute "
                               f"(rate_limit_per_min): retry in {wait:.1f} s", retry_after_s=wait)
    conn.execute("INSERT INTO rate_buckets (agent_id, tokens, updated_at) VALUES (?, ?, ?) "
                 "ON CONFLICT(agent_id) DO UPDATE SET tokens = excluded.tokens, updated_at = excluded.updated_at",
                 (agent_id, tokens - 1.0, moment))


def check_content(content, config) -> str:
    if not isinstance(content, str):
        raise UsageError("signal content must be text")
    if content == "":
        raise UsageError("signal content is empty")
    size = len(check_text(content, "signal content").encode("utf-8"))
    if size > int(config.max_content_bytes):
        raise UsageError(f"signal content is {size} bytes, more than max_content_bytes={config.max_content_bytes}")
    return content


def find_signal(conn, ref: str, agent_id: str | None = None):
    """The one signal a full id or a unique prefix (8+ hex) names; visible to `agent_id` when given."""
    text = ref.strip().lower() if isinstance(ref, str) else ""
    if len(text) < MIN_PREFIX or len(text) > 64 or not _HEX_RE.match(text):
        raise UsageError(f"signal id {ref!r} must be a full id or a prefix of at least {MIN_PREFIX} hex characters")
    if len(text) == 64:
        rows = conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.id = ?", (text,)).fetchall()
    else:
        rows = conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.id >= ? AND s.id < ? LIMIT 100",
                            (text, text + "g")).fetchall()
    if agent_id is not None:
        rows = [r for r in rows if is_visible(r, agent_id)]
    if not rows:
        raise NotFoundError(f"no signal {ref!r}" + (f" visible to {agent_id}" if agent_id else ""))
    if len(rows) > 1:
        raise UsageError(f"signal id prefix {ref!r} is ambiguous ({len(rows)} signals): give more characters")
    return rows[0]


def send(conn, *, caller: str | None, recipient: str, content: str, now: datetime, config,
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
    rows = audience_rows(conn, recipient, sender)
    if rate_limited and caller is not None:
        take_token(conn, caller, now, config)
    if caller is not None:
        clock = int(_reader(conn, caller)["lamport"])
    else:
        clock = int(conn.execute("SELECT COALESCE(max(lamport), 0) FROM signals").fetchone()[0])
    reply_id = None
    if reply_to:
        replied = find_signal(conn, reply_to)
        reply_id = replied["id"]
        clock = max(clock, int(replied["lamport"]))
    lamport = clock + 1
    moment = now
    while True:
        stamp = ts(moment)
        sid = signal_id(sender, recipient, type_, content, stamp)
        if conn.execute("SELECT 1 FROM signals WHERE id = ?", (sid,)).fetchone() is None:
            break
        moment = moment + timedelta(microseconds=1)  # the same message twice in one microsecond
    cursor = conn.execute(
        "INSERT INTO signals (id, timestamp, sender, recipient, type, content, lamport, reply_to) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (sid, stamp, sender, recipient, type_, content, lamport, reply_id))
    if caller is not None:
        conn.execute("UPDATE agents SET lamport = ? WHERE id = ? AND lamport < ?", (lamport, caller, lamport))
    signal = {"id": sid, "sequence": cursor.lastrowid, "timestamp": stamp, "sender": sender,
              "recipient": recipient, "type": type_, "content": content, "lamport": lamport, "reply_to": reply_id}
    return signal, audience(rows, now, config)


# -- delivery and acks -----------------------------------------------------------------------------

def _raise_clock(conn, agent_id: str, lamports) -> None:
    top = max(lamports, default=0)
    if top:
        conn.execute("UPDATE agents SET lamport = ? WHERE id = ? AND lamport < ?", (top, agent_id, top))


def drain(conn, agent_id: str, method: str, now: datetime, config, limit: int | None = None,
          budget_chars: int | None = None, fits=None) -> list[dict]:
    """Inside a write transaction: the reader's undelivered unread signals, marked delivered with `method`.

    For `hook`, also signals a hook delivered that are still unacked after redeliver_after_s, up to
    three offers in all. `limit`, `budget_chars` (a sum of content lengths) and `fits(chosen, next)`
    (False: the next one would not fit what the caller can show) cut the oldest-first list, and only
    what is returned is marked.
    """
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    state = agent_row(conn, agent_id)
    if state is None:
        return []
    floor = state["delivered_upto"]
    inner, args = _visible_select(agent_id, max(floor, state["joined_seq"]), floor, _UNREAD + _UNDELIVERED,
                                  [agent_id, agent_id])
    inner += " ORDER BY sequence LIMIT ?"
    args.append(_sql_limit(limit, 1))
    fresh = [dict(as_dict(r), offers=0) for r in conn.execute(inner, args).fetchall()]
    again = []
    if method == "hook":
        cutoff = ts(now - timedelta(seconds=float(config.redeliver_after_s)))
        again = [dict(as_dict(r), offers=r["offers"]) for r in conn.execute(
            f"SELECT {_COLS}, d.offers FROM signal_deliveries d JOIN signals s ON s.id = d.signal_id "
            "WHERE d.agent_id = ? AND d.delivery_method = 'hook' AND d.offers < ? AND d.last_offered_at <= ?"
            + _UNREAD + " ORDER BY s.sequence", (agent_id, MAX_HOOK_OFFERS, cutoff, agent_id)).fetchall()]
    candidates = sorted(fresh + again, key=lambda s: s["sequence"])
    chosen, used, complete = [], 0, True
    for item in candidates:
        cost = len(item["content"]) + 200
        if (limit is not None and len(chosen) >= limit) or (budget_chars is not None and used + cost > budget_chars) \
                or (fits is not None and not fits(chosen, item)):
            complete = False
            break
        chosen.append(item)
        used += cost
    if not chosen:
        return []
    stamp = ts(now)
    new_rows = [(s["id"], agent_id, stamp, method, stamp) for s in chosen if s["offers"] == 0]
    if new_rows:
        conn.executemany("INSERT INTO signal_deliveries (signal_id, agent_id, delivered_at, delivery_method, "
                         "offers, last_offered_at) VALUES (?, ?, ?, ?, 1, ?)", new_rows)
    redo = [(stamp, s["id"], agent_id) for s in chosen if s["offers"] > 0]
    if redo:
        conn.executemany("UPDATE signal_deliveries SET offers = offers + 1, last_offered_at = ? "
                         "WHERE signal_id = ? AND agent_id = ?", redo)
    # everything visible up to the watermark is now delivered, read or history
    firsts = [s["sequence"] for s in chosen if s["offers"] == 0]
    if complete:
        mark = _max_sequence(conn)
    else:
        left = [s["sequence"] for s in candidates[len(chosen):] if s["offers"] == 0]
        mark = (min(left) - 1) if left else max(firsts, default=floor)
    if mark > floor:
        conn.execute("UPDATE agents SET delivered_upto = ? WHERE id = ? AND delivered_upto < ?", (mark, agent_id, mark))
    _raise_clock(conn, agent_id, [s["lamport"] for s in chosen])
    out = []
    for s in chosen:
        offers = s.pop("offers") + 1
        s.update(read=False, read_at=None, delivered_at=stamp, delivery_method=method)
        if method == "hook":
            s["offer"] = offers
        out.append(s)
    return out


def has_undelivered(conn, agent_id: str) -> bool:
    """Pure: whether `drain` would find a first delivery for the reader now (hook redelivery aside).

    The same selection as `drain`, one row at most, in a read transaction: a long-lived caller whose
    refresh was coalesced needs no write transaction when this says no (nothing is marked either way).
    """
    state = agent_row(conn, agent_id)
    if state is None:
        return False
    floor = state["delivered_upto"]
    inner, args = _visible_select(agent_id, max(floor, state["joined_seq"]), floor, _UNREAD + _UNDELIVERED,
                                  [agent_id, agent_id])
    return conn.execute(f"SELECT 1 FROM ({inner}) LIMIT 1", args).fetchone() is not None


def _advance_read_upto(conn, agent_id: str) -> None:
    state = _reader(conn, agent_id)
    floor = state["read_upto"]
    inner, args = _visible_select(agent_id, max(floor, state["joined_seq"]), floor, _UNREAD, [agent_id])
    row = conn.execute(f"SELECT min(sequence) FROM ({inner})", args).fetchone()
    mark = (int(row[0]) - 1) if row and row[0] is not None else _max_sequence(conn)
    if mark > floor:
        conn.execute("UPDATE agents SET read_upto = ?, delivered_upto = max(delivered_upto, ?) WHERE id = ?",
                     (mark, mark, agent_id))


def ack(conn, agent_id: str, refs, now: datetime, all_visible: bool = False) -> list[str]:
    """Inside a write transaction: mark signals read for the reader; returns the full ids acked."""
    _reader(conn, agent_id)
    if all_visible:
        rows = query(conn, agent_id, unread_only=True)
    else:
        if isinstance(refs, str):
            refs = refs.split(",")
        refs = [r.strip() for r in (refs or []) if r and r.strip()]
        if not refs:
            raise UsageError("name the signals to ack (comma-separated ids or prefixes), or pass --all")
        rows, seen = [], set()
        for ref in refs:
            row = find_signal(conn, ref, agent_id)
            if row["id"] not in seen:
                seen.add(row["id"])
                rows.append(row)
    stamp = ts(now)
    conn.executemany("INSERT OR IGNORE INTO signal_reads (signal_id, agent_id, read_at) VALUES (?, ?, ?)",
                     [(r["id"], agent_id, stamp) for r in rows])
    _raise_clock(conn, agent_id, [r["lamport"] for r in rows])
    _advance_read_upto(conn, agent_id)
    return [r["id"] for r in rows]
