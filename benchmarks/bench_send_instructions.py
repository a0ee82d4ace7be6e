#!/usr/bin/env python3
"""`signals.send` against a raw insert into the same table (issue 31's send row), counted in instructions: the
same in-process loop bench_flat.py times, run under callgrind with N operations and with none, so the difference
is N operations' user-space instructions (the machine's load and state do not move it; the kernel's share, the
commit's write, is not counted, on either side).

    python benchmarks/bench_send_instructions.py [--ops 1000]     (needs valgrind)
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path


def child(mode: str, count: int) -> None:
    """The measured process: a session of two agents, 50 of each operation to warm up, then `count` of `mode`."""
    from synapolis import actions, signals
    from synapolis.sessions import ts
    from synapolis.store import clock, open_session
    from synapolis.timeutil import utcnow
    from synapolis.workspace import Workspace

    root = Path(tempfile.mkdtemp(prefix="bench-send-instr-")) / "state"
    ws = Workspace.open(root).ensure()
    doc = json.loads(ws.paths.config.read_text())
    doc["rate_limit_per_min"] = 10 ** 6
    ws.paths.config.write_text(json.dumps(doc))
    ws = Workspace.open(root)
    sid = actions.start(ws, agent_id="sender", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="sink", session_id=sid, env={}, write_identity=False)
    store = open_session(ws, sid)
    raw = sqlite3.connect(ws.files.session_db(sid), isolation_level=None)
    raw.execute("PRAGMA synchronous = NORMAL")

    def send(i):
        with store.write() as tx:
            signals.send(tx, caller="sender", recipient="sink", content=f"send {i}", now=clock(ws), config=ws.config)

    def raw_insert(i):  # as bench_flat's: an id spread as a SHA-256's, like every signal's
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO signals (id, timestamp, sender, recipient, type, content, lamport, reply_to) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (hashlib.sha256(b"raw %d" % i).hexdigest(), ts(utcnow()),
                                                        "sender", "sink", "inform", f"raw {i}", i, None))
        raw.execute("COMMIT")

    for i in range(50):
        send(-i - 1)
        raw_insert(10 ** 8 + i)
    run = send if mode == "send" else raw_insert
    for i in range(count):
        run(i)


def instructions(mode: str, count: int) -> int:
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           __file__, "--child", mode, str(count)], capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(f"valgrind failed ({done.returncode}): {done.stderr[-300:]}")
    return int(found.group(1))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1000)
    args = parser.parse_args()
    per = {mode: (instructions(mode, args.ops) - instructions(mode, 0)) / args.ops for mode in ("send", "raw")}
    print(f"signals.send: {per['send'] / 1000:.1f} K instructions; raw insert: {per['raw'] / 1000:.1f} K; "
          f"{per['send'] / per['raw']:.2f}x (target <= 2.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
