"""Liveness: what one heartbeat, or one registry row, means at time `now` (contract §6), for every caller.

The monitor, claims (take-over and reaping), list-agents, status, tired's consensus, start's conflict
check and the watchdog's stale flags all judge through the functions here, so a clock that runs ahead
is handled the same way everywhere: a moment more than `clock_skew_s` in the future is not taken at its
word; age runs from when we saw it written instead (`observed_moment`), and a moment we never saw
written (a registry row) is no evidence of life at all.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from .timeutil import UTC, format_ts, micro_stamp, parse_ts

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


def is_skewed(moment: datetime, now: datetime, clock_skew_s: float) -> bool:
    """True when `moment` lies more than `clock_skew_s` ahead of `now`: its writer's clock is not trusted."""
    return (moment - now).total_seconds() > clock_skew_s


def observed_moment(moment: datetime, now: datetime, clock_skew_s: float,
                    observed: list | tuple = ()) -> datetime | None:
    """The moment to age something from, given the `moment` its writer stamped on it.

    Within `clock_skew_s` of `now` (or in the past): the stamp itself. Further ahead, the writer's clock
    is not trusted: the earliest of the `observed` moments (when we saw it written: the monitor's first
    sighting of this seq, the file's modification time), each counted only when it is not itself beyond
    the skew and never later than `now`; None when there is none, and then it is no evidence of life.
    """
    if not is_skewed(moment, now, clock_skew_s):
        return moment
    seen = [min(m, now) for m in observed if m is not None and not is_skewed(m, now, clock_skew_s)]
    return min(seen) if seen else None


_last_stamp: tuple = (None, None)  # (moment, its format_ts), replaced whole: threads never see half of one


def _stamp(moment: datetime) -> str:
    """format_ts, remembering the last one: a monitor pass stamps every agent seen for the first time with
    the same `now` (50,000 formattings of one moment in a process's first pass)."""
    global _last_stamp
    last = _last_stamp
    if last[0] == moment:
        return last[1]
    text = format_ts(moment)
    _last_stamp = (moment, text)
    return text


def _first_seen(previous: dict | None, seq) -> datetime | None:
    """When the previous monitor first saw this `seq` (None: it saw another seq, or has no entry)."""
    if not previous or previous.get("seq") != seq or not previous.get("seq_first_seen_at"):
        return None
    try:
        return parse_ts(previous["seq_first_seen_at"])
    except ValueError:
        return None


def _seq_went_back(previous: dict | None, seq) -> bool:
    before = previous.get("seq") if previous else None
    return (isinstance(before, int) and not isinstance(before, bool) and isinstance(seq, int)
            and not isinstance(seq, bool) and seq < before)


def effective_status(doc: dict | None, now: datetime, *, stale_after_s: float, dead_after_s: float,
                     clock_skew_s: float, previous: dict | None = None, written_at=None) -> Verdict:
    """What a (schema-valid) heartbeat `doc` means at `now`; `doc=None` means invalid.

    `previous` is this agent's entry in the previous monitor document, `written_at` when the file was
    last written by the filesystem's clock (a datetime, or a function giving one, asked only when it is
    needed). When `beat_at` lies more than `clock_skew_s` in the future the writer's clock is not
    trusted, and age runs from the earliest of when the monitor first saw the current `seq` and when the
    file was written (`observed_moment`): an agent whose clock runs ahead goes stale when it stops
    writing, whoever asks. A `seq` lower than the one the monitor saw before is the anomaly
    `seq_backwards` (the file was replaced by an older one, or its writer lost count).
    """
    if doc is None:
        return Verdict("invalid")
    seq = doc.get("seq")
    beat_at = parse_ts(doc["beat_at"])
    first_seen = _first_seen(previous, seq)
    if first_seen is None or first_seen > now:
        first_seen = now
    anomalies = []
    if is_skewed(beat_at, now, clock_skew_s):
        anomalies.append("clock_skew")
        written = written_at() if callable(written_at) else written_at
        since = observed_moment(beat_at, now, clock_skew_s, (first_seen, written))
        age = (now - since).total_seconds()
    else:
        age = (now - beat_at).total_seconds()
    if _seq_went_back(previous, seq):
        anomalies.append("seq_backwards")
    verdict = Verdict("invalid", round(age, 3), _stamp(first_seen), anomalies)
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


def file_written_at(path) -> datetime | None:
    """When the file at `path` was last written, by the filesystem's clock; None when it cannot be said."""
    try:
        return datetime.fromtimestamp(os.stat(path).st_mtime, UTC)
    except (OSError, ValueError, OverflowError):
        return None


def monitor_entry(paths, agent_id: str) -> dict | None:
    """This agent's entry in the current monitor document (its memory of first sightings), if any."""
    from .atomic import read_json_or

    document = read_json_or(paths.files.monitor)
    agents = document.get("agents") if isinstance(document, dict) else None
    for entry in agents if isinstance(agents, list) else ():
        if isinstance(entry, dict) and entry.get("agent_id") == agent_id:
            return entry
    return None


def status_of_doc(doc: dict, now: datetime, config) -> str:
    """The effective status of a heartbeat document that is not a local file (a shared store's copy)."""
    from .heartbeat import quick_check, schema_errors

    received = doc.get("received_at")  # when the store took it in: what a clock running ahead is judged by
    doc = {k: v for k, v in doc.items() if k != "received_at"}
    if not quick_check(doc) and schema_errors(doc):
        return "invalid"
    return effective_status(doc, now, written_at=lambda: _moment_or_none(received), **config.thresholds
                            ).effective_status


