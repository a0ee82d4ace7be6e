#!/usr/bin/env python3
"""A send (and a note) with an idempotency key against the same without one, in one run (issue 30; target <= 1.1x).

The whole verb in-process (`actions.signal`, `actions.note`: identity, the heartbeat refresh, the write
transaction, the piggyback), keyed and plain calls alternating in blocks so that both sides meet the same
machine, on SQLite and, given a URL (`--pg-url`, default $SYNAPOLIS_TEST_PG_URL), on PostgreSQL. A keyed call
pays one INSERT into idempotency_keys in its transaction; the lookup runs only on a retry.

    python benchmarks/bench_retries.py [--calls 600] [--block 50] [--pg-url URL] [--no-write]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from _common import bench_parser, interpreter, machine, publish

from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace

SECTION = "bench_retries"


def _workspace(root: Path, store: str) -> Workspace:
    ws = Workspace.open(root).ensure()
    doc = json.loads(ws.paths.config.read_text())
    doc.update(rate_limit_per_min=10 ** 6, store=store)
    ws.paths.config.write_text(json.dumps(doc))
    return Workspace.open(root)


def measure(ws, calls: int, block: int) -> dict:
    """Median microseconds per call of each kind, keyed and plain alternating in blocks of `block`."""
    sid = actions.start(ws, agent_id="sender", session_id=f"bench_{uuid.uuid4().hex[:8]}", env={})["session_id"]
    actions.start(ws, agent_id="sink", session_id=sid, env={})
    who = Who("sender", sid)
    kinds = {
        "signal": lambda i, key: actions.signal(ws, who, "sink", f"payload {i}", env={}, piggyback=False,
                                                idempotency_key=key),
        "note": lambda i, key: actions.note(ws, who, f"note {i}", env={}, piggyback=False, idempotency_key=key),
    }
    out = {}
    for name, call in kinds.items():
        for i in range(20):  # warm-up: connections, prepared statements, caches
            call(i, None)
            call(i, f"warm-{name}-{i}")
        times = {"plain": [], "keyed": []}
        n = 0
        while n < calls:
            for side in ("plain", "keyed") if (n // block) % 2 == 0 else ("keyed", "plain"):
                for j in range(block):
                    key = f"{name}-{n + j}" if side == "keyed" else None
                    began = time.perf_counter()
                    call(n + j, key)
                    times[side].append(time.perf_counter() - began)
            n += block
        plain, keyed = statistics.median(times["plain"]), statistics.median(times["keyed"])
        out[name] = (plain * 1e6, keyed * 1e6, keyed / plain)
    return out


class throwaway_database:
    """`with throwaway_database(url) as url2:` a new database on the server of `url`, dropped afterwards: the
    benchmark's schema and rows never touch the database it was pointed at."""

    def __init__(self, url: str):
        self.url, self.name = url, f"bench_retries_{uuid.uuid4().hex[:12]}"

    def __enter__(self) -> str:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.name}")
        parts = conninfo_to_dict(self.url)
        parts["dbname"] = self.name
        from urllib.parse import quote

        return (f"postgresql://{quote(parts.get('user') or '', safe='')}:{quote(parts.get('password') or '', safe='')}"
                f"@{parts.get('host') or '127.0.0.1'}:{parts.get('port') or 5432}/{self.name}")

    def __exit__(self, *exc) -> None:
        import psycopg

        from synapolis.store import close_all

        close_all()
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=600, help="calls of each side and kind")
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--pg-url", default=os.environ.get("SYNAPOLIS_TEST_PG_URL"))
    args = parser.parse_args()
    stores = [("SQLite", "sqlite")] + ([("PostgreSQL", args.pg_url)] if args.pg_url else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, url in stores:
            if url == "sqlite":
                found = measure(_workspace(Path(tmp) / label, url), args.calls, args.block)
            else:
                with throwaway_database(url) as fresh:
                    found = measure(_workspace(Path(tmp) / label, fresh), args.calls, args.block)
            for kind, (plain, keyed, ratio) in found.items():
                rows.append(f"| {label} | `{kind}` | {plain:.0f} µs | {keyed:.0f} µs | {ratio:.2f}x |")
    text = "\n".join([
        f"## {SECTION}: a send with an idempotency key against one without (issue 30)", "",
        f"Machine: {machine()}. {interpreter()}.",
        f"Command: `python benchmarks/bench_retries.py --calls {args.calls} --block {args.block}`"
        + (" (PostgreSQL: a throwaway database on the test server of scripts/synapolis-test-postgres, on this machine)" if args.pg_url else "")
        + ". Whole verbs in-process, piggyback off, keyed and plain calls alternating in blocks; medians. "
          "Target: keyed <= 1.1x plain.", "",
        "| store | verb | plain | with a key | keyed / plain |", "|---|---|---|---|---|", *rows, ""])
    publish(SECTION, text, write=not args.no_write)


if __name__ == "__main__":
    main()
