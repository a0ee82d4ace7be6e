"""The heartbeat monitor: deriving heartbeat-monitor.json from every heartbeat, and its history (contract §6)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import threading
import time
from datetime import datetime
from functools import partial
from pathlib import Path

from .atomic import (atomic_write_bytes, atomic_write_json, file_signature, is_temp_name, json_names, locked,
                     read_json_or)
from .heartbeat import read_heartbeat, read_heartbeat_stat
from .status import EFFECTIVE_STATUSES, effective_status, file_written_at
from .timeutil import UTC, format_ts, parse_ts, utcnow

SCHEMA_VERSION = 1
MAX_ERRORS_PER_AGENT = 20
HISTORY_PREFIX = "heartbeat-monitor."
_HISTORY_RE = re.compile(r"^heartbeat-monitor\.(\d{8}T\d{6}\.\d{6}Z)\.(\d+)\.json$")
# up to this many agents the monitor file is indented for people; beyond, compact, because the
# indenting encoder is pure Python and costs ~0.4 s per 10,000 agents (the 2 s pass budget)
INDENT_UP_TO = 500


def _previous_agents(previous_doc) -> dict:
    if not isinstance(previous_doc, dict) or not isinstance(previous_doc.get("agents"), list):
        return {}
    return {a["agent_id"]: a for a in previous_doc["agents"]
            if isinstance(a, dict) and isinstance(a.get("agent_id"), str)}


def _agent_of(read) -> str:
    return read.agent_id


def derive_monitor(reads, previous_doc, now: datetime, config, held: dict | None = None) -> dict:
    """The monitor document for heartbeat `reads` (HeartbeatRead) at `now`; pure.

    `previous_doc` is the last monitor document (or None): it carries `since` while an agent's
    effective status is unchanged, and `seq_first_seen_at` for judging agents whose clocks run ahead.
    `held` ({agent_id: [items]}) adds each agent's live claims as `claims`, so the document shows
    who holds what.
    """
    held = held or {}
    thresholds = dict(config.thresholds)
    stale_after_s, dead_after_s = thresholds["stale_after_s"], thresholds["dead_after_s"]
    clock_skew_s = thresholds["clock_skew_s"]
    generated_at = format_ts(now)
    before = _previous_agents(previous_doc)
    counts = {status: 0 for status in EFFECTIVE_STATUSES}
    agents, transitions = [], []
    nothing: dict = {}
    for read in sorted(reads, key=_agent_of):
        agent_id = read.agent_id
        prev = before.get(agent_id)
        doc = read.doc if read.doc is not None and not read.errors else None  # read.valid, once
        verdict = effective_status(doc, now, previous=prev, written_at=partial(file_written_at, read.path),
                                   stale_after_s=stale_after_s, dead_after_s=dead_after_s, clock_skew_s=clock_skew_s)
        status = verdict.effective_status
        if doc is None:
            doc = nothing
        carried = prev.get("since") if prev and prev.get("effective_status") == status else None
        agents.append({  # in the order the contract lists the keys
            "agent_id": agent_id,
            "effective_status": status,
            "declared_status": doc.get("status"),
            "beat_at": doc.get("beat_at"),
            "seq": doc.get("seq"),
            "seq_first_seen_at": verdict.seq_first_seen_at,
            "age_s": verdict.age_s,
            "since": carried if isinstance(carried, str) else generated_at,
            "harness": doc.get("harness"),
            "substrate": doc.get("substrate"),
            "session_id": doc.get("session_id"),
            "task": doc.get("task"),
            "errors": read.errors[:MAX_ERRORS_PER_AGENT],  # a slice is a new list already
            "anomalies": verdict.anomalies,  # the verdict's own list, made for this agent
            "claims": list(held[agent_id]) if agent_id in held else [],
        })
        counts[status] += 1
        was = prev.get("effective_status") if prev else None
        if was != status:
            transitions.append({"agent_id": read.agent_id, "from": was, "to": status})
    seen = {a["agent_id"] for a in agents}
    for agent_id in sorted(set(before) - seen):
        # the heartbeat file is gone: say so once, then the agent drops out of the monitor
        transitions.append({"agent_id": agent_id, "from": before[agent_id].get("effective_status"), "to": None})
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": generated_at,
        "thresholds": thresholds,
        "counts": counts,
        "agents": agents,
        "transitions": transitions,
    }


def read_all_heartbeats(paths, reuse: bool = False) -> list:
    """Every heartbeat file (temp files of crashed writers skipped), read and quick-checked.

    Paths as plain strings (os.path.join), not pathlib: building and printing a Path per file was a
    fifth of a pass over 20,000 files. The same files, in the same order, as iter_heartbeat_paths.
    With `reuse` (a monitor pass), a file whose signature is the one it had at this process's last pass
    over the folder is not read again (_unchanged_reads).
    """
    folder = os.fspath(paths.heartbeats)
    names = json_names(folder)
    if not reuse:
        return [read_heartbeat(os.path.join(folder, name)) for name in names]
    return _unchanged_reads(folder, names)


# Per folder, what this process's last monitor pass read: {name: (signature, HeartbeatRead)}. A writer never
# changes a heartbeat in place (a new file, then a rename: a new inode), and anything that does write in place
# changes its ctime, which nobody can set back: a file with the same inode, device, size, mtime and ctime (in
# nanoseconds) holds what it held. One stat per unchanged file instead of open, fstat, two reads, close, a
# JSON decode and the schema's check: a watching monitor, where most of 50,000 agents did not beat since the
# last pass, pays those only for the files that changed (issue 31).
_READS: dict = {}


def _signature(info) -> tuple:
    return info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


def _unchanged_reads(folder: str, names: list) -> list:
    kept = _READS.pop(folder, {})
    fresh, reads = {}, []
    for name in names:
        path = os.path.join(folder, name)
        hit = kept.get(name)
        if hit is not None:
            try:
                signature = _signature(os.stat(path))
            except OSError:  # gone or unreadable: read_heartbeat_stat says which, as it always has
                signature = None
            if signature == hit[0]:
                fresh[name] = hit
                reads.append(hit[1])
                continue
        # not read before (a process's first pass: no stat at all), or changed: the signature is the fstat of
        # the very file read, so a file replaced after it is read again at the next pass
        read, info = read_heartbeat_stat(path)
        if info is not None:
            fresh[name] = (_signature(info), read)
        reads.append(read)
    _READS[folder] = fresh  # only the names listed now: a removed file is forgotten
    return reads


@contextlib.contextmanager
def _no_gc_pauses():
    """The cyclic garbage collector off for one pass (on again after, as it was): a pass makes tens of
    thousands of acyclic dicts, and each full collection walks all of them, so with the collector on
    a pass grew faster than the files it reads. Reference counting still frees everything."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def heartbeat_reads(ws) -> list:
    """Every heartbeat this state directory's readers see: the local files, then, with a shared store,
    the copies of agents on other machines (those with no local file), checked the same way."""
    from .heartbeat import HeartbeatRead, quick_check, schema_errors
    reads = read_all_heartbeats(ws.paths, reuse=True)
    store = ws.store
    if store.kind == "sqlite":
        return reads
    local = {r.agent_id for r in reads}
    for copy in store.heartbeat_copies():
        agent_id = copy.get("agent_id")
        if not isinstance(agent_id, str) or agent_id in local:
            continue
        doc = {k: v for k, v in copy.items() if k != "received_at"}
        errors = [] if quick_check(doc) else schema_errors(doc)
        reads.append(HeartbeatRead(agent_id, f"{getattr(store, 'where', store.kind)}#heartbeats/{agent_id}",
                                   doc, errors))
    return reads


