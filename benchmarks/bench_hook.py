#!/usr/bin/env python3
"""Wall time of the harness hook path (`synapolis hook claude-code`) against `python -c "import click"`.

Target (issue 7): the hook at most 1.5x the baseline. Runs interleave so machine noise hits both
sides alike; each measured the median of N runs. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_hook.py [--runs 25]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import bench_env, bench_parser, interpreter, machine, publish, ratio_table, synapolis_cmd, timed

SECTION = "bench_hook"


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=25)
    args = parser.parse_args()

    from synapolis import actions
    from synapolis.harness.hooks import agent_id_for
    from synapolis.identity import Who
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-hook-"))
    state = tmp / "state"
    env = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(state)}
    hook = synapolis_cmd() + ["hook", "claude-code"]
    conversation = "bench-conversation-1"
    start_event = json.dumps({"session_id": conversation, "hook_event_name": "SessionStart", "source": "startup",
                              "cwd": str(tmp), "transcript_path": str(tmp / "t.jsonl")})
    tool_event = json.dumps({"session_id": conversation, "hook_event_name": "PostToolUse", "cwd": str(tmp),
                             "transcript_path": str(tmp / "t.jsonl"), "tool_name": "Bash",
                             "tool_input": {"command": "ls"}, "tool_response": {"stdout": "a\nb\n"}})
    state.mkdir(parents=True)
    # one sender beats the default rate limit of 10 a minute here
    (state / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 100000}), "utf-8")
    try:
        timed(hook, env, stdin=start_event, quiet=True)
        ws = Workspace.open(state)
        me = agent_id_for("claude-code", conversation, env={})
        actions.start(ws, agent_id="bench-sender", env={}, write_identity=False)
        timed(hook, env, stdin=tool_event, quiet=True)  # warm-up: bytecode written, page cache warm
        timed([sys.executable, "-c", "import click"], env, quiet=True)  # the same for the baseline
        baseline, quiet, with_signal = [], [], []
        for i in range(args.runs):
            baseline.append(timed([sys.executable, "-c", "import click"], env, quiet=True))
            quiet.append(timed(hook, env, stdin=tool_event, quiet=True))
            actions.signal(ws, Who("bench-sender"), me, f"benchmark signal {i}", env={})
            with_signal.append(timed(hook, env, stdin=tool_event, expect=f"benchmark signal {i}", quiet=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    b, q, s = (statistics.median(x) for x in (baseline, quiet, with_signal))
    rows = [
        ("`python -c \"import click\"` (baseline)", b, 1.0),
        ("`synapolis hook claude-code` PostToolUse, nothing pending", q, q / b),
        ("`synapolis hook claude-code` PostToolUse, one signal delivered", s, s / b),
    ]
    verdict = "met" if max(q, s) / b <= 1.5 else "NOT met"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    lines = [f"## Hook path ({SECTION})", "",
             f"Machine: {machine()}; load average {load} at the end. Command: "
             f"`{Path(sys.executable).name} benchmarks/bench_hook.py --runs {args.runs}` (interleaved runs, "
             f"medians; the console script `{Path(hook[0]).name}`).  ",
             interpreter(), "", *ratio_table(rows)]
    lines += ["", f"Target: at most 1.5x the baseline — {verdict}."]
    text = "\n".join(lines)
    publish(SECTION, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
