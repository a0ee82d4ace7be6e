"""The wait-for rules (contract §14): which waiters still wait, and the wait that would close a cycle. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from ..timeutil import parse_ts


def stale_wait_s(config) -> float:
    """How long a waiter's record lives without a refresh: a poll waits at most busy_timeout_ms for a lock
    and sleeps at most half a second, so twice that and some slack."""
    return max(10.0, 2 * float(config.busy_timeout_ms) / 1000.0 + 2.0)


def live_waits(waits: list[dict], now: datetime, stale_s: float) -> list[dict]:
    """The records of waiters still waiting at `now`."""
    out = []
    for w in waits:
        try:
            if parse_ts(w["until"]) < now or parse_ts(w["seen_at"]) + timedelta(seconds=stale_s) < now:
                continue
        except (KeyError, TypeError, ValueError):
            continue
        out.append(w)
    return out


def find_cycle(waits: list[dict], agent_id: str, item: str, blocking: list[dict], still_holds) -> list[dict] | None:
    """The cycle `agent_id` would close by waiting for `item` behind `blocking` ([{agent_id, item}], the
    holders and what they hold), or None. `waits`: the other live waiters' records; `still_holds(agent,
    item)`: whether that agent holds that item now (an edge whose blocker let go is no edge).

    Returned as [{agent_id, holds, waits_for}], starting with the caller: each agent holds what the one
    before it waits for, and the last one's wait comes back to the caller."""
    by_agent: dict[str, list[dict]] = {}
    for w in waits:
        if w.get("agent_id") != agent_id:
            by_agent.setdefault(w["agent_id"], []).append(w)
    # depth-first from each blocker; a path is a list of (agent, what it holds, what it waits for)
    seen: set[str] = set()

    def walk(agent: str, holds: str, path: list[tuple[str, str, str]]):
        for w in by_agent.get(agent, ()):
            for edge in w.get("blocking") or ():
                nxt, nxt_holds = edge.get("agent_id"), edge.get("item")
                if not isinstance(nxt, str) or not isinstance(nxt_holds, str) or not still_holds(nxt, nxt_holds):
                    continue
                step = path + [(agent, holds, w["item"])]
                if nxt == agent_id:
                    return step, nxt_holds
                if nxt in seen:
                    continue
                seen.add(nxt)
                found = walk(nxt, nxt_holds, step)
                if found is not None:
                    return found
        return None

    for edge in blocking:
        first, first_holds = edge.get("agent_id"), edge.get("item")
        if first == agent_id or first in seen or not still_holds(first, first_holds):
            continue
        seen.add(first)
        found = walk(first, first_holds, [])
        if found is not None:
            path, mine = found
            return [{"agent_id": agent_id, "holds": mine, "waits_for": item}] + \
                   [{"agent_id": a, "holds": h, "waits_for": w} for a, h, w in path]
    return None
