#!/usr/bin/env python3
"""`signals.send` against a raw insert into the same table (issue 31's send row), counted in instructions: the
same in-process loop bench_flat.py times, run under callgrind with N operations and with none, so the difference
is N operations' user-space instructions (the machine's load and state do not move it; the kernel's share, the
commit's write, is not counted, on either side).

    python benchmarks/bench_send_instructions.py [--ops 1000]     (needs valgrind)
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path

from _common import bench_parser, callgrind_count


def child(mode: str, count: int) -> None:
    """The measured process: a session of two agents, 50 of each operation to warm up, then `count` of `mode`."""
    from bench_flat import signal_like_id, workspace

    from synapolis import actions, signals
    from synapolis.sessions import ts
    from synapolis.store import clock, open_session
    from synapolis.timeutil import utcnow

    ws = workspace(Path(tempfile.mkdtemp(prefix="bench-send-instr-")) / "state", None)
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
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (signal_like_id(i), ts(utcnow()), "sender", "sink", "inform",
                                                        f"raw {i}", i, None))
        raw.execute("COMMIT")

    for i in range(50):
        send(-i - 1)
        raw_insert(10 ** 8 + i)
    run = send if mode == "send" else raw_insert
    for i in range(count):
        run(i)


def instructions(mode: str, count: int) -> int:
    return callgrind_count([sys.executable, __file__, "--child", mode, str(count)])


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = bench_parser(__doc__)
    parser.add_argument("--ops", type=int, default=1000)
    args = parser.parse_args()
    per = {mode: (instructions(mode, args.ops) - instructions(mode, 0)) / args.ops for mode in ("send", "raw")}
    print(f"signals.send: {per['send'] / 1000:.1f} K instructions; raw insert: {per['raw'] / 1000:.1f} K; "
          f"{per['send'] / per['raw']:.2f}x (target <= 2.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
