#!/usr/bin/env python3
"""Start-up of the agent verbs and the hook against `python -c pass`, measured in the same run (issue 15).

Targets: `beat`, `signal` and the other agent verbs at most 3x `python -c pass` (the moonshot: 2x), the
hook at most 2x. `python -c "import click"` is shown for scale (what click alone costs), and
`python -c "import json, sqlite3"` for the floor every store verb stands on. Every verb is its plain
form, which the console script runs without click (synapolis.cli.fast); `beat --help` goes through
click. The claim verbs do real work every run: `claim` takes an item the previous round's `release`
freed (a new fencing token), a second `claim` renews an item its agent holds, `claim-check` checks that
lease's token. The hook runs twice: in a state directory where nothing is sent (its quiet path: no store opened,
harness.quiet) and in the one where `signal` sends every round (the full path). Runs interleave so
machine noise hits every side alike; medians of wall time, and of CPU time (user + system), which the
machine's load disturbs less. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_startup.py [--runs 21] [--label NAME] [--no-write] [--instructions]

`--label wheel` (say) keeps a second section beside the first: the same script run by another
interpreter, e.g. a virtualenv with a non-editable install or another Python version.
`--instructions` counts the instructions each side executes under valgrind (callgrind; the median of three
runs) instead of timing it: the same count on a loaded machine as on a quiet one, so a change of a few hundred
microseconds shows even while other processes share the CPUs (section bench_startup_instructions).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import bench_env, bench_parser, callgrind_count, interpreter, machine, publish, synapolis_cmd, timed

SECTION = "bench_startup"
INSTRUCTION_RUNS = 3


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--label", default="", help="a second section (bench_startup_LABEL) for another interpreter")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind (callgrind), three runs a side, instead of timing")
    args = parser.parse_args()
    if args.instructions and not shutil.which("valgrind"):
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")

    from synapolis import actions
    from synapolis.harness.hooks import agent_id_for
    from synapolis.identity import Who
    from synapolis.workspace import Workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    state, calm = tmp / "state", tmp / "calm"
    for folder in (state, calm):
        folder.mkdir(parents=True)
        (folder / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 10 ** 6}), "utf-8")
    ws = Workspace.open(state)
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, write_identity=False)
    actions.start(Workspace.open(calm), agent_id="alice", env={}, write_identity=False)
    # the claim rows run in this order every round, each doing real work and exiting 0: bob claims
    # bench:taken (released the round before: a new token), renews bench:held (his since here; same token),
    # checks its token, releases bench:taken
    held_token = actions.claim(ws, Who("bob", sid), "bench:held", env={})["claim"]["token"]
    env = {**bench_env(tmp), "SYNAPOLIS_STATE_DIR": str(state), "SYNAPOLIS_SESSION_ID": sid}
    cli = synapolis_cmd()
    conversation = "bench-startup-conversation"
    event = lambda name, **more: json.dumps({"session_id": conversation, "hook_event_name": name,  # noqa: E731
                                             "cwd": str(tmp), **more})
    tool_event = event("PostToolUse", tool_name="Bash", tool_input={"command": "ls"})
    sides = {
        "`python -c pass` (baseline)": ([sys.executable, "-c", "pass"], None),
        "`python -c \"import click\"` (for scale)": ([sys.executable, "-c", "import click"], None),
        "`python -c \"import json, sqlite3\"` (the floor of a store verb)": (
            [sys.executable, "-c", "import json, sqlite3"], None),
        "`synapolis beat`": ([*cli, "beat", "--agent-id", "bob", "--task", "bench"], None),
        "`synapolis signal`": ([*cli, "signal", "alice", "hello", "--agent-id", "bob"], None),
        "`synapolis read-signals`": ([*cli, "read-signals", "--agent-id", "alice", "--limit", "5"], None),
        "`synapolis signals-pending`": ([*cli, "signals-pending", "--agent-id", "alice"], None),
        "`synapolis ack-signals --all`": ([*cli, "ack-signals", "--all", "--agent-id", "alice"], None),
        "`synapolis note`": ([*cli, "note", "bench note", "--agent-id", "bob"], None),
        "`synapolis claim` (a released item: a new token)": ([*cli, "claim", "bench:taken", "--agent-id", "bob"], None),
        "`synapolis claim` by its holder (a renewal)": ([*cli, "claim", "bench:held", "--agent-id", "bob"], None),
        "`synapolis claim-check`": ([*cli, "claim-check", "bench:held", "--token", str(held_token)], None),
        "`synapolis release`": ([*cli, "release", "bench:taken", "--agent-id", "bob"], None),
        "`synapolis hook claude-code` PostToolUse, nothing new (quiet path)": (
            [*cli, "--state-dir", str(calm), "hook", "claude-code"], tool_event),
        "`synapolis hook claude-code` PostToolUse after a send in the session (full path)": (
            [*cli, "hook", "claude-code"], tool_event),
        "`synapolis beat --help` (click)": ([*cli, "beat", "--help"], None),
    }
    times = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    try:
        for folder in (state, calm):
            timed([*cli, "--state-dir", str(folder), "hook", "claude-code"], env,
                  stdin=event("SessionStart", source="startup"), quiet=True)
        agent_id_for("claude-code", conversation, env={})
        for name, (cmd, stdin) in sides.items():  # warm-up: bytecode caches, page cache
            timed(cmd, env, stdin=stdin)
        load_before = os.getloadavg()[0]
        if args.instructions:
            counts = {name: [] for name in sides}
            for _ in range(INSTRUCTION_RUNS):  # a median: a run can fall on a checkpoint of the session's WAL
                for name, (cmd, stdin) in sides.items():
                    counts[name].append(instructions(cmd, env, stdin,
                                                     quiet_state=calm if "quiet path" in name else None))
            counts = {name: statistics.median(found) for name, found in counts.items()}
            return publish_instructions(counts, cli, args, load_before)
        for _ in range(args.runs):
            for name, (cmd, stdin) in sides.items():
                spent = resource.getrusage(resource.RUSAGE_CHILDREN)
                times[name].append(timed(cmd, env, stdin=stdin))
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(after.ru_utime - spent.ru_utime + after.ru_stime - spent.ru_stime)
        load = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    first = next(iter(sides))
    base, base_cpu = statistics.median(times[first]), statistics.median(cpu[first])
    rows = [(name, statistics.median(times[name]), statistics.median(times[name]) / base,
             statistics.median(cpu[name]), statistics.median(cpu[name]) / base_cpu) for name in sides]
    verbs = [r for r in rows if r[0].startswith("`synapolis") and "hook" not in r[0] and "help" not in r[0]]
    quiet_hook, full_hook = [r for r in rows if "hook" in r[0]]
    worst = max(r[2] for r in verbs)
    worst_cpu = max(r[4] for r in verbs)
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    text = "\n".join([
        f"## Start-up against `python -c pass` (bench_startup.py{', ' + args.label if args.label else ''})", "",
        f"Machine: {machine()} · load average {load_before:.1f} before the runs, {load:.1f} at the end  ",
        f"Command: `python benchmarks/bench_startup.py --runs {args.runs}{' --label ' + args.label if args.label else ''}` "
        f"({args.runs} interleaved runs each, "
        f"medians of a subprocess's wall time and CPU time; the `{Path(cli[0]).name}` console script)  ",
        interpreter(), "",
        "| what | median wall | vs baseline | median CPU | vs baseline |", "|---|---|---|---|---|",
        *[f"| {name} | {wall * 1000:.1f} ms | {ratio:.2f}x | {spent * 1000:.1f} ms | {cpu_ratio:.2f}x |"
          for name, wall, ratio, spent, cpu_ratio in rows], "",
        f"Targets (wall): agent verbs at most 3x the baseline — worst {worst:.2f}x, {met(worst <= 3)} (moonshot "
        f"2x: {met(worst <= 2)}; by CPU time, worst {worst_cpu:.2f}x); the hook at most 2x — with nothing new "
        f"{quiet_hook[2]:.2f}x, {met(quiet_hook[2] <= 2)} (CPU {quiet_hook[4]:.2f}x); after a send, the full "
        f"path, {full_hook[2]:.2f}x (CPU {full_hook[4]:.2f}x).",
    ])
    publish(SECTION + (f"_{args.label}" if args.label else ""), text, write=not args.no_write)
    return 0


def instructions(cmd: list[str], env: dict, stdin: str | None, quiet_state: Path | None = None) -> float:
    """Millions of instructions one run of `cmd` executes (callgrind's count; the run must succeed). With
    `quiet_state`, the hook's quiet path is checked to be the one measured: a full path (the quiet memory
    older than its window after slow runs) rewrites the memory's time, so it is refreshed first and must
    not move."""
    def memory_at():
        hooks = quiet_state / "hooks"
        return sorted(json.loads((hooks / n).read_text("utf-8")).get("quiet", {}).get("at", 0)
                      for n in os.listdir(hooks) if n.endswith(".json"))

    if quiet_state is not None:
        for document in (quiet_state / "hooks").glob("*.json"):  # forget the memory: the next call refreshes it
            state = json.loads(document.read_text("utf-8"))
            state.pop("quiet", None)
            document.write_text(json.dumps(state), "utf-8")
        timed(cmd, env, stdin=stdin)
        before = memory_at()
    count = callgrind_count(cmd, env, stdin)
    if quiet_state is not None and memory_at() != before:
        raise SystemExit("the quiet hook took the full path under valgrind; nothing measured")
    return count / 1e6


def publish_instructions(counts: dict, cli: list[str], args, load: float) -> int:
    first = next(iter(counts))
    rows = [(name, n, n / counts[first]) for name, n in counts.items()]
    verbs = [r for r in rows if r[0].startswith("`synapolis") and "hook" not in r[0] and "help" not in r[0]]
    quiet_hook, full_hook = [r for r in rows if "hook" in r[0]]
    worst = max(r[2] for r in verbs)
    text = "\n".join([
        "## Start-up against `python -c pass`, in instructions (bench_startup.py --instructions)", "",
        f"Machine: {machine()} · load average {load:.1f} (instruction counts do not depend on it)  ",
        f"Command: `python benchmarks/bench_startup.py --instructions` (the median of {INSTRUCTION_RUNS} interleaved "
        f"runs a side under `valgrind --tool=callgrind`, user-space instructions; the `{Path(cli[0]).name}` "
        "console script)  ",
        interpreter(), "",
        "| what | instructions | vs baseline |", "|---|---|---|",
        *[f"| {name} | {n:.1f} M | {ratio:.2f}x |" for name, n, ratio in rows], "",
        f"Worst agent verb {worst:.2f}x; the quiet hook {quiet_hook[2]:.2f}x; the full hook path {full_hook[2]:.2f}x. "
        "The kernel's share (exec, page faults, fsync) is not counted: it weighs on both sides of a wall-time "
        "ratio, so these ratios run higher than the wall-time ones above.",
    ])
    publish(SECTION + "_instructions", text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
