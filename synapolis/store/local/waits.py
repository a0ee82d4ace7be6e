"""The local store's wait book: `claim-waits.json`, read and replaced under `.locks/claim-waits.lock` (§14)."""

from __future__ import annotations

import os

from ...atomic import atomic_write_json, locked, read_json
from .claims import file_records

BOOK_FILE = "claim-waits.json"
BOOK_VERSION = 1


class FileWaitBook:
    """`claim-waits.json` in the state directory, read and replaced under `.locks/claim-waits.lock`."""

    def __init__(self, ws):
        self.ws = ws
        self.path = os.path.join(ws.files.root, BOOK_FILE)
        self.lock = None
        self._waits: list[dict] | None = None
        self.changed = False

    def __enter__(self) -> "FileWaitBook":
        self.ws.ensure()
        self.lock = locked(self.ws.files.lock("claim-waits"), timeout=self.ws.config.busy_timeout_ms / 1000.0)
        self.lock.__enter__()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is None and self.changed:
                atomic_write_json(self.path, {"schema_version": BOOK_VERSION, "waits": self._waits}, durable=False)
        finally:
            self.lock.__exit__(kind, value, traceback)

    def waits(self) -> list[dict]:
        if self._waits is None:
            self._waits = read_file_waits(self.path)
        return self._waits

    def put(self, record: dict, swept=()) -> None:
        gone = set(swept) | {(record["agent_id"], record["item"])}
        self._waits = [w for w in self.waits() if (w.get("agent_id"), w.get("item")) not in gone] + [record]
        self.changed = True

    def remove(self, agent_id: str, item: str) -> None:
        before = self.waits()
        self._waits = [w for w in before if (w.get("agent_id"), w.get("item")) != (agent_id, item)]
        self.changed = self.changed or len(self._waits) != len(before)

    def claim_records(self, items) -> dict:
        return file_records(self.ws, items)


def read_file_waits(path: str) -> list[dict]:
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return []
    waits = doc.get("waits") if isinstance(doc, dict) else None
    return [w for w in waits if isinstance(w, dict) and isinstance(w.get("agent_id"), str)
            and isinstance(w.get("item"), str)] if isinstance(waits, list) else []
