"""The PostgreSQL store's incidents: the shared tables, held by one writer, mirrored into this machine's files."""

from __future__ import annotations

import contextlib

from .driver import _dump


def _current_incidents(cur) -> dict:
    import json

    from ..local.incidents import is_incident

    cur.execute("SELECT key_name, incident FROM escalation_incidents ORDER BY key_name")
    found = {}
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            incident = json.loads(row["incident"])
            if is_incident(incident):
                found[row["key_name"]] = incident
    return found


class EscalationBook:
    """The incidents in the shared database, on a connection of its own that holds the escalation lock
    (a session-level advisory lock) for the `with` body: no transaction stays open while notifiers run."""

    def __init__(self, conn, paths):
        self.conn, self.paths = conn, paths
        self._current = None

    def current(self) -> dict:
        with self.conn.cursor() as cur:
            self._current = _current_incidents(cur)
        return dict(self._current)

    def record(self, changed: dict, records: list) -> None:
        """The changed incidents and their events in one transaction; then this machine's files."""
        from ..local.incidents import mirror

        if changed or records:
            with self.conn.transaction(), self.conn.cursor() as cur:
                if changed:
                    cur.executemany(
                        "INSERT INTO escalation_incidents (key_name, id, status, updated_at, incident) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key_name) DO UPDATE SET id = excluded.id, "
                        "status = excluded.status, updated_at = excluded.updated_at, incident = excluded.incident",
                        [(name, i["id"], i["status"], i.get("updated_at"), _dump(i)) for name, i in changed.items()])
                if records:
                    cur.executemany("INSERT INTO escalation_events (incident_id, at, event, record) "
                                    "VALUES (%s, %s, %s, %s)",
                                    [(r["incident_id"], r["at"], r["event"], _dump(r)) for r in records])
        incidents = dict(self._current if self._current is not None else {})
        incidents.update(changed)
        mirror(self.paths, incidents, records)
