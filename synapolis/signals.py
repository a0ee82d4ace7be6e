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


MAX_FAMILY_SEEKS = 64  # sub-agent recipients served by one index seek each; more: one range scan


def _family_recipients(conn, agent_id: str) -> list[str] | None:
    """The distinct sub-agent recipients (`a.x`, `a.x.y`) signals were sent to, each found by one seek
    of the recipient index; None when there are more than MAX_FAMILY_SEEKS (the caller scans the range)."""
    lo, hi = _family(agent_id)
    found, last = [], lo
    while len(found) <= MAX_FAMILY_SEEKS:
        row = conn.execute("SELECT recipient FROM signals WHERE recipient > ? AND recipient < ? "
                           "ORDER BY recipient LIMIT 1", (last, hi)).fetchone()
        if row is None:
            return found
        found.append(row[0])
        last = row[0] + "\x00"  # the next recipient after this one (ids never hold NUL)
    return None


def _visible_select(conn, agent_id: str, bfloor: int, dfloor: int, extra: str = "",
                    extra_args=()) -> tuple[str, list]:
    """The caller's visible signals after the floors, as a UNION ALL each branch of which an index serves.

    Each branch is an equality on the recipient and a range on the sequence of `signals_by_recipient`,
    so it comes out ordered by sequence and `ORDER BY sequence LIMIT n` stops after n rows: a page costs
    the same whatever the session holds. Sub-agents get one branch each (found by index seeks); a range
    on the recipient could not keep that order, and SQLite would rather walk the whole table by rowid.
    """
    lo, hi = _family(agent_id)
    branches = [
        ("s.recipient = '*' AND s.sequence > ? AND s.sender != ? AND NOT (s.sender > ? AND s.sender < ?)",
         [bfloor, agent_id, lo, hi]),
        ("s.recipient = ? AND s.sequence > ?", [agent_id, dfloor]),
    ]
    family = _family_recipients(conn, agent_id)
    if family is None:
        branches.append(("s.recipient > ? AND s.recipient < ? AND s.sequence > ?", [lo, hi, dfloor]))
    else:
        branches += [("s.recipient = ? AND s.sequence > ?", [who, dfloor]) for who in family]
    sql, args = [], []
    for where, params in branches:
        source = "signals s INDEXED BY signals_by_recipient" if where.startswith("s.recipient >") else "signals s"
        sql.append(f"SELECT {_COLS} FROM {source} WHERE {where}{extra}")
        args += params + list(extra_args)
    return " UNION ALL ".join(sql), args


_UNREAD = " AND NOT EXISTS (SELECT 1 FROM signal_reads r WHERE r.signal_id = s.id AND r.agent_id = ?)"
_UNDELIVERED = " AND NOT EXISTS (SELECT 1 FROM signal_deliveries d WHERE d.signal_id = s.id AND d.agent_id = ?)"


def _with_reader_fields(conn, agent_id: str, inner: str, args: list) -> list:
    sql = (f"SELECT v.*, r.read_at, d.delivered_at, d.delivery_method FROM ({inner}) v "
           "LEFT JOIN signal_reads r ON r.signal_id = v.id AND r.agent_id = ? "
           "LEFT JOIN signal_deliveries d ON d.signal_id = v.id AND d.agent_id = ? ORDER BY v.sequence")
    return conn.execute(sql, [*args, agent_id, agent_id]).fetchall()


def _reader_select(conn, state, agent_id: str, unread_only: bool, include_history: bool, after: int,
                   extra: str = "", extra_args=()) -> tuple[str, list]:
    """The reader's signals above `after` (unread only, or everything it can see) as one UNION ALL."""
    if unread_only:
        dfloor = max(state["read_upto"], after)
        return _visible_select(conn, agent_id, max(dfloor, 0 if include_history else state["joined_seq"]), dfloor,
                               _UNREAD + extra, [agent_id, *extra_args])
    return _visible_select(conn, agent_id, max(after, 0 if include_history else state["joined_seq"]), after,
                           extra, extra_args)


def query(conn, agent_id: str, *, unread_only: bool = True, include_history: bool = False,
          after: int | None = None, limit: int | None = None) -> list[dict]:
    """Pure: the reader's signals oldest first, unbounded unless `limit` is given (`page` is the bounded
    read). The oldest `limit` above `after`; everything (not unread_only) without `after`: the newest."""
    state = _reader(conn, agent_id)
    inner, args = _reader_select(conn, state, agent_id, unread_only, include_history, after or 0)
    order = "DESC" if not unread_only and after is None else "ASC"
    inner += f" ORDER BY sequence {order} LIMIT ?"
    args.append(_sql_limit(limit))
    return [as_dict(r) for r in _with_reader_fields(conn, agent_id, inner, args)]


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


def json_cost(signal: dict) -> int:
    """About how many characters `signal` takes in a JSON answer: its content escaped, plus the rest."""
    import json

    return len(json.dumps(signal["content"])) + len(signal["sender"]) + len(signal["recipient"]) + 360


