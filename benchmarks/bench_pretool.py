#!/usr/bin/env python3
"""Wall time of the pre-tool guard hook (`synapolis hook claude-code`, PreToolUse of an Edit) with no claim
held and with 10,000 path claims held, against `python -c pass`, beside the quiet PostToolUse.

Targets (issue 28): PreToolUse with nothing held within the quiet PostToolUse's ratio to the baseline;
with 10,000 claims held at most 1.5x that ratio. Runs interleave so machine noise hits every row alike;
each row is the median of N runs. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_pretool.py [--runs 25] [--claims 10000]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_env, bench_parser, interpreter, machine, publish, ratio_table, synapolis_cmd, timed

SECTION = "bench_pretool"


def edit_event(conversation: str, project: Path, rel: str) -> str:
    return json.dumps({"session_id": conversation, "hook_event_name": "PreToolUse", "cwd": str(project),
                       "transcript_path": str(project / "t.jsonl"), "permission_mode": "default",
                       "tool_name": "Edit", "tool_use_id": "toolu_01",
                       "tool_input": {"file_path": str(project / rel), "old_string": "a", "new_string": "b"}})


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--claims", type=int, default=10_000)
    args = parser.parse_args()

    from synapolis import actions, claims
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-pretool-"))
    project = tmp / "project"
    (project / ".git").mkdir(parents=True)
    empty, full = project / "state-empty", project / "state-full"
    hook = synapolis_cmd() + ["hook", "claude-code"]
    conversation = "bench-conversation-1"
    start = json.dumps({"session_id": conversation, "hook_event_name": "SessionStart", "source": "startup",
                        "cwd": str(project), "transcript_path": str(project / "t.jsonl")})
    post = json.dumps({"session_id": conversation, "hook_event_name": "PostToolUse", "cwd": str(project),
                       "transcript_path": str(project / "t.jsonl"), "tool_name": "Bash",
                       "tool_input": {"command": "ls"}, "tool_response": {"stdout": "a\nb\n"}})
    free = edit_event(conversation, project, "src/free/module.py")
    held = edit_event(conversation, project, f"pkg/p{max(args.claims // 10 - 1, 0) // 2:04d}/mod7.py")
    try:
        env_empty = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(empty)}
        env_full = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(full)}
        # nothing held: a state directory whose only claim was released (its claims index is empty)
        ws = Workspace.open(empty).ensure()
        actions.start(ws, agent_id="alice", env={}, write_identity=False)
        claims.claim(ws, "src/free/module.py", "alice")
        claims.release(ws, "src/free/module.py", "alice")
        timed(hook, env_empty, stdin=start, quiet=True)
        # 10,000 held: alice, live, holds 1,000 folders' worth of files and patterns (9 files and one `*.md`
        # each), none of them the free file; the held file is one of them
        ws = Workspace.open(full).ensure()
        actions.start(ws, agent_id="alice", env={}, write_identity=False)
        began = time.perf_counter()
        for n in range(args.claims):
            folder, k = divmod(n, 10)
            item = f"pkg/p{folder:04d}/*.md" if k == 9 else f"pkg/p{folder:04d}/mod{k}.py"
            claims.claim(ws, item, "alice", ttl_s=86400)
        setup_s = time.perf_counter() - began
        actions.beat(Workspace.open(full), None, env={"SYNAPOLIS_AGENT_ID": "alice"})
        timed(hook, env_full, stdin=start, quiet=True)

        baseline = [sys.executable, "-c", "pass"]
        for cmd, env, stdin, expect in ((baseline, env_empty, None, ""), (hook, env_empty, post, ""),
                                        (hook, env_empty, free, ""), (hook, env_full, free, ""),
                                        (hook, env_full, held, "deny")):
            timed(cmd, env, stdin=stdin, expect=expect, quiet=True)  # warm-up: bytecode, page cache
        cases = {"base": (baseline, env_empty, None, ""), "post": (hook, env_empty, post, ""),
                 "pre0": (hook, env_empty, free, "{}"), "pre_free": (hook, env_full, free, "{}"),
                 "pre_held": (hook, env_full, held, "deny")}
        rows = {k: [] for k in cases}
        order = list(cases)
        for run in range(args.runs):
            # each run starts one case further on, so no case always follows the same other one
            for name in order[run % len(order):] + order[:run % len(order)]:
                cmd, env, stdin, expect = cases[name]
                rows[name].append(timed(cmd, env, stdin=stdin, expect=expect, quiet=True))
            actions.beat(Workspace.open(full), None, env={"SYNAPOLIS_AGENT_ID": "alice"})  # alice stays live
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    m = {k: statistics.median(v) for k, v in rows.items()}
    b = m["base"]
    quiet_ratio = m["post"] / b
    table = [
        ("`python -c pass` (baseline)", b, 1.0),
        ("PostToolUse, nothing new (the quiet path)", m["post"], quiet_ratio),
        ("PreToolUse Edit, no claim held", m["pre0"], m["pre0"] / b),
        (f"PreToolUse Edit of a free file, {args.claims:,} claims held", m["pre_free"], m["pre_free"] / b),
        (f"PreToolUse Edit of a held file, {args.claims:,} claims held (refused)", m["pre_held"], m["pre_held"] / b),
    ]
    zero_ok = m["pre0"] / b <= quiet_ratio * 1.05  # within the quiet path's ratio (5% for noise between rows)
    full_ratio = max(m["pre_free"], m["pre_held"]) / b
    full_ok = full_ratio <= 1.5 * quiet_ratio
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    lines = [f"## Pre-tool guard hook ({SECTION})", "",
             f"Machine: {machine()}; load average {load} at the end. Command: "
             f"`{Path(sys.executable).name} benchmarks/bench_pretool.py --runs {args.runs} --claims {args.claims}` "
             f"(interleaved runs in a rotating order, medians; the console script `{Path(hook[0]).name}`; the {args.claims:,} claims "
             f"took {setup_s:.0f} s to make through the library).  ",
             interpreter(), "", *ratio_table(table), "",
             f"Targets: no claim held within the quiet PostToolUse's ratio ({quiet_ratio:.2f}x) — "
             f"{'met' if zero_ok else 'NOT met'} ({m['pre0'] / b:.2f}x); {args.claims:,} claims held at most 1.5x "
             f"that ({1.5 * quiet_ratio:.2f}x) — {'met' if full_ok else 'NOT met'} ({full_ratio:.2f}x)."]
    publish(SECTION, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
