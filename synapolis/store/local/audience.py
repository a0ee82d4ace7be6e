"""A broadcast's audience on the SQLite store: read from the agents_by_liveness index, kept between broadcasts."""

from __future__ import annotations

from ..audience import KeptAudience

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
    """A broadcast's audience as one session store's connection last read it (store/audience.py). It answers only
    while nothing it was read from can have changed:
    - no other connection committed since (SQLite's `PRAGMA data_version`, which moves with every commit by
      anyone else, other processes included) and this connection changed no row since, other than the sends
      that used it (`total_changes`, recorded after each such send); a rollback forgets it (SessionStore);
    - the window still covers it (`KeptAudience.covers`).
    Within those, the answer is exactly a fresh read's."""

    __slots__ = ("version", "changes", "kept")

    def __init__(self):
        self.forget()

    def forget(self) -> None:
        self.version = self.kept = None  # nothing kept

    def audience(self, cursor, chain: list, window: tuple) -> dict:
        """{live, waiting, waiting_status} of a broadcast from `chain` (its sender and the agents it is a sub-agent
        of: never in it) in `window` (cutoff, ceiling) as status.registry_window gives them; from what is kept
        when it still holds, else read again (and kept)."""
        version = cursor.execute("PRAGMA data_version").fetchone()[0]
        changes = cursor.connection.total_changes
        kept = self.kept
        if not (version == self.version and changes == self.changes and kept.covers(window)):
            kept = self.kept = self._read(cursor, window)
            self.version, self.changes = version, changes
        return kept.answer(chain)

    def sent(self, before: int, after: int) -> None:
        """A send wrote its rows (the signal, the caller's clock and token: none moves the audience), taking the
        connection's `total_changes` from `before` to `after`: what is kept still holds if it held before."""
        if self.version is not None and self.changes == before:
            self.changes = after

    def _read(self, cursor, window: tuple) -> KeptAudience:
        cutoff, ceiling = window
        text, leaves = cursor.execute(_LIVE_IDS, (cutoff, ceiling)).fetchone()
        return KeptAudience(window, text.split("\n") if text else [], leaves,
                            cursor.execute(_WAITING_ROWS, (cutoff, ceiling)).fetchall())
