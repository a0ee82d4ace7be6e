#!/usr/bin/env python3
"""Claims per second: 8 processes racing over the same 200 items, against unlocked baselines in the same run.

Each process walks every item in its own random order, `--passes` times: claim it (a conflict when a
live other holds it), and release what it won. Baselines, same processes, same walk:
`bare` writes the claim file with `atomic_write_json` and appends the event with `append_jsonl`
for every attempt, with no lock and no decision (what a tracker that lets two agents win does);
`filelock` only takes and drops the per-item lock (`claims._item_lock`: atomic.locked's try, a FileLock
wait when another holds it) and reads the file. Modes interleave over
`--repeats` so machine noise hits each alike; the median run of each is reported. Writes its
section of benchmarks/RESULTS.md.

    python benchmarks/bench_claims.py [--procs 8] [--items 200] [--passes 2] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

SECTION = "bench_claims"
MODES = ("race", "cycle", "bare", "filelock")
WHAT = {
    "race": "`claims.claim`; the pass ends before winners release (timed apart): one winner per item",
    "cycle": "`claims.claim` and, when won, `claims.release` at once (two locked writes)",
    "bare": "unlocked `atomic_write_json` + `append_jsonl`: every attempt \"wins\"",
    "filelock": "the per-item lock alone (`claims._item_lock`; FileLock waits when busy), read the claim file, release",
}


def _worker(mode: str, state_dir: str, index: int, items: list, passes: int, barrier, out) -> None:
    from synapolis import claims
    from synapolis.atomic import append_jsonl, atomic_write_json, read_json_or
    from synapolis.errors import ConflictError
    from synapolis.store.local.claims import item_lock
    from synapolis.workspace import Workspace

    ws = Workspace.open(state_dir)
    agent = f"bench{index}"
    rng = random.Random(index)
    counts = {"attempts": 0, "wins": 0, "conflicts": 0, "releases": 0}
    spans = []
    for _ in range(passes):
        order = items[:]
        rng.shuffle(order)
        won = []
        barrier.wait(timeout=120)
        started = time.monotonic()
        for item in order:
            counts["attempts"] += 1
            if mode in ("race", "cycle"):
                try:
                    claims.claim(ws, item, agent)
                except ConflictError:
                    counts["conflicts"] += 1
                    continue
                counts["wins"] += 1
                won.append(item)
                if mode == "cycle":
                    claims.release(ws, item, agent)
                    counts["releases"] += 1
            elif mode == "bare":
                atomic_write_json(claims.claim_path(ws, item), {"item": item, "claimed_by": agent})
                append_jsonl(ws.paths.claims_log, {"item": item, "event": "claimed", "by": agent})
                counts["wins"] += 1
            else:
                with item_lock(ws, item):
                    read_json_or(claims.claim_path(ws, item))
                counts["wins"] += 1
        spans.append((started, time.monotonic()))
        if mode == "race":
            barrier.wait(timeout=120)  # everyone has tried every item: now the winners let go
            for item in won:
                claims.release(ws, item, agent)
                counts["releases"] += 1
    out.put({"index": index, "spans": spans, **counts})


def run_mode(mode: str, procs: int, n_items: int, passes: int) -> dict:
    from synapolis.heartbeat import write_heartbeat
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-claims-{mode}-"))
    ws = Workspace.open(tmp / "state").ensure()
    for i in range(procs):  # live holders, so a winner keeps its item until it releases it
        write_heartbeat(ws.paths, f"bench{i}")
    items = [f"ticket:{i:04d}" for i in range(n_items)]
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(mode, str(ws.root), i, items, passes, barrier, out))
               for i in range(procs)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    if any(w.exitcode != 0 for w in workers):
        raise SystemExit(f"{mode}: a worker failed")
    shutil.rmtree(tmp, ignore_errors=True)
    # timed: each pass from the first start to the last end, releases of a race pass excluded
    wall = sum(max(r["spans"][p][1] for r in results) - min(r["spans"][p][0] for r in results)
               for p in range(passes))
    total = {k: sum(r[k] for r in results) for k in ("attempts", "wins", "conflicts", "releases")}
    return {"mode": mode, "wall_s": wall, **total,
            "attempts_per_s": total["attempts"] / wall, "wins_per_s": total["wins"] / wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    from _common import machine, publish

    load_before = os.getloadavg()[0]
    runs = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            result = run_mode(mode, args.procs, args.items, args.passes)
            runs[mode].append(result)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
    median = {mode: sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2] for mode, rs in runs.items()}
    # the point of the lock: every race pass has exactly one winner per item
    assert all(r["wins"] == args.items * args.passes for r in runs["race"]), "a race had two winners"
    command = (f"python benchmarks/bench_claims.py --procs {args.procs} --items {args.items} "
               f"--passes {args.passes} --repeats {args.repeats}")
    rows = ["| mode | one attempt | attempts | won | attempts/s | successful claims/s |",
            "|---|---|---|---|---|---|"]
    for mode in MODES:
        r = median[mode]
        rows.append(f"| {mode} | {WHAT[mode]} | {r['attempts']} | {r['wins']} | {r['attempts_per_s']:.0f} | "
                    f"{r['wins_per_s']:.0f} |" if mode in ("race", "cycle") else
                    f"| {mode} | {WHAT[mode]} | {r['attempts']} | (all) | {r['attempts_per_s']:.0f} | - |")
    race, cycle, bare = median["race"], median["cycle"], median["bare"]
    text = "\n".join([
        f"## Claims: {args.procs} processes over {args.items} items",
        "",
        f"Machine: {machine()}  ",
        f"Command: `{command}`  ",
        f"Each process walks every item in its own order, {args.passes} passes, all starting at a shared "
        f"barrier; median of {args.repeats} interleaved runs per mode. State on `{tempfile.gettempdir()}`; "
        f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other work shares "
        "the machine when it is above the CPU count).",
        "",
        *rows,
        "",
        f"race: {race['wins']} winners out of {race['attempts']} attempts (one per item and pass), "
        f"{race['conflicts']} refused as conflicts. cycle: {cycle['wins_per_s']:.0f} successful claims/s "
        f"across {args.procs} processes, each followed by its release, against {bare['attempts_per_s']:.0f} "
        f"bare unlocked write+append/s: a claim costs about "
        f"{bare['attempts_per_s'] / cycle['wins_per_s']:.1f}x a bare write, for two durable writes "
        "(claim and release) under a lock instead of one with none.",
    ])
    publish(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
