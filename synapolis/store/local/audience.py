"""A broadcast's audience on the SQLite store: read from the agents_by_liveness index, kept between broadcasts."""

from __future__ import annotations

from ..base import judged_audience

# A broadcast's audience (signals.audience's answer) from agents_by_liveness: the live ids as one string built
# inside SQLite from the index ranges of the live statuses within the window (no row object per recipient; one
# sort of the ids), then the waiting ones, usually few, from the ranges around them. The statuses are the
# agents table's CHECK: 'active' and 'idle' live within the window, 'sleeping' and 'stale' never.
_LIVE_IDS = ("SELECT group_concat(id, char(10)), min(last_heartbeat) FROM agents INDEXED BY agents_by_liveness "
             "WHERE status IN ('active', 'idle') AND last_heartbeat >= ? AND last_heartbeat <= ?")
_WAITING_ROWS = " UNION ALL ".join(
    f"SELECT id, status, last_heartbeat FROM agents INDEXED BY agents_by_liveness WHERE {where}"
    for where in ("status IN ('sleeping', 'stale')", "status IN ('active', 'idle') AND last_heartbeat < ?",
                  "status IN ('active', 'idle') AND last_heartbeat > ?",
                  "status IN ('active', 'idle') AND last_heartbeat IS NULL"))


class AudienceCache:
    """The whole registry's audience (live and waiting ids) as one session store's connection last read it, so
    that a process that broadcasts again (the MCP server, the team server, a library caller) does not read every
    registration again: 1,000 ids cost more than the rest of a send (issue 31).

    It answers only while nothing it was read from can have changed:
    - no other connection committed since (SQLite's `PRAGMA data_version`, which moves with every commit by
      anyone else, other processes included) and this connection changed no row since, other than the sends
      that used it (`total_changes`, recorded after each such send); a rollback forgets it (SessionStore);
    - the window moved only forward, not past the earliest live heartbeat (that agent would turn stale) nor up
      to the earliest heartbeat stamped ahead of the ceiling (that agent would turn live).
    Within those, the live set of any later window is the one read: the answer is exactly a fresh read's."""

    __slots__ = ("version", "changes", "window", "leaves", "enters", "live", "live_at", "waiting")

    def __init__(self):
        self.forget()

    def forget(self) -> None:
        self.version = None  # nothing kept

    def audience(self, cursor, chain: list, window: tuple) -> dict:
        """{live, waiting, waiting_status} of a broadcast from `chain` (its sender and the agents it is a sub-agent
        of: never in it) in `window` (cutoff, ceiling) as status.registry_window gives them; from what is kept
        when it still holds, else read again (and kept)."""
        version = cursor.execute("PRAGMA data_version").fetchone()[0]
        changes = cursor.connection.total_changes
        cutoff, ceiling = window
        if not (version == self.version and changes == self.changes and self.window[0] <= cutoff
                and self.window[1] <= ceiling and (self.leaves is None or cutoff <= self.leaves)
                and (self.enters is None or ceiling < self.enters)):
            self._read(cursor, window)
            self.version, self.changes = version, changes
        live = self.live[:]
        # the sender's chain (a few ids) out of the list by their places, not by a pass over it: the last first
        for at in sorted((self.live_at[a] for a in chain if a in self.live_at), reverse=True):
            del live[at]
        return judged_audience(live, [pair for pair in self.waiting if pair[0] not in chain])

    def sent(self, before: int, after: int) -> None:
        """A send wrote its rows (the signal, the caller's clock and token: none moves the audience), taking the
        connection's `total_changes` from `before` to `after`: what is kept still holds if it held before."""
        if self.version is not None and self.changes == before:
            self.changes = after

    def _read(self, cursor, window: tuple) -> None:
        cutoff, ceiling = window
        text, leaves = cursor.execute(_LIVE_IDS, (cutoff, ceiling)).fetchone()
        self.live = sorted(text.split("\n")) if text else []
        self.live_at = {agent_id: at for at, agent_id in enumerate(self.live)}
        rows = sorted(cursor.execute(_WAITING_ROWS, (cutoff, ceiling)).fetchall())
        # stamped ahead: live once the ceiling reaches the earliest of them
        enters = min((beat for _id, state, beat in rows if state in ("active", "idle") and beat and beat > ceiling),
                     default=None)
        self.window, self.leaves, self.enters = window, leaves, enters
        self.waiting = [(agent_id, state) for agent_id, state, _beat in rows]

