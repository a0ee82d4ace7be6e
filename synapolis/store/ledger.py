"""What the memory ledger holds, for skipping what it holds already: the same on both stores (contract §10)."""

from __future__ import annotations

# the ground's (sleep's merge judges memories by the same two): a ledger line's norm and its moment
from ..names import normalise_memory as normalise
from ..timeutil import created_moment as moment


class LedgerHoldings:
    """What a ledger holds, for skipping: the norms of its keyless lines and each key's current line."""

    def __init__(self, lines=()):
        self.norms: set[str] = set()
        self.current: dict[str, dict] = {}
        for line in lines:
            self.add(line)

    def add(self, line: dict) -> None:
        norm = line.get("norm")
        if not isinstance(norm, str):
            text = line.get("text")
            norm = normalise(text) if isinstance(text, str) else None
        if norm is None:
            return
        key = line.get("key")
        if isinstance(key, str):
            self.current[key] = {**line, "norm": norm}  # later lines win: the last one is the value
        else:
            self.norms.add(norm)

    def holds(self, line: dict) -> bool:
        """A keyless memory is held when a keyless line has its norm; a keyed one when the key's
        current line has the same norm or was made later (newest wins across sessions too)."""
        key = line.get("key")
        if key is None:
            return line["norm"] in self.norms
        now_held = self.current.get(key)
        return now_held is not None and (now_held["norm"] == line["norm"] or moment(now_held) > moment(line))

    def split(self, merged: list[dict]) -> tuple[list[dict], list[dict]]:
        """(to append, already held); what is to be appended counts as held from then on."""
        fresh, held = [], []
        for line in merged:
            if self.holds(line):
                held.append(line)
            else:
                fresh.append(line)
                self.add(line)
        return fresh, held


def new_ledger_lines(merged: list[dict], lines) -> tuple[list[dict], list[dict]]:
    """Split `merged` into (to append, already held) against the existing ledger `lines`; pure."""
    return LedgerHoldings(lines).split(merged)
