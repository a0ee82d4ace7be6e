#!/usr/bin/env python3
"""`read-notes --limit 5` on a huge notes bus costs the newest notes, not the bus (issue 11, family 8).

Time and peak memory (max RSS) of `synapolis read-notes --limit 5 --json` as a process, on a notes file
of 1 MB and of `--mb` MB (default 200), against `python -c pass` measured in the same run. Before the
notes were read from the end, the 200 MB run parsed every line (845 MiB of memory).

    python benchmarks/bench_read_notes.py [--mb 200] [--runs 5] [--no-write]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import bench_env, bench_parser, interpreter, machine, publish, synapolis_cmd

SECTION = "bench_read_notes"

from synapolis import actions  # noqa: E402
from synapolis.workspace import Workspace  # noqa: E402

# runs `cmd` and prints its seconds and max RSS in KiB (RUSAGE_CHILDREN of this wrapper: only `cmd`)
_MEASURE = ("import resource, subprocess, sys, time\n"
            "began = time.perf_counter()\n"
            "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
            "took = time.perf_counter() - began\n"
            "assert done.returncode == 0, done.stderr\n"
            "print(took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def measure(cmd: list[str], env: dict) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True, env=env, check=True)
    seconds, kib = out.stdout.split()
    return float(seconds), int(kib) / 1024


def notes_state(root: Path, megabytes: float) -> Path:
    ws = Workspace.open(root / "state").ensure()
    sid = actions.start(ws, agent_id="writer", env={})["session_id"]
    line = json.dumps({"seq": 1, "at": "2030-01-01T00:00:00.000000Z", "agent_id": "writer",
                       "text": "an old note " + "x" * 400}) + "\n"
    count = int(megabytes * 1024 * 1024) // len(line)
    with open(ws.paths.session_notes(sid), "w") as handle:
        for _ in range(count // 1000):
            handle.write(line * 1000)
    for i in range(5):
        actions.note(ws, actions.Who("writer", sid), f"newest {i}", env={})
    return ws.root


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = bench_env(tmp)
        small, big = notes_state(tmp / "small", 1), notes_state(tmp / "big", args.mb)
        cases = [("`python -c pass` (baseline)", [sys.executable, "-c", "pass"]),
                 ("`read-notes --limit 5`, 1 MB of notes", [*synapolis_cmd(), "--state-dir", str(small), "read-notes",
                                                            "--limit", "5", "--json"]),
                 (f"`read-notes --limit 5`, {args.mb:g} MB of notes", [*synapolis_cmd(), "--state-dir", str(big),
                                                                       "read-notes", "--limit", "5", "--json"])]
        for _name, cmd in cases:  # warm-up: bytecode caches
            measure(cmd, env)
        results = {name: [] for name, _ in cases}
        for _ in range(args.runs):  # interleaved, so load on the machine hits every case alike
            for name, cmd in cases:
                results[name].append(measure(cmd, env))
    base_s = statistics.median(s for s, _ in results[cases[0][0]])
    lines = [f"## read-notes on a huge notes bus", "",
             f"Machine: {machine()}  ", f"Command: `python benchmarks/bench_read_notes.py --mb {args.mb:g} "
             f"--runs {args.runs}` (medians; each a fresh process)  ", interpreter(), "",
             "| what | median time | vs baseline | median max RSS |", "|---|---|---|---|"]
    for name, _ in cases:
        seconds = statistics.median(s for s, _ in results[name])
        rss = statistics.median(m for _, m in results[name])
        lines.append(f"| {name} | {seconds * 1000:.1f} ms | {seconds / base_s:.2f}x | {rss:.1f} MiB |")
    lines += ["", "The notes are read backwards from the end in 64 KiB blocks until 5 are found: the 200 MB "
              "bus costs what the 1 MB one does (issue 11 measured 845 MiB when every line was parsed)."]
    publish(SECTION, "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
