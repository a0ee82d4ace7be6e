"""Waiting never deadlocks (contract §14): who waits for which claim, and the wait that would close a cycle refused.

While `claim ITEM --wait S` waits, its waiter is recorded: `agent_id`, `item`, `since`, `blocked_by` (the
agents holding ITEM or an overlapping item) and `blocking` (those agents with the items they hold). The
wait-for graph runs from each waiter to its blockers. A waiter whose blockers lead, wait by wait, back to
itself would wait forever (alice holds A and waits for B; bob holds B and now waits for A), so it is
refused at once with ConflictError (exit 3) carrying `cycle`: [{agent_id, holds, waits_for}, ...], and
the other waiter keeps waiting. Recording and checking happen under one lock (the wait book), so of
two waits that close a cycle at the same moment exactly one is refused.

Records are kept honest without trusting anyone to clean up: a waiter refreshes `seen_at` on each poll,
and a record not refreshed for `stale_wait_s` (a waiter killed mid-wait) or past its deadline is
ignored and swept; an edge counts only while its blocker still holds the item it was recorded with.
"""

from __future__ import annotations

from datetime import datetime

from .errors import ConflictError
from .rules.waits import find_cycle, live_waits, stale_wait_s  # noqa: F401 - as before
from .timeutil import format_ts, parse_ts

# the SQLite store's book (store/local/waits.py), re-exported where it always was
from .store.local.waits import BOOK_FILE, BOOK_VERSION, FileWaitBook, read_file_waits  # noqa: F401


def blocking_of(error: ConflictError) -> list[dict]:
    """[{agent_id, item}] of the holder a claim's ConflictError names."""
    details = error.details
    holder = details.get("holder")
    if not isinstance(holder, str):
        return []
    return [{"agent_id": holder, "item": details.get("holder_item") or details.get("item")}]


def _describe(cycle: list[dict]) -> str:
    steps = [f"{c['agent_id']} holds {c['holds']} and waits for {c['waits_for']}" for c in cycle]
    return "; ".join(steps)


def wait_for(ws, agent_id: str, item: str, error: ConflictError, now: datetime, until: datetime) -> None:
    """Record (or refresh) that `agent_id` waits for `item`, blocked as `error` says; ConflictError with
    `cycle` when that wait would close a cycle (nothing is recorded then, and the caller stops waiting)."""
    blocking = blocking_of(error)
    if not blocking:
        return
    stale_s = stale_wait_s(ws.config)
    with ws.store.wait_book() as book:
        current = book.waits()
        live = live_waits(current, now, stale_s)
        mine = next((w for w in live if w["agent_id"] == agent_id and w["item"] == item), None)
        held: dict[tuple[str, str], bool] = {}

        def still_holds(agent: str, held_item: str) -> bool:
            key = (agent, held_item)
            if key not in held:
                record = book.claim_records([held_item]).get(held_item)
                held[key] = bool(record) and record["claimed_by"] == agent and not record.get("released_at") \
                    and parse_ts(record["expires_at"]) > now
            return held[key]

        cycle = find_cycle(live, agent_id, item, blocking, still_holds)
        if cycle is not None:
            if mine is not None:
                book.remove(agent_id, item)
            raise ConflictError(
                f"waiting for {item} would deadlock: {_describe(cycle)}; release what you hold, or retry later",
                item=item, holder=blocking[0]["agent_id"], holder_item=blocking[0]["item"], cycle=cycle)
        book.put({"agent_id": agent_id, "item": item, "since": mine["since"] if mine else format_ts(now),
                  "seen_at": format_ts(now), "until": format_ts(until),
                  "blocked_by": sorted({b["agent_id"] for b in blocking}), "blocking": blocking},
                 swept=[(w["agent_id"], w["item"]) for w in current if w not in live])


def withdraw(ws, agent_id: str, item: str) -> None:
    """The waiter stopped waiting (served, refused, out of time, interrupted)."""
    with ws.store.wait_book() as book:
        book.remove(agent_id, item)


def waiting(ws, now: datetime) -> list[dict]:
    """The waiters waiting at `now`, oldest first: each `agent_id`, `item`, `since`, `blocked_by`, `blocking`."""
    live = live_waits(ws.store.waits(), now, stale_wait_s(ws.config))
    return sorted(({k: w[k] for k in ("agent_id", "item", "since", "blocked_by", "blocking", "until") if k in w}
                   for w in live), key=lambda w: (w["since"], w["agent_id"], w["item"]))
