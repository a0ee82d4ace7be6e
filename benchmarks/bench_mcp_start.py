#!/usr/bin/env python3
"""`synapolis mcp` start-up: spawn to the answer of `initialize`, and to the answer of `tools/list`, against
`python -c pass`, quiet and under a two-process CPU load (issue 29).

Targets: the `initialize` answer at most 6x `python -c pass` (spawn to exit), the `tools/list` answer at most
8x. The client writes `initialize` the moment the process is spawned (what a harness does), then
`notifications/initialized` and `tools/list` as soon as the first answer is in. For comparison, the same
server with the SDK answering everything (`create_server(...).run("stdio")`, what `synapolis mcp` was before
its front), and `python -c pass` itself. The sides interleave, run by run; the loaded rounds run while two
`python -c "while True: pass"` processes keep both CPUs busy. Medians of wall time. Writes its section of
benchmarks/RESULTS.md.

    python benchmarks/bench_mcp_start.py [--runs 15] [--no-write]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_env, bench_parser, interpreter, machine, publish, synapolis_cmd

SECTION = "bench_mcp_start"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "bench", "version": "0"}}}


def _line(proc) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"{proc.args} closed its output: {proc.stderr.read().decode()[-500:]}")
    return json.loads(line)


def handshake(cmd: list[str], env: dict) -> tuple[float, float]:
    """(seconds to the initialize answer, seconds to the tools/list answer) from the spawn of `cmd`."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        proc.stdin.flush()
        answer = _line(proc)
        initialized = time.perf_counter() - started
        assert answer["id"] == 1 and "serverInfo" in answer["result"], answer
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                         b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n')
        proc.stdin.flush()
        answer = _line(proc)
        listed = time.perf_counter() - started
        assert answer["id"] == 2 and len(answer["result"]["tools"]) >= 10, answer
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    return initialized, listed


def bare(env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - started


def measure(runs: int, state: Path, env: dict) -> dict:
    ours = [*synapolis_cmd(), "--state-dir", str(state), "mcp"]
    sdk_only = [sys.executable, "-c", "import sys; from synapolis.mcp.server import create_server; "
                "create_server(sys.argv[1]).run('stdio')", str(state)]
    seen = {"pass": [], "ours": [], "sdk": []}
    for _ in range(runs):
        seen["pass"].append(bare(env))
        seen["ours"].append(handshake(ours, env))
        seen["sdk"].append(handshake(sdk_only, env))
    base = statistics.median(seen["pass"])
    rows = {"base": base}
    for side in ("ours", "sdk"):
        rows[side] = tuple(statistics.median(t[i] for t in seen[side]) for i in (0, 1))
    return rows


def loaded(runs: int, state: Path, env: dict) -> dict:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        return measure(runs, state, env)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def table(title: str, rows: dict) -> list[str]:
    base = rows["base"]
    out = [f"### {title}", "", "| what | median | vs `python -c pass` |", "|---|---|---|",
           f"| `python -c pass` (spawn to exit; the baseline) | {base * 1000:.1f} ms | 1.00x |"]
    for side, name in (("ours", "`synapolis mcp`"), ("sdk", "the SDK answering everything (before the front)")):
        init, listed = rows[side]
        out.append(f"| {name}: spawn to the `initialize` answer | {init * 1000:.1f} ms | {init / base:.2f}x |")
        out.append(f"| {name}: spawn to the `tools/list` answer | {listed * 1000:.1f} ms | {listed / base:.2f}x |")
    return out + [""]


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mcp-start-"))
    state = tmp / "state"
    env = bench_env(tmp)
    handshake([*synapolis_cmd(), "--state-dir", str(state), "mcp"], env)  # warm-up: bytecode compiled
    load_before = os.getloadavg()[0]
    quiet = measure(args.runs, state, env)
    busy = loaded(args.runs, state, env)
    verdicts = []
    for label, rows in (("quiet", quiet), ("loaded", busy)):
        init, listed = (t / rows["base"] for t in rows["ours"])
        verdicts.append(f"{label}: initialize {init:.2f}x ({'met' if init <= 6 else 'NOT met'}), "
                        f"tools/list {listed:.2f}x ({'met' if listed <= 8 else 'NOT met'})")
    lines = [
        "## `synapolis mcp` start-up: spawn to the first answers (bench_mcp_start.py)",
        "",
        f"Machine: {machine()} · load average {load_before:.1f} before the runs  ",
        f"Command: `python benchmarks/bench_mcp_start.py --runs {args.runs}` ({args.runs} interleaved runs a side "
        "and round, medians of wall time; loaded: two `python -c \"while True: pass\"` beside them)  ",
        interpreter(),
        "",
        *table("Quiet (no load added by the benchmark; the machine's own load is the line above)", quiet),
        *table("Under a two-process CPU load", busy),
        "Targets: `initialize` at most 6x `python -c pass`, `tools/list` at most 8x — " + "; ".join(verdicts) + ".",
    ]
    publish(SECTION, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