def _moment_or_none(stamp) -> datetime | None:
    try:
        return parse_ts(stamp)
    except (TypeError, ValueError):
        return None


def status_of_agent(paths, agent_id: str, now: datetime, config, previous: dict | None = None) -> str:
    """The effective status of one agent from its heartbeat file at `now`; 'missing' when it has none.

    For callers that keep no memory of their own (claims, list-agents): a heartbeat whose clock runs
    ahead is judged, as by the monitor, from the monitor's first sighting of its seq and the file's
    modification time, so its holder goes stale when it stops writing.
    """
    return _file_status(paths, agent_id, now, config, previous)[0]


def _file_status(paths, agent_id: str, now: datetime, config, previous: dict | None = None) -> tuple[str, dict | None]:
    """(status_of_agent, the heartbeat document when it is valid)."""
    from .heartbeat import read_heartbeat

    path = paths.files.heartbeat(agent_id)
    if not os.path.exists(path):
        return "missing", None
    read = read_heartbeat(path)
    if not read.valid:
        return "invalid", None
    thresholds = config.thresholds
    if previous is None and is_skewed(parse_ts(read.doc["beat_at"]), now, thresholds["clock_skew_s"]):
        previous = monitor_entry(paths, agent_id)  # only then: most calls never read the monitor
    return effective_status(read.doc, now, previous=previous, written_at=lambda: file_written_at(path),
                            **thresholds).effective_status, read.doc


def status_of_agent_anywhere(ws, agent_id: str, now: datetime, copies: dict | None = None) -> str:
    """`status_of_agent` from the local file; with a shared store, an agent with no file here (one on
    another machine) is judged by its heartbeat copy in the store (contract §12). `copies`: a dict to
    fill with every copy at the first need and reuse (a caller asking about many agents)."""
    return heartbeat_anywhere(ws, agent_id, now, copies)[0]


def heartbeat_anywhere(ws, agent_id: str, now: datetime, copies: dict | None = None) -> tuple[str, dict | None]:
    """(status_of_agent_anywhere, the heartbeat document it was judged by, or None): the document's
    `host` tells agents on several machines apart (§12)."""
    found, doc = _file_status(ws.paths, agent_id, now, ws.config)
    if found != "missing":
        return found, doc
    store = ws.store  # the workspace's (status never imports the store: it is a rule, below it)
    if store.kind == "sqlite":
        return found, None
    if copies is None:
        copy = store.heartbeat_copy(agent_id)
    else:
        if not copies:
            copies.update((c.get("agent_id"), c) for c in store.heartbeat_copies())
            copies.setdefault(None, None)  # filled: an empty store is not asked again
        copy = copies.get(agent_id)
    if copy is None:
        return found, None
    return status_of_doc(copy, now, ws.config), copy


# -- the registry (each session's agents table) ---------------------------------------------------------

LIVE_REGISTRY_STATUSES = ("active", "idle")
# the furthest RFC 3339 moment with microseconds: a ceiling past it never overflows
_END_OF_TIME = "9999-12-31T23:59:59.999999Z"
_last_window: tuple = (None, None, None, None, None)  # registry_window's last second: (second, stale, skew, prefixes)


def registry_window(now: datetime, config) -> tuple[str, str]:
    """(cutoff, ceiling): a registry `last_heartbeat` is fresh when cutoff <= it <= ceiling.

    The cutoff is `stale_after_s` ago. The ceiling is `clock_skew_s` ahead: a row carries no moment of
    our own observing, so a stamp further ahead (`observed_moment` gives None) is not evidence of life;
    it would otherwise count its agent live, block tired's consensus and a restart's take-over, and
    escape the watchdog's stale flag for as long as the skew. The SQL of the store mirrors this.
    """
    global _last_window
    stale, skew = float(config.stale_after_s), float(config.clock_skew_s)
    whole = now.tzinfo is UTC and stale.is_integer() and skew.is_integer()
    if whole:
        # both edges carry `now`'s microseconds: within one second (a busy server's sends), only those change.
        # The second by the epoch (a float that holds the microseconds exactly enough to floor), not by
        # datetime.replace, which costs half the window
        second, kept = now.timestamp() // 1, _last_window  # (floored: before 1970 too)
        if kept[0] == second and kept[1] == stale and kept[2] == skew:
            tail = ".%06dZ" % now.microsecond
            return kept[3] + tail, kept[4] + tail
    cutoff = micro_stamp(now - timedelta(seconds=stale))
    try:
        ceiling = micro_stamp(now + timedelta(seconds=skew))
    except OverflowError:
        return cutoff, _END_OF_TIME
    if whole:
        _last_window = (second, stale, skew, cutoff[:-8], ceiling[:-8])  # replaced whole: threads see one or other
    return cutoff, ceiling


def registry_freshness(now: datetime, config):
    """Whether a registry row's `last_heartbeat` (the store's fixed-width stamp) is fresh at `now`, as a
    test for many stamps: the window is worked out once."""
    cutoff, ceiling = registry_window(now, config)
    return lambda stamp: bool(stamp) and cutoff <= stamp <= ceiling


def registry_live(row, now: datetime, config) -> bool:
    """A registry row that counts as live: `active` or `idle`, with a fresh `last_heartbeat`."""
    return registry_liveness(now, config)(row)


def registry_liveness(now: datetime, config):
    """`registry_live` for many rows at one `now` (a send's audience, a broadcast's 1,000)."""
    fresh = registry_freshness(now, config)
    return lambda row: row["status"] in LIVE_REGISTRY_STATUSES and fresh(row["last_heartbeat"])
