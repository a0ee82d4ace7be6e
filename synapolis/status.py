"""Effective status: the pure decision of what one heartbeat means at time `now` (contract §6)."""

from __future__ import annotations

import os
from datetime import datetime

from .timeutil import format_ts, parse_ts

EFFECTIVE_STATUSES = ("active", "idle", "sleeping", "stopped", "stale", "dead", "invalid")
HEALTHY = frozenset({"active", "idle", "sleeping", "stopped"})
FAILING = frozenset({"stale", "dead", "invalid"})
# a claim held by an agent in one of these may be taken over (contract §9)
CLAIMABLE_FROM = frozenset({"stale", "dead", "stopped", "invalid", "missing"})


class Verdict:
    """What one heartbeat means at `now`: effective status, age, when its seq was first seen, anomalies."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("effective_status", "age_s", "seq_first_seen_at", "anomalies")

    def __init__(self, effective_status: str, age_s: float | None = None, seq_first_seen_at: str | None = None,
                 anomalies: list | None = None):
        self.effective_status, self.age_s, self.seq_first_seen_at = effective_status, age_s, seq_first_seen_at
        self.anomalies = [] if anomalies is None else anomalies

    def __repr__(self) -> str:
        return f"Verdict({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


def effective_status(doc: dict | None, now: datetime, *, stale_after_s: float, dead_after_s: float,
                     clock_skew_s: float, previous: dict | None = None) -> Verdict:
    """What a (schema-valid) heartbeat `doc` means at `now`; `doc=None` means invalid.

    `previous` is this agent's entry in the previous monitor document: when `beat_at` lies more
    than `clock_skew_s` in the future the writer's clock is not trusted, and age runs from when
    the monitor first saw the current `seq`.
    """
    if doc is None:
        return Verdict("invalid")
    seq = doc.get("seq")
    beat_at = parse_ts(doc["beat_at"])
    first_seen = None
    if previous and previous.get("seq") == seq and previous.get("seq_first_seen_at"):
        try:
            first_seen = parse_ts(previous["seq_first_seen_at"])
        except ValueError:
            first_seen = None
    if first_seen is None or first_seen > now:
        first_seen = now
    anomalies = []
    skew = (beat_at - now).total_seconds()
    if skew > clock_skew_s:
        anomalies.append("clock_skew")
        age = (now - first_seen).total_seconds()
    else:
        age = (now - beat_at).total_seconds()
    verdict = Verdict("invalid", round(age, 3), format_ts(first_seen), anomalies)
    declared = doc.get("status")
    if declared in ("stopped", "sleeping"):
        verdict.effective_status = declared
        return verdict
    ttl = doc.get("ttl_s") or stale_after_s
    if age <= ttl:
        verdict.effective_status = declared
    elif age <= max(dead_after_s, 2 * ttl):
        verdict.effective_status = "stale"
    else:
        verdict.effective_status = "dead"
    return verdict


def status_of_doc(doc: dict, now: datetime, config) -> str:
    """The effective status of a heartbeat document that is not a local file (a shared store's copy)."""
    from .heartbeat import quick_check, schema_errors

    doc = {k: v for k, v in doc.items() if k != "received_at"}
    if not quick_check(doc) and schema_errors(doc):
        return "invalid"
    return effective_status(doc, now, **config.thresholds).effective_status


def status_of_agent(paths, agent_id: str, now: datetime, config, previous: dict | None = None) -> str:
    """The effective status of one agent from its heartbeat file at `now`; 'missing' when it has none."""
    from .heartbeat import read_heartbeat

    path = paths.files.heartbeat(agent_id)
    if not os.path.exists(path):
        return "missing"
    read = read_heartbeat(path)
    if not read.valid:
        return "invalid"
    return effective_status(read.doc, now, previous=previous, **config.thresholds).effective_status


def status_of_agent_anywhere(ws, agent_id: str, now: datetime, copies: dict | None = None) -> str:
    """`status_of_agent` from the local file; with a shared store, an agent with no file here (one on
    another machine) is judged by its heartbeat copy in the store (contract §12). `copies`: a dict to
    fill with every copy at the first need and reuse (a caller asking about many agents)."""
    found = status_of_agent(ws.paths, agent_id, now, ws.config)
    if found != "missing":
        return found
    from .store import store_for

    store = store_for(ws)
    if store.kind == "sqlite":
        return found
    if copies is None:
        copy = store.heartbeat_copy(agent_id)
    else:
        if not copies:
            copies.update((c.get("agent_id"), c) for c in store.heartbeat_copies())
            copies.setdefault(None, None)  # filled: an empty store is not asked again
        copy = copies.get(agent_id)
    return status_of_doc(copy, now, ws.config) if copy is not None else found