def _history_stamp(previous_doc, monitor_path: Path) -> str:
    """The sortable stamp of a monitor about to be rotated: its generated_at, else its file time."""
    moment = None
    if isinstance(previous_doc, dict):
        try:
            moment = parse_ts(previous_doc.get("generated_at"))
        except ValueError:
            moment = None
    if moment is None:
        moment = datetime.fromtimestamp(monitor_path.stat().st_mtime, UTC)
    return moment.strftime("%Y%m%dT%H%M%S.%fZ")


def history_files(history_dir: Path) -> list[Path]:
    """Rotated monitor snapshots, oldest first (the names sort by time, then by a counter)."""
    try:
        names = os.listdir(history_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _HISTORY_RE.match(name)
        if match and not is_temp_name(name):
            found.append((match.group(1), int(match.group(2)), name))
    return [history_dir / name for _stamp, _n, name in sorted(found)]


def rotate_into_history(monitor_path: Path, history_dir: Path, previous_doc) -> Path | None:
    """Keep the current monitor file in `history_dir` under a name that never collides; its path.

    The file is hard-linked (it stays in place until the new monitor replaces it, so a reader
    never finds none); the counter in the name makes two passes in one second keep both, and
    `os.link` fails rather than overwrite, so even two racing monitors cannot lose a snapshot.
    """
    if not monitor_path.exists():
        return None
    history_dir.mkdir(parents=True, exist_ok=True)
    stamp = _history_stamp(previous_doc, monitor_path)
    taken = [int(m.group(2)) for p in history_files(history_dir)
             if (m := _HISTORY_RE.match(p.name)) and m.group(1) == stamp]
    counter = max(taken) + 1 if taken else 0
    while True:
        target = history_dir / f"{HISTORY_PREFIX}{stamp}.{counter:03d}.json"
        try:
            os.link(monitor_path, target)
            return target
        except FileExistsError:
            counter += 1
        except OSError:
            # a filesystem without hard links: copy, refusing to overwrite
            if target.exists():
                counter += 1
                continue
            shutil.copyfile(monitor_path, target)
            return target


def prune_history(history_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` snapshots; returns what was deleted."""
    files = history_files(history_dir)
    doomed = files[:-keep] if keep > 0 else files
    for path in doomed:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    return doomed


def run_monitor(ws, now: datetime | None = None, keep: int | None = None, rotate: bool = True,
                reads: list | None = None) -> dict:
    """One monitor pass: read every heartbeat, derive, rotate the previous monitor, write; the document."""
    with _no_gc_pauses():
        return _run_monitor(ws, now, keep, rotate, reads)


def _run_monitor(ws, now, keep, rotate, reads) -> dict:
    now = now or utcnow()
    keep = ws.config.monitor_keep if keep is None else keep
    paths = ws.paths
    if reads is None:
        reads = heartbeat_reads(ws)
    with locked(paths.lock("monitor")):
        previous = _previous_document(paths.monitor)
        from .claims import held_items

        document = derive_monitor(reads, previous, now, ws.config, held_items(ws, now))
        if rotate:
            rotate_into_history(paths.monitor, paths.monitor_history, previous)
        if len(document["agents"]) <= INDENT_UP_TO:
            atomic_write_json(paths.monitor, document)
        else:
            compact = json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n"
            atomic_write_bytes(paths.monitor, compact.encode("utf-8"))
        _remember_written(paths.monitor, document)
        if rotate:
            prune_history(paths.monitor_history, keep)
    return document


# What a pass carries over from the previous monitor document (derive_monitor, effective_status), and the
# last document this process wrote, per monitor file: (its file_signature, those fields). A watching monitor
# then never parses again the megabytes it has just written (50,000 agents: 20 MB, a tenth of a pass); a file
# anyone else replaced or rewrote since has another signature and is read as before.
_CARRIED = ("agent_id", "effective_status", "since", "seq", "seq_first_seen_at")
_LAST_WRITTEN: dict = {}


def _previous_document(path):
    key = os.fspath(path)
    kept = _LAST_WRITTEN.get(key)
    if kept is not None and kept[0] == file_signature(key):
        return kept[1]
    _LAST_WRITTEN.pop(key, None)
    return read_json_or(key)


def _remember_written(path, document: dict) -> None:
    key = os.fspath(path)
    signature = file_signature(key)
    if signature is None:
        _LAST_WRITTEN.pop(key, None)
        return
    # copies of the few carried fields: a caller may change the document it is handed
    carried = [{field: entry[field] for field in _CARRIED} for entry in document["agents"]]
    _LAST_WRITTEN[key] = (signature, {"generated_at": document["generated_at"], "agents": carried})


def _watch_interval(config) -> float:
    # statuses change with time alone (an agent that stops beating goes stale without any file
    # event), so the watcher also re-derives on a timer short enough to notice within a minute
    return max(1.0, min(30.0, config.stale_after_s / 2))


def watch_monitor(ws, on_pass, stop: threading.Event | None = None, keep: int | None = None,
                  rotate: bool = True, interval: float | None = None, settle_s: float = 0.2) -> int:
    """Re-derive the monitor whenever a heartbeat changes (and every `interval` s) until `stop` is set.

    `on_pass(document)` is called after each pass. Returns the number of passes.
    """
    from .watching import event_handler, event_paths, start_observer, stop_observer, writes_only

    stop = stop or threading.Event()
    changed = threading.Event()
    interval = _watch_interval(ws.config) if interval is None else interval

    def on_event(event):
        for path in event_paths(event):
            name = os.path.basename(path)
            if name.endswith(".json") and not is_temp_name(name):
                changed.set()

    ws.paths.heartbeats.mkdir(parents=True, exist_ok=True)
    # writes only: a pass reads every heartbeat, and each read's "opened" event would start the next pass
    observer = start_observer(event_handler(on_event), ws.paths.heartbeats, poll_interval_s=0.5,
                              event_filter=writes_only())
    passes = 0
    try:
        while not stop.is_set():
            changed.clear()  # before the pass: a beat landing during it triggers the next one
            on_pass(run_monitor(ws, keep=keep, rotate=rotate))
            passes += 1
            deadline = time.monotonic() + interval
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if changed.wait(min(0.5, remaining)):
                    stop.wait(settle_s)  # let a burst of beats land in one pass
                    break
    finally:
        stop_observer(observer, timeout=5)
    return passes