def fit(signals: list, limit: int | None, budget_chars: int | None, at_least_one: bool = True) -> int:
    """How many leading `signals` make a page within `limit` and `budget_chars`. With `at_least_one`
    the first is always in (one signal over the budget must not stall paging); a hook's hard cap is not."""
    used = 0
    for count, item in enumerate(signals):
        if limit is not None and count >= limit:
            return count
        used += json_cost(item)
        if budget_chars is not None and used > budget_chars and not (at_least_one and count == 0):
            return count
    return len(signals)


def _count(conn, inner: str, args: list) -> int:
    return int(conn.execute(f"SELECT count(*) FROM ({inner} LIMIT ?)", [*args, COUNT_CAP]).fetchone()[0])


def page(conn, agent_id: str, *, unread_only: bool = True, after: int | None = None, limit: int | None = None,
         budget_chars: int | None = None) -> dict:
    """Pure: one page of the reader's signals, oldest first: `signals`, `remaining` (not in the page, in
    paging order, counted up to COUNT_CAP) and `next_after` (the `after` of the next page; None at the end).

    Unread: the oldest unread above `after`. Everything (not unread_only, history included): with `after`,
    the oldest above it; without, the newest page, and `remaining` counts the older ones (page through
    them from `after=0`).
    """
    limit = PAGE_LIMIT if limit is None else limit
    budget_chars = PAGE_BUDGET_CHARS if budget_chars is None else budget_chars
    state = _reader(conn, agent_id)
    newest = not unread_only and after is None
    floor = after or 0
    inner, args = _reader_select(conn, state, agent_id, unread_only, not unread_only, floor)
    inner += f" ORDER BY sequence {'DESC' if newest else 'ASC'} LIMIT ?"
    rows = [as_dict(r) for r in conn.execute(inner, [*args, _sql_limit(limit, 1)]).fetchall()]
    chosen = rows[:fit(rows, limit, budget_chars)]  # newest: the newest that fit, newest first
    if newest:
        chosen.reverse()
    remaining = 0
    if len(chosen) < len(rows):
        if newest:
            rest, rest_args = _reader_select(conn, state, agent_id, False, True, 0, " AND s.sequence < ?",
                                             [chosen[0]["sequence"]])
        else:
            rest, rest_args = _reader_select(conn, state, agent_id, unread_only, not unread_only,
                                             chosen[-1]["sequence"])
        remaining = _count(conn, rest, rest_args)
    _add_reader_fields(conn, agent_id, chosen, unread=unread_only)
    next_after = chosen[-1]["sequence"] if remaining and not newest else None
    return {"signals": chosen, "remaining": remaining, "next_after": next_after}


def _add_reader_fields(conn, agent_id: str, signals: list, unread: bool = False) -> None:
    """`read`, `read_at`, `delivered_at`, `delivery_method` of each signal for the reader: one primary-key
    query per table per 500 signals (an unread page has no reads to look up)."""
    reads, deliveries = {}, {}
    ids = [s["id"] for s in signals]
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        if not unread:
            reads.update(conn.execute(f"SELECT signal_id, read_at FROM signal_reads WHERE agent_id = ? "
                                      f"AND signal_id IN ({marks})", [agent_id, *chunk]).fetchall())
        deliveries.update((r[0], (r[1], r[2])) for r in conn.execute(
            f"SELECT signal_id, delivered_at, delivery_method FROM signal_deliveries WHERE agent_id = ? "
            f"AND signal_id IN ({marks})", [agent_id, *chunk]).fetchall())
    for s in signals:
        read_at = reads.get(s["id"])
        delivered_at, method = deliveries.get(s["id"], (None, None))
        s.update(read=read_at is not None, read_at=read_at, delivered_at=delivered_at, delivery_method=method)


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
    family = _family_recipients(conn, agent_id)
    queries = [("SELECT sequence FROM signals WHERE recipient = '*' AND sender != ? "
                "AND NOT (sender > ? AND sender < ?) ORDER BY sequence DESC LIMIT 1", (agent_id, lo, hi))]
    queries += [("SELECT max(sequence) FROM signals WHERE recipient = ?", (who,))
                for who in [agent_id, *(family or [])]]
    if family is None:
        queries.append(("SELECT max(sequence) FROM signals INDEXED BY signals_by_recipient "
                        "WHERE recipient > ? AND recipient < ?", (lo, hi)))
    best = 0
    for sql, args in queries:
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
          budget_chars: int | None = None) -> list[dict]:
    """`drain_page` without the count of what is left."""
    return drain_page(conn, agent_id, method, now, config, limit=limit, budget_chars=budget_chars)[0]


