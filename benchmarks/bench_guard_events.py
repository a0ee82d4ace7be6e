#!/usr/bin/env python3
"""What keeping a guard refusal as a dashboard event costs the pre-tool hook that refuses (issue 32), and the page.

A refused edit used to hand the denial to the notify targets only (`notify.emit`, which returns before doing
anything when no target is configured); now `guard_events.tool_denied` first appends it to the store's event
record (SQLite: guard-events.jsonl, one short write under a lock, trimmed past 128 KiB). Measured in fresh
processes, as a hook runs, with bytecode cached: the old step against the new one, interleaved, and the whole
refusing hook (`synapolis hook claude-code`) beside `python -c pass`. Also the page's read of the newest 50
of a full record (300 events told before the runs). Target: the record adds at most 1 ms to a refusal (a tenth of `python -c pass`).

    python benchmarks/bench_guard_events.py [--runs 31]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import bench_env, bench_parser, call_ms, machine, publish, synapolis_cmd, timed

SECTION = "bench_guard_events"
TARGET_MS = 1.0

_PRE = ("import time\nfrom synapolis.workspace import Workspace\nfrom synapolis.store import store_for, clock\n"
        "ws = Workspace.open({state!r}); store_for(ws); clock(ws)\nimport json, datetime\n")
_BLOCKED = [{"path": "/p/src/api/x.py", "relative_path": "src/api/x.py", "item": "src/api/**", "claimed_by": "alice",
             "expires_at": "2030-01-01T00:00:00Z", "token": 1}]
OLD = ("t = time.perf_counter()\nfrom synapolis import notify\n"
       "notify.emit(ws, notify.GUARD_DENIED, 'src/api/x.py', {}, line='x')\nprint(time.perf_counter() - t)")
NEW = ("t = time.perf_counter()\nfrom synapolis.guard_events import tool_denied\n"
       "tool_denied(ws, 'claude-code', 'bob', {blocked!r}, 'Edit')\nprint(time.perf_counter() - t)")


def step_ms(code: str, env: dict) -> float:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return float(done.stdout.strip()) * 1000


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=31)
    args = parser.parse_args()

    from synapolis import actions, claims, guard_events
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-guard-events-"))
    try:
        project = tmp / "project"
        (project / "src" / "api").mkdir(parents=True)
        state = project / "state"
        ws = Workspace.open(state).ensure()
        actions.start(ws, agent_id="alice", env={}, write_identity=False)
        claims.claim(ws, "src/api/**", "alice", ttl_s=86400)
        for n in range(300):  # a full record (the newest 200 are what a reader gets), trimmed as it grows
            guard_events.tell(ws, guard_events.GUARD_DENIED, f"src/api/f{n}.py", {}, agent_id="bob",
                              paths=[f"src/api/f{n}.py"], holders=["alice"], via="claude-code Edit",
                              line=f"claude-code refused Edit of src/api/f{n}.py for bob: alice holds src/api/**")
        env = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(state)}
        old = _PRE.format(state=str(state)) + OLD
        new = _PRE.format(state=str(state)) + NEW.format(blocked=_BLOCKED)
        edit = json.dumps({"session_id": "bench-1", "hook_event_name": "PreToolUse", "cwd": str(project),
                           "transcript_path": str(tmp / "t.jsonl"), "permission_mode": "default", "tool_name": "Edit",
                           "tool_use_id": "t", "tool_input": {"file_path": str(project / "src/api/x.py"),
                                                              "old_string": "a", "new_string": "b"}})
        hook, baseline = synapolis_cmd() + ["hook", "claude-code"], [sys.executable, "-c", "pass"]
        for _ in range(2):  # warm-up: bytecode, page cache
            step_ms(old, env), step_ms(new, env)
            timed(hook, env, stdin=edit, expect="deny", quiet=True), timed(baseline, env)
        rows = {"old": [], "new": [], "hook": [], "base": []}
        for run in range(args.runs):
            order = [("old", lambda: step_ms(old, env)), ("new", lambda: step_ms(new, env)),
                     ("hook", lambda: timed(hook, env, stdin=edit, expect="deny", quiet=True) * 1000),
                     ("base", lambda: timed(baseline, env) * 1000)]
            for name, measure in order[run % 4:] + order[:run % 4]:
                rows[name].append(measure())
        record = state / "guard-events.jsonl"
        events = sum(1 for _ in record.open()) if record.exists() else 0
        reads = []
        for _ in range(args.runs):
            reads.append(call_ms(lambda: guard_events.recent(ws, 50)))
        kept = len(guard_events.recent(ws, 1000))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    m = {k: statistics.median(v) for k, v in rows.items()}
    added = m["new"] - m["old"]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"## Keeping the guard's refusals as events ({SECTION})", "",
             f"Machine: {machine()}; load average {load} at the end. Command: `python benchmarks/bench_guard_events.py "
             f"--runs {args.runs}` (fresh processes, interleaved in a rotating order, medians; bytecode cached; the "
             f"SQLite store; {events} lines in guard-events.jsonl at the end (trimmed past 128 KiB), the newest {kept} read back).", "",
             "| what | median |", "|---|---|",
             f"| `python -c pass` (baseline) | {m['base']:.1f} ms |",
             f"| `synapolis hook claude-code`, an Edit of a held file (refused, recorded) | {m['hook']:.1f} ms |",
             f"| the refusal's telling before: `notify.emit` (imported; no target) | {m['old']:.2f} ms |",
             f"| the refusal's telling now: `guard_events.tool_denied` (record + `notify.emit`) | {m['new']:.2f} ms |",
             f"| the page's read of the newest 50 events (in process) | {statistics.median(reads):.2f} ms |", "",
             f"Target: the record adds at most {TARGET_MS:g} ms to a refusal — "
             f"{'met' if added <= TARGET_MS else 'NOT met'} ({added:.2f} ms, {added / m['base']:.2f}x of the baseline)."]
    publish(SECTION, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
