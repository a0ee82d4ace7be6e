"""A broadcast's audience on the SQLite store, read from the agents_by_liveness index alone (issue 31)."""

from __future__ import annotations

# A broadcast's audience (signals.audience's answer) from agents_by_liveness: the live ids as one string built
# inside SQLite from the index ranges of the live statuses within the window (no row object per recipient; one
# sort of the ids), then the waiting ones, usually few, from the ranges around them. The statuses are the
# agents table's CHECK: 'active' and 'idle' live within the window, 'sleeping' and 'stale' never.
_LIVE_IDS = ("SELECT group_concat(id, char(10)) FROM agents INDEXED BY agents_by_liveness "
             "WHERE status IN ('active', 'idle') AND last_heartbeat >= ? AND last_heartbeat <= ? AND id NOT IN ({})")
_WAITING_ROWS = " UNION ALL ".join(
    f"SELECT id, status FROM agents INDEXED BY agents_by_liveness WHERE {where}"
    for where in ("status IN ('sleeping', 'stale')", "status IN ('active', 'idle') AND last_heartbeat < ?",
                  "status IN ('active', 'idle') AND last_heartbeat > ?",
                  "status IN ('active', 'idle') AND last_heartbeat IS NULL"))


def broadcast_audience(cursor, chain: list, window: tuple) -> dict:
    """{live, waiting, waiting_status} of a broadcast from `chain` (its sender and the agents it is a sub-agent
    of: never in it), `window` (cutoff, ceiling) as status.registry_window gives them; ids hold no newline."""
    cutoff, ceiling = window
    text = cursor.execute(_LIVE_IDS.format(",".join("?" * len(chain))), (cutoff, ceiling, *chain)).fetchone()[0]
    live = sorted(text.split("\n")) if text else []
    waiting = sorted(row for row in cursor.execute(_WAITING_ROWS, (cutoff, ceiling)).fetchall() if row[0] not in chain)
    return {"live": live, "waiting": [agent_id for agent_id, _state in waiting],
            "waiting_status": {agent_id: "stale" if state in ("active", "idle") else state
                               for agent_id, state in waiting}}
