#!/usr/bin/env python3
"""Cost of consensus sleep, against baselines measured in the same run.

1. A standby `tired` (stage 5 memories, one BEGIN IMMEDIATE transaction) against a plain `beat`
   through the same library path (`actions.beat`): what the protocol adds to a verb.
2. A consolidation (100 staged memories from 5 agents) into a ledger already holding N lines,
   against the same consolidation into an empty ledger: the skip-what-is-held check reads the
   whole ledger, so the call grows with it; but the ledger is read before the consensus
   transaction, so the time the session's write lock is held (what other agents wait for) must not.

    python benchmarks/bench_sleep.py [--runs 15] [--no-write]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import bench_parser, call_ms, machine, publish

SECTION = "bench_sleep"

from synapolis import actions, sleep  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.store import SessionStore  # noqa: E402  (the SQLite one)

LOCK_HELD_MS: list[float] = []
_original_write = SessionStore.write


@contextlib.contextmanager
def _timed_write(self):
    """SessionStore.write, recording how long each write transaction held the lock."""
    with _original_write(self) as conn:
        began = time.perf_counter()
        yield conn
    LOCK_HELD_MS.append((time.perf_counter() - began) * 1000)


SessionStore.write = _timed_write
from synapolis.workspace import Workspace  # noqa: E402


def session(root: Path, agents: list[str]) -> tuple[Workspace, str]:
    ws = Workspace.open(root).ensure()
    sid = None
    for agent in agents:
        sid = actions.start(ws, agent_id=agent, session_id=sid, new_session=sid is None,
                            write_identity=False)["session_id"]
    return ws, sid


def standby_vs_beat(tmp: Path, runs: int) -> tuple[list[float], list[float]]:
    beats, standbys = [], []
    for i in range(runs):
        ws, sid = session(tmp / f"sb{i}", ["a", "b"])
        beats.append(call_ms(lambda: actions.beat(ws, Who("a", sid), status="active")))
        memories = [f"memory {i}.{n}" for n in range(5)]
        standbys.append(call_ms(lambda: sleep.tired(ws, Who("a", sid), memories=memories)))
    return beats, standbys


def fill_ledger(path: Path, lines: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for n in range(lines):
            norm = f"old memory number {n} about some part of the system"
            handle.write(json.dumps({"schema_version": 1, "id": f"{n:064x}", "text": norm, "norm": norm, "tags": [],
                                     "sources": ["x"], "session_id": "s", "created_at": "2026-01-01T00:00:00Z",
                                     "merged_at": "2026-01-01T00:00:00Z"}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())  # an old ledger is on disk; its dirty pages are not ours to flush


def consolidation(tmp: Path, ledger_lines: int, runs: int) -> tuple[list[float], list[float]]:
    agents = [f"agent{k}" for k in range(5)]
    times, held = [], []
    for i in range(runs):
        ws, sid = session(tmp / f"c{ledger_lines}_{i}", agents)
        fill_ledger(ws.paths.memory_ledger, ledger_lines)
        for k, agent in enumerate(agents[:-1]):
            sleep.tired(ws, Who(agent, sid), memories=[f"{agent} learned {n}" for n in range(20)])
        last = agents[-1]
        LOCK_HELD_MS.clear()
        times.append(call_ms(lambda: sleep.tired(ws, Who(last, sid), memories=[f"{last} learned {n}" for n in range(20)])))
        held.append(max(LOCK_HELD_MS))
    return times, held


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-sleep-"))
    try:
        beats, standbys = standby_vs_beat(tmp, args.runs)
        sizes = [0, 10_000, 100_000]
        consolidations = {n: consolidation(tmp, n, max(3, args.runs // 3)) for n in sizes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    rows = [f"| `beat` (baseline) | {med(beats):.1f} ms | |",
            f"| standby `tired`, 5 memories | {med(standbys):.1f} ms ({med(standbys) / med(beats):.2f}x beat) | |"]
    base, base_held = med(consolidations[0][0]), med(consolidations[0][1])
    for n in sizes:
        call, held = med(consolidations[n][0]), med(consolidations[n][1])
        rows.append(f"| consolidating 100 memories, ledger of {n:,} lines | {call:.1f} ms ({call / base:.2f}x empty) "
                    f"| {held:.1f} ms ({held / base_held:.2f}x empty) |")
    text = "\n".join([
        "## bench_sleep: consensus sleep",
        "",
        f"Machine: {machine()}  ",
        f"Command: `python benchmarks/bench_sleep.py --runs {args.runs}` (library calls, medians)",
        "",
        "| what | median call | median write-lock hold |",
        "|---|---|---|",
        *rows,
    ])
    publish(SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
