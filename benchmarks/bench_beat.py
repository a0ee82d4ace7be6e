#!/usr/bin/env python3
"""Wall time of `synapolis beat` against `python -c "import click"`, measured in the same run.

Target (issue 2): the median beat at most 1.5x the median baseline, so nothing heavy (jsonschema,
dateutil, watchdog, mcp) may load on that path. Runs interleave so machine noise hits every side
alike. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_beat.py [--runs 30] [--no-write]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import bench_env, bench_parser, interpreter, machine, publish, ratio_table, synapolis_cmd, timed

SECTION = "bench_beat"
TARGET = 1.5


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-beat-"))
    env = bench_env(tmp)
    beat = synapolis_cmd()
    sides = {
        'python -c "import click" (baseline)': lambda i: [sys.executable, "-c", "import click"],
        "synapolis beat, fresh state dir": lambda i: [*beat, "--state-dir", str(tmp / f"fresh{i}"), "beat",
                                                      "--agent-id", "bench", "--task", "benchmark"],
        "synapolis beat, existing state dir": lambda i: [*beat, "--state-dir", str(tmp / "steady"), "beat",
                                                         "--agent-id", "bench"],
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for name, make in sides.items():  # warm-up: bytecode caches, the steady state dir
            timed(make(-1), env)
        for i in range(args.runs):
            for name, make in sides.items():
                times[name].append(timed(make(i), env))
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    names = list(sides)
    base = statistics.median(times[names[0]])
    rows = [(name, statistics.median(times[name]), statistics.median(times[name]) / base) for name in names]
    worst = max(ratio for _name, _median, ratio in rows[1:])
    verdict = f"met ({worst:.2f}x)" if worst <= TARGET else f"MISSED ({worst:.2f}x)"
    lines = ["## `synapolis beat` start-up (bench_beat.py)", "",
             f"Machine: {machine()} · load average {load:.1f} when measured  ",
             f"Command: `{Path(sys.executable).name} benchmarks/bench_beat.py --runs {args.runs}` ({args.runs} "
             f"interleaved runs each, median wall time of a subprocess; the `{Path(beat[0]).name}` console script)  ",
             interpreter(), "", *ratio_table(rows)]
    lines += ["", f"Target: at most {TARGET}x the baseline — {verdict}."]
    text = "\n".join(lines)
    publish(SECTION, text, write=not args.no_write)
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
