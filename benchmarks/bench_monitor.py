#!/usr/bin/env python3
"""A monitor pass over 10,000 heartbeat files against just json-loading those files, in the same run.

Target (issue 2): a pass under 2 s, validation included (every file is checked against the schema:
the hand mirror for all, jsonschema for the bad ones, which this set includes). Writes its section
of benchmarks/RESULTS.md.

    python benchmarks/bench_monitor.py [--files 10000] [--passes 5] [--no-write]
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _common import bench_env, bench_parser, machine, publish, synapolis_cmd


SECTION = "bench_monitor"
TARGET_S = 2.0


def populate(folder: Path, count: int, now) -> dict:
    """`count` heartbeat files: mostly valid at every age, 1% breaking the schema, 0.1% not JSON."""
    from synapolis.timeutil import format_ts

    rng = random.Random(1)
    folder.mkdir(parents=True, exist_ok=True)
    kinds = {"valid": 0, "schema": 0, "json": 0}
    for i in range(count):
        agent = f"agent_{i:05d}"
        doc = {"schema_version": 1, "agent_id": agent, "harness": "claude-code",
               "status": rng.choice(["active", "active", "idle", "sleeping", "stopped"]),
               "beat_at": format_ts(now - timedelta(seconds=rng.choice([5, 200, 600, 5000, 90000]))),
               "seq": rng.randint(1, 10 ** 6), "substrate": "Claude Sonnet 4.6", "session_id": "20300101_000000_abcd1234",
               "started_at": format_ts(now - timedelta(days=1)), "task": "work item " * 5, "host": "vm",
               "pid": rng.randint(1, 99999), "x": {"tool": "bench"}}
        roll = rng.random()
        if roll < 0.001:
            text, kind = '{"schema_version": 1, "agent_id": ', "json"
        elif roll < 0.011:
            doc["colour"] = "red"
            text, kind = json.dumps(doc, indent=2), "schema"
        else:
            text, kind = json.dumps(doc, indent=2), "valid"
        kinds[kind] += 1
        (folder / f"{agent}.json").write_text(text)
    return kinds


def json_load_all(folder: Path) -> int:
    """The baseline: list the folder and json-load every file, nothing else."""
    loaded = 0
    for path in sorted(folder.iterdir()):
        try:
            json.loads(path.read_bytes())
            loaded += 1
        except ValueError:
            pass
    return loaded


def median_time(call, passes: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `call` (CPU of this process and its children: on a busy machine
    wall time measures the neighbours too, CPU time what a pass itself costs)."""
    walls, cpus = [], []
    for _ in range(passes):
        cpu_started, wall_started = _cpu(), time.perf_counter()
        call()
        walls.append(time.perf_counter() - wall_started)
        cpus.append(_cpu() - cpu_started)
    return statistics.median(walls), statistics.median(cpus)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()

    from synapolis.monitor import run_monitor
    from synapolis.timeutil import utcnow
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-monitor-"))
    try:
        ws = Workspace.open(tmp / "state").ensure()
        kinds = populate(ws.paths.heartbeats, args.files, utcnow())
        json_load_all(ws.paths.heartbeats)  # warm the page cache for both sides alike
        baseline = median_time(lambda: json_load_all(ws.paths.heartbeats), args.passes)
        holder = {}
        first = median_time(lambda: holder.update(doc=run_monitor(ws)), 1)  # also imports jsonschema
        steady = median_time(lambda: run_monitor(ws), args.passes)
        env = bench_env(tmp)
        cli = [*synapolis_cmd(), "--state-dir", str(ws.root), "monitor"]
        subprocess.run(cli, capture_output=True, env=env, check=True)  # bytecode caches
        cli_run = median_time(lambda: subprocess.run(cli, capture_output=True, env=env, check=True), args.passes)
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    doc = holder["doc"]
    assert len(doc["agents"]) == args.files and doc["counts"]["invalid"] == kinds["schema"] + kinds["json"]
    worst_wall = max(first[0], steady[0], cli_run[0])
    worst_cpu = max(first[1], steady[1], cli_run[1])
    verdict = (f"wall {worst_wall:.2f} s at worst ({'met' if worst_wall < TARGET_S else 'MISSED'}), "
               f"CPU {worst_cpu:.2f} s at worst ({'met' if worst_cpu < TARGET_S else 'MISSED'})")

    def row(what, m):
        return f"| {what} | {m[0]:.3f} s | {m[1]:.3f} s | {m[0] / baseline[0]:.2f}x |"
    lines = [f"## Monitor pass over {args.files:,} heartbeats (bench_monitor.py)", "",
             f"Machine: {machine()} · load average {load:.1f} when measured  ",
             f"Command: `python benchmarks/bench_monitor.py --files {args.files} --passes {args.passes}`  ",
             f"Files: {args.files} ({kinds['valid']} valid, {kinds['schema']} breaking the schema, "
             f"{kinds['json']} not JSON); a pass reads, validates, derives, rotates and writes the monitor.", "",
             "| what | wall | CPU | wall vs baseline |", "|---|---|---|---|",
             row(f"json-load every file (baseline, median of {args.passes})", baseline),
             row("`run_monitor`, first pass in the process (imports jsonschema)", first),
             row(f"`run_monitor`, median of {args.passes} further passes", steady),
             row(f"`synapolis monitor` as a process (median of {args.passes})", cli_run),
             "", f"Target: under {TARGET_S:.0f} s — {verdict}."]
    text = "\n".join(lines)
    publish(SECTION, text, write=not args.no_write)
    return 0 if worst_wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