def drain_page(conn, agent_id: str, method: str, now: datetime, config, limit: int | None = None,
               budget_chars: int | None = None) -> tuple[list[dict], int]:
    """Inside a write transaction: a page of the reader's undelivered unread signals, marked delivered with
    `method`; (the page, how many undelivered are left, counted up to COUNT_CAP).

    For `hook`, also signals a hook delivered that are still unacked after redeliver_after_s, up to
    three offers in all. `limit` and `budget_chars` (JSON characters, `fit`) cut the oldest-first list
    (defaults PAGE_LIMIT and PAGE_BUDGET_CHARS), and only what is returned is marked. A hook's budget is
    a hard cap; any other page holds at least one signal, so paging never stalls.
    """
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    state = agent_row(conn, agent_id)
    if state is None:
        return [], 0
    limit = PAGE_LIMIT if limit is None else limit
    budget_chars = PAGE_BUDGET_CHARS if budget_chars is None else budget_chars
    floor = state["delivered_upto"]
    inner, args = _visible_select(conn, agent_id, max(floor, state["joined_seq"]), floor, _UNREAD + _UNDELIVERED,
                                  [agent_id, agent_id])
    fresh = [dict(as_dict(r), offers=0) for r in conn.execute(
        inner + " ORDER BY sequence LIMIT ?", [*args, _sql_limit(limit, 1)]).fetchall()]
    again = []
    if method == "hook":
        cutoff = ts(now - timedelta(seconds=float(config.redeliver_after_s)))
        again = [dict(as_dict(r), offers=r["offers"]) for r in conn.execute(
            f"SELECT {_COLS}, d.offers FROM signal_deliveries d JOIN signals s ON s.id = d.signal_id "
            "WHERE d.agent_id = ? AND d.delivery_method = 'hook' AND d.offers < ? AND d.last_offered_at <= ?"
            + _UNREAD + " ORDER BY s.sequence LIMIT ?",
            (agent_id, MAX_HOOK_OFFERS, cutoff, agent_id, _sql_limit(limit, 1))).fetchall()]
    candidates = sorted(fresh + again, key=lambda s: s["sequence"])
    chosen = candidates[:fit(candidates, limit, budget_chars, at_least_one=method != "hook")]
    complete = len(chosen) == len(candidates) and len(fresh) <= limit
    left = [s["sequence"] for s in candidates[len(chosen):] if s["offers"] == 0]
    remaining = 0
    if not complete:
        # the page is a prefix by sequence: what is left is everything undelivered above its last signal
        above = max([floor] + [s["sequence"] for s in chosen])
        rest, rest_args = _visible_select(conn, agent_id, max(above, state["joined_seq"]), above,
                                          _UNREAD + _UNDELIVERED, [agent_id, agent_id])
        remaining = _count(conn, rest, rest_args)
    if not chosen:
        return [], remaining
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
    return out, remaining


def mark_delivered(conn, agent_id: str, signals: list, method: str, now: datetime) -> None:
    """Inside a write transaction: mark those of `signals` (a page just put into an answer to the reader)
    not yet delivered to it as delivered with `method`, and set their reader fields to say so."""
    if method not in METHODS:
        raise UsageError(f"delivery method must be one of {', '.join(METHODS)}")
    stamp = ts(now)
    fresh = [s for s in signals if not s.get("delivered_at")]
    conn.executemany("INSERT OR IGNORE INTO signal_deliveries (signal_id, agent_id, delivered_at, delivery_method, "
                     "offers, last_offered_at) VALUES (?, ?, ?, ?, 1, ?)",
                     [(s["id"], agent_id, stamp, method, stamp) for s in fresh])
    for s in fresh:
        s.update(delivered_at=stamp, delivery_method=method)
    _raise_clock(conn, agent_id, [s["lamport"] for s in signals])
    state = _reader(conn, agent_id)
    floor = state["delivered_upto"]
    inner, args = _visible_select(conn, agent_id, max(floor, state["joined_seq"]), floor, _UNREAD + _UNDELIVERED,
                                  [agent_id, agent_id])
    # ORDER BY + LIMIT merges the ordered branches and stops at once; min() would read them all
    row = conn.execute(f"{inner} ORDER BY sequence LIMIT 1", args).fetchone()
    mark = (int(row["sequence"]) - 1) if row is not None else _max_sequence(conn)
    if mark > floor:
        conn.execute("UPDATE agents SET delivered_upto = ? WHERE id = ? AND delivered_upto < ?", (mark, agent_id, mark))


def has_undelivered(conn, agent_id: str) -> bool:
    """Pure: whether `drain` would find a first delivery for the reader now (hook redelivery aside).

    The same selection as `drain`, one row at most, in a read transaction: a long-lived caller whose
    refresh was coalesced needs no write transaction when this says no (nothing is marked either way).
    """
    state = agent_row(conn, agent_id)
    if state is None:
        return False
    floor = state["delivered_upto"]
    inner, args = _visible_select(conn, agent_id, max(floor, state["joined_seq"]), floor, _UNREAD + _UNDELIVERED,
                                  [agent_id, agent_id])
    return conn.execute(f"SELECT 1 FROM ({inner}) LIMIT 1", args).fetchone() is not None


def _advance_read_upto(conn, agent_id: str) -> None:
    state = _reader(conn, agent_id)
    floor = state["read_upto"]
    inner, args = _visible_select(conn, agent_id, max(floor, state["joined_seq"]), floor, _UNREAD, [agent_id])
    # ORDER BY + LIMIT merges the ordered branches and stops at once; min() would read them all
    row = conn.execute(f"{inner} ORDER BY sequence LIMIT 1", args).fetchone()
    mark = (int(row["sequence"]) - 1) if row is not None else _max_sequence(conn)
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
