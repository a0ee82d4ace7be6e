"""The PostgreSQL store's claims: one item's slot under its advisory lock, the path index and the waiters."""

from __future__ import annotations

import contextlib
import json

from ..claim_keys import index_prefix, is_path_item
from ..claim_keys import is_claim_record as _is_record
from .driver import _dump


class ClaimSlot:
    """One item's claim inside a transaction holding the item's advisory lock (store/local/claims.py's FileSlot
    on SQLite)."""

    def __init__(self, cur, item: str, row):
        self.cur, self.item = cur, item
        self.existed = row is not None
        self.record = None
        self._token = 0
        if row is not None:
            with contextlib.suppress(ValueError):
                doc = json.loads(row["record"])
                self.record = doc if _is_record(doc, item) else None

    def high_water(self) -> int:
        self.cur.execute("SELECT GREATEST((SELECT token FROM claims WHERE item = %s), "
                         "(SELECT max((event::json->>'token')::bigint) FROM claim_events WHERE item = %s)) AS top",
                         (self.item, self.item))
        row = self.cur.fetchone()
        return int(row["top"] or 0)

    def settle(self) -> None:
        """Nothing to repair: the claim row and its event commit in one transaction."""

    def path_claim_candidates(self, prefixes, under=None) -> list[str]:
        return _path_claim_candidates(self.cur, prefixes, under)

    def claim_records(self, items) -> dict:
        return _claim_records(self.cur, items)

    def write(self, record: dict, event: dict) -> None:
        if is_path_item(self.item):
            if record.get("released_at"):
                self.cur.execute("DELETE FROM claim_paths WHERE item = %s", (self.item,))
            else:
                self.cur.execute("INSERT INTO claim_paths (item, prefix) VALUES (%s, %s) ON CONFLICT (item) "
                                 "DO UPDATE SET prefix = excluded.prefix", (self.item, index_prefix(self.item)))
        dump = _dump(record)
        self.cur.execute("INSERT INTO claims (item, token, claimed_by, expires_at, released_at, record) "
                         "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (item) DO UPDATE SET token = excluded.token, "
                         "claimed_by = excluded.claimed_by, expires_at = excluded.expires_at, "
                         "released_at = excluded.released_at, record = excluded.record",
                         (record["item"], record["token"], record["claimed_by"], record["expires_at"],
                          record.get("released_at"), dump))
        self.cur.execute("INSERT INTO claim_events (item, at, event) VALUES (%s, %s, %s)",
                         (record["item"], event["at"], _dump(event)))


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for the prefixes under `prefix` (its own wildcards escaped)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "/%" if prefix else "_%"


def _path_claim_candidates(cur, prefixes, under) -> list[str]:
    if under is None:
        cur.execute("SELECT item FROM claim_paths WHERE prefix = ANY(%s)", (list(prefixes),))
    else:
        cur.execute("SELECT item FROM claim_paths WHERE prefix = ANY(%s) OR prefix LIKE %s",
                    (list(prefixes), _like_prefix(under)))
    return [row["item"] for row in cur.fetchall()]


def _claim_records(cur, items) -> dict:
    cur.execute("SELECT item, record FROM claims WHERE item = ANY(%s)", (list(items),))
    out = {}
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            doc = json.loads(row["record"])
            if _is_record(doc, row["item"]):
                out[row["item"]] = doc
    return out


def _waits(cur) -> list[dict]:
    cur.execute("SELECT agent_id, item, since, seen_at, until, blocked_by FROM claim_waits ORDER BY since")
    out = []
    for row in cur.fetchall():
        with contextlib.suppress(ValueError):
            extra = json.loads(row["blocked_by"])
            out.append({"agent_id": row["agent_id"], "item": row["item"], "since": row["since"],
                        "seen_at": row["seen_at"], "until": row["until"], "blocked_by": extra.get("blocked_by", []),
                        "blocking": extra.get("blocking", [])})
    return out


class WaitBook:
    """The claim_waits rows inside a transaction holding the waiters' advisory lock (store/local/waits.py's
    FileWaitBook on SQLite)."""

    def __init__(self, cur):
        self.cur = cur

    def waits(self) -> list[dict]:
        return _waits(self.cur)

    def put(self, record: dict, swept=()) -> None:
        for agent_id, item in swept:
            self.remove(agent_id, item)
        extra = json.dumps({"blocked_by": record["blocked_by"], "blocking": record["blocking"]}, ensure_ascii=False)
        self.cur.execute("INSERT INTO claim_waits (agent_id, item, since, seen_at, until, blocked_by) "
                         "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (agent_id, item) DO UPDATE SET "
                         "seen_at = excluded.seen_at, until = excluded.until, blocked_by = excluded.blocked_by",
                         (record["agent_id"], record["item"], record["since"], record["seen_at"], record["until"],
                          extra))

    def remove(self, agent_id: str, item: str) -> None:
        self.cur.execute("DELETE FROM claim_waits WHERE agent_id = %s AND item = %s", (agent_id, item))

    def claim_records(self, items) -> dict:
        return _claim_records(self.cur, items)
