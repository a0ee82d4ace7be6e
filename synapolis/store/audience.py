"""A broadcast's audience as a store last read it: the windows it still answers for, and its answer to a sender."""

from __future__ import annotations

from bisect import bisect_left



def judged_audience(live: list, waiting: list) -> dict:
    """signals.audience's answer from a store that judged a broadcast itself (`Transaction.judges_audience`): the
    live ids, sorted, and the waiting ones as (id, registry status) pairs in id order, an active or idle agent
    outside the live window waiting as "stale"."""
    status = {agent_id: "stale" if state in ("active", "idle") else state for agent_id, state in waiting}
    return {"live": live, "waiting": list(status), "waiting_status": status}


class KeptAudience:
    """The whole registry's audience (live ids, waiting ids with their status) as read in one live window, kept so
    that a process that broadcasts again (the MCP server, the team server, a library caller) does not read every
    registration again: 1,000 ids cost more than the rest of a send (issue 31). Never changed once made: a
    thread holding one answers from it while another replaces it.

    `covers(window)` says whether the rows as they were read, unchanged, give the same audience in a later
    window; each store adds how it knows the rows are unchanged (store/local/audience.py, store/postgres/
    audience.py)."""

    __slots__ = ("window", "leaves", "enters", "live", "waiting")

    def __init__(self, window: tuple, live_ids: list, leaves: str | None, waiting_rows: list):
        """`window` (cutoff, ceiling) as status.registry_window gives it; the ids of the agents live in it (any
        order); `leaves`, the earliest live heartbeat; `waiting_rows`, (id, status, last_heartbeat) of the rest."""
        cutoff, ceiling = window
        self.window, self.leaves = window, leaves
        self.live = sorted(live_ids)
        rows = sorted(waiting_rows)
        # stamped ahead of the ceiling: live once the ceiling reaches the earliest of them
        self.enters = min((beat for _id, state, beat in rows
                           if state in ("active", "idle") and beat and beat > ceiling), default=None)
        self.waiting = [(agent_id, state) for agent_id, state, _beat in rows]

    def covers(self, window: tuple) -> bool:
        """The window moved only forward, not past the earliest live heartbeat (that agent would turn stale) nor up
        to the earliest heartbeat stamped ahead of the ceiling (that agent would turn live): within those, the
        live set of the unchanged rows is the one read."""
        (was_cutoff, was_ceiling), (cutoff, ceiling) = self.window, window
        return (was_cutoff <= cutoff and was_ceiling <= ceiling and (self.leaves is None or cutoff <= self.leaves)
                and (self.enters is None or ceiling < self.enters))

    def answer(self, chain: list) -> dict:
        """signals.audience's answer for a broadcast from `chain` (its sender and the agents it is a sub-agent of,
        names.id_chain: never in it)."""
        live = self.live[:]
        # the sender's chain (a few ids) out of the sorted list by their places, found by bisection, not by a
        # pass over it nor a map of it (built for every read, and a one-shot process reads once)
        for agent_id in chain:
            at = bisect_left(live, agent_id)
            if at < len(live) and live[at] == agent_id:
                del live[at]
        return judged_audience(live, [pair for pair in self.waiting if pair[0] not in chain])
