#!/usr/bin/env python3
"""The guard and path claims with many claims held (contract §14): `guard` of 100 paths, and a path claim, with
10,000 pattern claims held against none, in the same run.

A project (a folder with `.git`) whose state directory holds `--claims` path claims of 50 live agents: literal
files (`pkg17/mod3.py`), folders (`pkg17/sub3/**`), globs (`pkg17/*.txt`) and 20 patterns with no literal
prefix (`**/*.gen7`, which every path must be matched against). The claims are written as `claims.claim` writes
them (a record per item and the index, state/claims-index.json), without running 10,000 claims one by one.
Measured, each the median of `--runs`:
- `guard.guard` of 100 paths (some held by others), in process, each run with no pattern compiled yet (a hook is
  a new process): what a hook calls;
- `synapolis guard` of the same 100 paths as a process, against `python -c pass`;
- `claims.claim` of a new path pattern plus its release (the overlap check, the index kept), and of a name.
Target: guard of 100 paths against 10,000 claims under 50 ms. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_guard.py [--claims 10000] [--runs 15] [--no-write]
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_env, bench_parser, call_ms, machine, publish, synapolis_cmd, timed

SECTION = "bench_guard"
AGENTS = [f"agent{i:02d}" for i in range(50)]


def items_for(count: int) -> list[str]:
    out = [f"**/*.gen{k}" for k in range(20)]
    i = 0
    while len(out) < count:
        pkg, kind = i // 3, i % 3
        out.append((f"pkg{pkg}/mod{i}.py", f"pkg{pkg}/sub{i}/**", f"pkg{pkg}/*.t{i}")[kind])
        i += 1
    return out[:count]


def build(root: Path, count: int):
    """A project at `root` whose state holds `count` path claims of live agents."""
    from synapolis import claims
    from synapolis.atomic import atomic_write_json
    from synapolis.claim_index import INDEX_FILE, index_prefix
    from synapolis.heartbeat import write_heartbeat
    from synapolis.workspace import Workspace

    (root / ".git").mkdir(parents=True)
    ws = Workspace.open(root / "state").ensure()
    for agent in AGENTS + ["caller"]:
        write_heartbeat(ws.paths, agent, ttl_s=86400)
    items = items_for(count)
    if items:
        template = dict(claims.claim(ws, items[0], AGENTS[0], ttl_s=86400))
        index = {items[0]: index_prefix(items[0])}
        for n, item in enumerate(items[1:], 1):
            record = dict(template, item=item, claimed_by=AGENTS[n % len(AGENTS)], transitions=[])
            atomic_write_json(claims.claim_path(ws, item), record, durable=False)
            index[item] = index_prefix(item)
        atomic_write_json(ws.root / INDEX_FILE, {"schema_version": 1, "items": index})
    return ws


def paths_for(count: int) -> list[str]:
    rng = random.Random(7)
    held_pkgs = max(1, count // 3)
    out = []
    for k in range(100):
        pkg = rng.randrange(held_pkgs) if held_pkgs > 1 else 0
        out.append(rng.choice([f"pkg{pkg}/mod{rng.randrange(count or 1)}.py", f"pkg{pkg}/sub{k}/deep/file.py",
                               f"free{k}/x.py", f"pkg{pkg}/readme.t{k}", f"docs/page{k}.gen{k % 30}"]))
    return out


class Sampler:
    """One workspace's measurements, one sample of each per `once()`: main() alternates the workspaces run by
    run, so the machine's noise (two CPUs shared) falls on both alike."""

    def __init__(self, ws, tmp: Path):
        self.ws = ws
        self.paths = paths_for(sum(1 for _ in os.scandir(ws.paths.claims)))
        self.env = bench_env(tmp)
        self.cmd = synapolis_cmd() + ["--state-dir", str(ws.root), "guard", "--agent-id", "caller", "--json",
                                      *self.paths]
        subprocess.run(self.cmd, capture_output=True, env=self.env)  # warm-up: compile the bytecode
        self.samples: dict[str, list[float]] = {"guard": [], "cli": [], "claim": [], "name": []}
        self.blocked = 0
        self.n = 0

    def once(self) -> None:
        from synapolis import claims, pathpatterns
        from synapolis.guard import guard
        from synapolis.identity import Who

        ws, n = self.ws, self.n
        self.n += 1
        answers = []

        def cold_guard():
            pathpatterns._REGEX.clear()  # a hook is a new process: no pattern compiled yet
            pathpatterns._COMPILED.clear()
            answers.append(guard(ws, Who("caller"), self.paths))
        self.samples["guard"].append(call_ms(cold_guard))
        self.blocked = len({b["path"] for b in answers[-1]["blocked"]})
        item = f"newpkg{n}/*.py"
        self.samples["claim"].append(call_ms(lambda: claims.claim(ws, item, "caller")))
        claims.release(ws, item, "caller")
        self.samples["name"].append(call_ms(lambda: claims.claim(ws, f"ticket:{n}", "caller")))
        claims.release(ws, f"ticket:{n}", "caller")
        began = time.perf_counter()
        done = subprocess.run(self.cmd, capture_output=True, text=True, env=self.env)
        self.samples["cli"].append((time.perf_counter() - began) * 1000)
        if done.returncode not in (0, 3) or "allowed" not in done.stdout:
            raise SystemExit(f"synapolis guard failed: {done.stderr}")

    def median(self, what: str) -> float:
        return statistics.median(self.samples[what])


def python_pass_ms(runs: int, env: dict) -> float:
    return statistics.median(timed([sys.executable, "-c", "pass"], env) * 1000 for _ in range(runs))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        began = time.perf_counter()
        many = build(tmp / "many", args.claims)
        none = build(tmp / "none", 0)
        built_s = time.perf_counter() - began
        base, full = Sampler(none, tmp), Sampler(many, tmp)
        for _ in range(args.runs):
            base.once()
            full.once()
        floor = python_pass_ms(max(5, args.runs // 2), bench_env(tmp))
    rows = [(what, base.median(key), full.median(key)) for what, key in (
        ("`guard.guard` of 100 paths, in process (cold pattern cache)", "guard"),
        ("`synapolis guard` of 100 paths, a process", "cli"),
        ("`claims.claim` of a new path pattern + release (overlap check, index kept)", "claim"),
        ("`claims.claim` of a name (`ticket:N`)", "name"))]
    guard_ms = full.median("guard")
    verdict = "met" if guard_ms < 50 else "NOT met"
    lines = [
        f"**bench_guard** ({machine()}): `python benchmarks/bench_guard.py --claims {args.claims} --runs {args.runs}`; "
        f"{args.claims:,} path claims of {len(AGENTS)} live agents (set up in {built_s:.1f} s), medians, "
        "the two cases alternating run by run.",
        "",
        f"| what | no claims | {args.claims:,} claims | ratio |",
        "|---|---|---|---|",
    ] + [f"| {what} | {a:.1f} ms | {b:.1f} ms | {b / a:.2f}x |" for what, a, b in rows] + [
        "",
        f"Of the 100 paths, {full.blocked} were blocked. `python -c pass` took {floor:.1f} ms in the same run. "
        f"Target (guard of 100 paths against {args.claims:,} claims under 50 ms): {verdict} "
        f"({guard_ms:.1f} ms).",
    ]
    publish(SECTION, "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
