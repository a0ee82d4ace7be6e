#!/usr/bin/env python3
"""The monitor's cost per heartbeat file at 1,000 and at 50,000 files, against json-loading the same files.

Targets (issue 15): a pass over 50,000 files at most 2x json-loading them, and the cost per file flat
from 1,000 to 50,000 (a pass must not grow faster than the files it reads). Passes and baselines
alternate, medians reported; files as bench_monitor.populate makes them (1% breaking the schema,
0.1% not JSON). Writes its section of benchmarks/RESULTS.md (bench_monitor keeps the 10,000 figure).

    python benchmarks/bench_monitor_scale.py [--small 1000] [--large 50000] [--passes 5] [--small-passes 50]
        [--no-write]

The small pass lasts a few tens of milliseconds, where one preemption by a neighbour moves a median of five:
it runs --small-passes times (50 by default, about a second), the large one --passes times.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_parser, machine, publish
from bench_monitor import json_load_all, populate

SECTION = "bench_monitor_scale"


def measure(root: Path, files: int, passes: int) -> dict:
    from synapolis.monitor import run_monitor
    from synapolis.timeutil import utcnow
    from synapolis.workspace import Workspace

    ws = Workspace.open(root).ensure()
    populate(ws.paths.heartbeats, files, utcnow())
    json_load_all(ws.paths.heartbeats)  # the page cache warm for both sides alike
    run_monitor(ws)  # imports (jsonschema for the bad files) out of the way
    base, mon = [], []
    for _ in range(passes):
        started = time.perf_counter()
        json_load_all(ws.paths.heartbeats)
        base.append(time.perf_counter() - started)
        started = time.perf_counter()
        run_monitor(ws)
        mon.append(time.perf_counter() - started)
    return {"files": files, "base": statistics.median(base), "monitor": statistics.median(mon)}


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=50_000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--small-passes", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-monitor-scale-"))
    try:
        small = measure(tmp / "small", args.small, args.small_passes)
        large = measure(tmp / "large", args.large, args.passes)
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    per = {k: m["monitor"] / m["files"] * 1e6 for k, m in (("small", small), ("large", large))}
    ratio = large["monitor"] / large["base"]
    growth = per["large"] / per["small"]
    base_growth = (large["base"] / large["files"]) / (small["base"] / small["files"])
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    rows = [f"| {m['files']:,} | {m['base']:.3f} s | {m['monitor']:.3f} s | {m['monitor'] / m['base']:.2f}x | "
            f"{m['monitor'] / m['files'] * 1e6:.0f} µs |" for m in (small, large)]
    text = "\n".join([
        f"## Monitor pass, {args.small:,} vs {args.large:,} heartbeat files (bench_monitor_scale.py)", "",
        f"Machine: {machine()} · load average {load:.1f} at the end  ",
        f"Command: `python benchmarks/bench_monitor_scale.py --small {args.small} --large {args.large} "
        f"--passes {args.passes} --small-passes {args.small_passes}` (`run_monitor` in-process and the baseline "
        "alternating; medians)", "",
        "| files | json-load every file (baseline) | `run_monitor` pass | vs baseline | per file |",
        "|---|---|---|---|---|", *rows, "",
        f"Targets: at {args.large:,} files at most 2x the baseline — {ratio:.2f}x, {met(ratio <= 2.0)}; per-file "
        f"cost flat from {args.small:,} to {args.large:,} — {growth:.2f}x, {met(growth <= 1.25)}. The baseline's own "
        f"cost per file grew {base_growth:.2f}x over the same range (the same files read the same way: what the "
        f"machine adds, a directory of {args.large:,} entries and a page cache that large); the monitor's growth "
        f"beyond it is {growth / base_growth:.2f}x. The pass runs with the cyclic garbage collector off "
        "(monitor._no_gc_pauses) and plain string paths.",
    ])
    publish(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
