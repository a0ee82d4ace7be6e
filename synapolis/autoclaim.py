"""guard.auto_claim (contract §14): the files an agent edits through its harness hook, claimed for it and
let go when it stops or says `tired`.

Each claim made this way is also written down in `hooks/auto-claims/<agent_id>.jsonl` (one item a line,
appended), so that SessionEnd and `tired` release exactly those, never a claim the agent made itself.
A stale agent needs nothing from here: a stale or stopped holder's claims are free to others already
(claims' take-over rule), and the watchdog reaps a dead one's.
"""

from __future__ import annotations

import json
import os

from .names import validate_agent_id


def _record_path(ws, agent_id: str) -> str:
    return os.path.join(ws.files.hook_states, "auto-claims", f"{validate_agent_id(agent_id)}.jsonl")


def _remember(ws, agent_id: str, items: list[str]) -> None:
    path = _record_path(ws, agent_id)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    data = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")
    # O_APPEND: lines of concurrent hooks (parallel tool calls) never overwrite each other
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def remembered(ws, agent_id: str) -> list[str]:
    """The items auto-claimed for `agent_id` since its last release, each once, in order."""
    try:
        with open(_record_path(ws, agent_id), "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    items: list[str] = []
    for line in raw.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn line of a killed writer
        if isinstance(item, str) and item not in items:
            items.append(item)
    return items


def claim_edits(ws, agent_id: str, session_id: str | None, items: list[str], now=None) -> list[str]:
    """Claim (or renew) each of `items` for `agent_id` with the configured ttl; the items now held.

    A claim refused (another got there between the guard and here, a busy lock) is skipped: the
    guard already let this edit run, and auto-claiming is a convenience, never a reason to fail."""
    from . import claims
    from .errors import SynapolisError

    got = []
    for item in items:
        try:
            claims.claim(ws, item, agent_id, session_id=session_id, now=now)
        except SynapolisError:
            continue
        got.append(item)
    if got:
        known = set(remembered(ws, agent_id))
        fresh = [item for item in got if item not in known]
        if fresh:
            _remember(ws, agent_id, fresh)
    return got


def release_all(ws, agent_id: str, now=None) -> list[str]:
    """Release every claim auto-claimed for `agent_id` that it still holds; the items released.
    Best effort, item by item: one that is gone, taken over or busy does not stop the rest."""
    from . import claims
    from .errors import SynapolisError

    items = remembered(ws, agent_id)
    released = []
    for item in items:
        try:
            record = claims.release(ws, item, agent_id, now=now)
        except SynapolisError:  # not ours any more (taken over, forced), never claimed, or busy
            continue
        if record.event is not None:
            released.append(item)
    try:
        os.unlink(_record_path(ws, agent_id))
    except OSError:
        pass
    return released
