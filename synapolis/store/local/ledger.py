"""The local store's memory ledger: `memory/ledger.jsonl`, read incrementally and appended under its lock."""

from __future__ import annotations

import os

from ...atomic import append_jsonl, locked, open_regular, parse_jsonl_line, read_jsonl
from ...names import validate_agent_id
from ..ledger import LedgerHoldings


class LedgerReader:
    """The holdings of `memory/ledger.jsonl`, read incrementally.

    `catch_up()` parses only the complete lines appended since the last call, so the expensive full
    read can happen before the consensus transaction and only the tail inside it: the write lock is
    never held for a time that grows with the ledger. A replaced or truncated file is read afresh.
    """

    def __init__(self, path):
        self.path = path
        self.holdings = LedgerHoldings()
        self.offset = 0
        self.file_id = None

    def catch_up(self) -> LedgerHoldings:
        try:
            # never a FIFO or a device where the ledger belongs: open_regular refuses them (a FIFO would
            # hang the merge, /dev/zero exhaust memory), and the merge then fails before clearing anything
            handle = open(open_regular(self.path), "rb")
        except FileNotFoundError:
            self.__init__(self.path)
            return self.holdings
        with handle:
            stat = os.fstat(handle.fileno())
            if (stat.st_dev, stat.st_ino) != self.file_id or stat.st_size < self.offset:
                self.__init__(self.path)
                self.file_id = (stat.st_dev, stat.st_ino)
            handle.seek(self.offset)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1  # a torn last line (a writer killed mid-line) waits for its newline
        for raw in chunk[:end].split(b"\n"):
            line = parse_jsonl_line(raw)
            if line is not None:
                self.holdings.add(line)
        self.offset += end
        return self.holdings


def append_to_ledger(paths, merged: list[dict], *, session_id: str, merged_by: str,
                     reader: LedgerReader | None = None) -> tuple[list[dict], list[dict]]:
    """Append what the ledger does not hold yet; returns (written, skipped).

    Catching up and appending happen under one lock, so two sessions consolidating at once cannot
    both write one memory. Skipping what is held is what makes a retry after a crash safe: a
    consolidation that appended and then died before its database commit runs again, finds its
    lines held and appends nothing. `reader` may come pre-read (see LedgerReader).
    """
    validate_agent_id(merged_by)
    stamped = [{**line, "session_id": session_id, "merged_by": merged_by} for line in merged]
    reader = reader or LedgerReader(paths.memory_ledger)
    with locked(paths.lock("memory-ledger")):
        fresh, held = reader.catch_up().split(stamped)
        if fresh:
            # every line whole, fsynced and read back, or none and an error: the caller clears the
            # staged memories only after this returns
            append_jsonl(paths.memory_ledger, *fresh, verify=True)
    return fresh, held


def read_ledger(paths) -> list[dict]:
    """Every complete line of the ledger (a torn last line from a crash is skipped)."""
    return read_jsonl(paths.memory_ledger)
