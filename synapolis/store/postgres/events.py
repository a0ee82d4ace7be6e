"""The guard's event record in the shared PostgreSQL database: table guard_events, newest kept, a NOTIFY per event."""

from __future__ import annotations

import json

from .driver import NOTIFY_CHANNEL

# schema version 11 (schema.SCHEMA runs it; idempotent). `record` is the event's JSON, `at` its time: the
# newest KEEP rows per database are kept (one database is one swarm's store)
EVENTS_SCHEMA = """
-- version 11: guard denials, refused commits and refused deadlocks, for the dashboard (store/postgres/events.py)
CREATE TABLE IF NOT EXISTS guard_events
(
    seq    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     TEXT COLLATE "C" NOT NULL,
    type   TEXT COLLATE "C" NOT NULL,
    record TEXT NOT NULL
);
"""
# the dashboards' wake-up (their LISTEN); not a session id, so no MCP subscription is checked for it
CHANGE_PAYLOAD = "@guard-events"


def record(store, event: dict, keep: int) -> None:
    """Insert `event` and drop all but the newest `keep`, in one transaction; the dashboards are woken."""
    with store.transaction() as cur:
        cur.execute("INSERT INTO guard_events (at, type, record) VALUES (%s, %s, %s)",
                    (event.get("at") or "", event.get("type") or "", json.dumps(event, ensure_ascii=False)))
        cur.execute("DELETE FROM guard_events WHERE seq <= (SELECT seq FROM guard_events ORDER BY seq DESC "
                    "OFFSET %s LIMIT 1)", (keep,))
        cur.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, CHANGE_PAYLOAD))


def recent(store, limit: int) -> list[dict]:
    """The newest `limit` events, newest first."""
    if limit <= 0:
        return []
    with store.transaction() as cur:
        cur.execute("SELECT record FROM guard_events ORDER BY seq DESC LIMIT %s", (int(limit),))
        rows = cur.fetchall()
    found = []
    for row in rows:
        try:
            value = json.loads(row["record"])
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found
