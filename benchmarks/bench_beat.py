#!/usr/bin/env python3
"""Wall time of `synapolis beat` against `python -c "import click"`, measured in the same run.

Target (issue 2): the median beat at most 1.5x the median baseline, so nothing heavy (jsonschema,
dateutil, watchdog, mcp) may load on that path. Runs interleave so machine noise hits every side
alike. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_beat.py [--runs 30] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTION = "bench_beat"
TARGET = 1.5


def synapolis_cmd() -> list[str]:
    """The console script users run, else `python -m synapolis`."""
    script = Path(sys.executable).parent / "synapolis"
    if script.exists():
        return [str(script)]
    found = shutil.which("synapolis")
    return [found] if found else [sys.executable, "-m", "synapolis"]


def machine() -> str:
    return f"{platform.node()} · {platform.system()} {platform.release()} · {os.cpu_count()} CPUs · " \
           f"Python {platform.python_version()}"


def write_section(section: str, body: str, path: Path = HERE / "RESULTS.md") -> None:
    """Replace only `section` of RESULTS.md (between its BEGIN/END markers), adding it when missing."""
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    block = f"{begin}\n{body}\n{end}"
    old = path.read_text("utf-8") if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new, "utf-8")


def bench_env(tmp: Path) -> dict:
    """The environment of a measured process: no SYNAPOLIS_* leaking in, bytecode cached.

    An installed package has compiled bytecode; a checkout run with PYTHONDONTWRITEBYTECODE would
    recompile every module on every start and measure the compiler, so the caches go to `tmp`.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPOLIS_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def timed(cmd: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
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
             f"Command: `python benchmarks/bench_beat.py --runs {args.runs}` ({args.runs} interleaved runs each, "
             f"median wall time of a subprocess; `{Path(beat[0]).name}` console script; bytecode cached, "
             f"as in an installed package)", "",
             "| what | median | vs baseline |", "|---|---|---|"]
    lines += [f"| {name} | {median * 1000:.1f} ms | {ratio:.2f}x |" for name, median, ratio in rows]
    lines += ["", f"Target: at most {TARGET}x the baseline — {verdict}."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
