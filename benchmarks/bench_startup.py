#!/usr/bin/env python3
"""Start-up of the agent verbs and the hook against `python -c pass`, measured in the same run (issue 15).

Targets: `beat`, `signal` and the other agent verbs at most 3x `python -c pass` (the moonshot: 2x), the
hook at most 2x. `python -c "import click"` is shown for scale (what click alone costs). Every verb is
its plain form, which the console script runs without click (synapolis.cli.fast); `beat --help` goes
through click. Runs interleave so machine noise hits every side alike; medians. Writes its section of
benchmarks/RESULTS.md.

    python benchmarks/bench_startup.py [--runs 21] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import bench_env, interpreter, machine, publish, ratio_table, synapolis_cmd, timed

SECTION = "bench_startup"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from synapolis import actions
    from synapolis.harness.hooks import agent_id_for
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    state = tmp / "state"
    state.mkdir(parents=True)
    (state / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 10 ** 6}), "utf-8")
    ws = Workspace.open(state)
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, write_identity=False)
    env = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(state), "SYNAPOLIS_SESSION_ID": sid}
    cli = synapolis_cmd()
    conversation = "bench-startup-conversation"
    event = lambda name, **more: json.dumps({"session_id": conversation, "hook_event_name": name,  # noqa: E731
                                             "cwd": str(tmp), **more})
    tool_event = event("PostToolUse", tool_name="Bash", tool_input={"command": "ls"})
    sides = {
        "`python -c pass` (baseline)": ([sys.executable, "-c", "pass"], None),
        "`python -c \"import click\"` (for scale)": ([sys.executable, "-c", "import click"], None),
        "`synapolis beat`": ([*cli, "beat", "--agent-id", "bob", "--task", "bench"], None),
        "`synapolis signal`": ([*cli, "signal", "alice", "hello", "--agent-id", "bob"], None),
        "`synapolis read-signals`": ([*cli, "read-signals", "--agent-id", "alice", "--limit", "5"], None),
        "`synapolis signals-pending`": ([*cli, "signals-pending", "--agent-id", "alice"], None),
        "`synapolis ack-signals --all`": ([*cli, "ack-signals", "--all", "--agent-id", "alice"], None),
        "`synapolis note`": ([*cli, "note", "bench note", "--agent-id", "bob"], None),
        "`synapolis hook claude-code` PostToolUse": ([*cli, "hook", "claude-code"], tool_event),
        "`synapolis beat --help` (click)": ([*cli, "beat", "--help"], None),
    }
    times = {name: [] for name in sides}
    try:
        timed([*cli, "hook", "claude-code"], env, stdin=event("SessionStart", source="startup"), quiet=True)
        agent_id_for("claude-code", conversation, env={})
        for name, (cmd, stdin) in sides.items():  # warm-up: bytecode caches, page cache
            timed(cmd, env, stdin=stdin)
        for _ in range(args.runs):
            for name, (cmd, stdin) in sides.items():
                times[name].append(timed(cmd, env, stdin=stdin))
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(times[next(iter(sides))])
    rows = [(name, statistics.median(t), statistics.median(t) / base) for name, t in times.items()]
    verbs = [r for r in rows if r[0].startswith("`synapolis") and "hook" not in r[0] and "help" not in r[0]]
    hook = [r for r in rows if "hook" in r[0]][0]
    worst = max(r[2] for r in verbs)
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    text = "\n".join([
        "## Start-up against `python -c pass` (bench_startup.py)", "",
        f"Machine: {machine()} · load average {load:.1f} at the end  ",
        f"Command: `python benchmarks/bench_startup.py --runs {args.runs}` ({args.runs} interleaved runs each, "
        f"median wall time of a subprocess; the `{Path(cli[0]).name}` console script)  ",
        interpreter(), "", *ratio_table(rows), "",
        f"Targets: agent verbs at most 3x the baseline — worst {worst:.2f}x, {met(worst <= 3)} (moonshot 2x: "
        f"{met(worst <= 2)}); the hook at most 2x — {hook[2]:.2f}x, {met(hook[2] <= 2)}.",
    ])
    publish(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
