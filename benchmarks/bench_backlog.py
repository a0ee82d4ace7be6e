#!/usr/bin/env python3
"""An agent comes back to a backlog: answers are pages, so the first call costs the same whatever waits.

Over stdio with the official SDK client (`mcp.Client` on `stdio_client`, one `synapolis mcp` process),
with N unread signals waiting for one agent (issue 15, targets):
- its first delivering call (`beat`, piggyback) and a default `read_signals`: p50 < 100 ms each. The server
  answers `initialize` before the SDK has loaded (mcp/front.py) and the first tool call waits for the rest of
  that load, whatever waits in the inbox: the first call is also timed over an empty inbox, in a server started
  the same way, and the target is on the difference (what the backlog adds);
- paging through all N with `read_signals(after=next_after)`: linear in N (the time per signal at N and
  at N/10 compared) and within 2x of the 7.2 s the peer's single fetch of 100,000 took (issue 15);
- the largest answer of any tool, by default: < 256 KB (every answer is bounded).
Baselines measured in the same run: the same pages through the library in-process (the server's own
part, no protocol) and one raw sqlite3 SELECT of the N rows (what reading them costs at all).
Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_backlog.py [--signals 100000] [--calls 21] [--no-write]
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _common import bench_env, bench_parser, machine, publish, synapolis_cmd

import anyio  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from synapolis import actions  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.signals import signal_id  # noqa: E402
from synapolis.store import SessionStore  # noqa: E402
from synapolis.timeutil import format_ts, utcnow  # noqa: E402
from synapolis.workspace import Workspace  # noqa: E402

SECTION = "bench_backlog"
PEER_FETCH_ALL_S = 7.2  # MCP Agent Mail's fetch of 100,000 over stdio, as measured in issue 15


def make_backlog(root: Path, count: int) -> tuple[Workspace, str]:
    """alice and bob in one session, then `count` signals alice -> bob stored as `signals.send` stores them
    (id, timestamp, Lamport value), in one transaction: none delivered, none read."""
    ws = Workspace.open(root).ensure()
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, write_identity=False)
    base = utcnow()
    with SessionStore.open(ws, sid) as store, store.write() as tx:
        for i in range(count):
            stamp = format_ts(base + timedelta(microseconds=i), micro=True)
            content = f"backlog signal {i}: build {i % 97} finished, see the log for details"
            tx.insert_signal({"id": signal_id("alice", "bob", "inform", content, stamp), "timestamp": stamp,
                              "sender": "alice", "recipient": "bob", "type": "inform", "content": content,
                              "lamport": i + 1, "reply_to": None})
    return ws, sid


def raw_select_s(ws: Workspace, sid: str) -> float:
    conn = sqlite3.connect(str(ws.paths.session_db(sid)))
    started = time.perf_counter()
    rows = conn.execute("SELECT * FROM signals WHERE recipient = 'bob' ORDER BY sequence").fetchall()
    elapsed = time.perf_counter() - started
    conn.close()
    assert rows
    return elapsed


def library_paging_s(ws: Workspace, sid: str) -> tuple[float, int]:
    who, after, seen = Who("bob", sid), None, 0
    started = time.perf_counter()
    while True:
        page = actions.read_signals(ws, who, after=after, env={})
        seen += len(page["signals"])
        if page["next_after"] is None:
            return time.perf_counter() - started, seen
        after = page["next_after"]


def server_params(ws: Workspace, sid: str, env: dict) -> StdioServerParameters:
    cmd = synapolis_cmd()
    return StdioServerParameters(command=cmd[0], args=[*cmd[1:], "--state-dir", str(ws.root), "mcp"],
                                 env=dict(env, SYNAPOLIS_AGENT_ID="bob", SYNAPOLIS_SESSION_ID=sid))


async def first_call_s(ws: Workspace, sid: str, env: dict) -> float:
    """A new server's first `beat`, over an inbox with nothing waiting (the baseline of the first call)."""
    async with Client(stdio_client(server_params(ws, sid, env), errlog=sys.stderr), mode="legacy") as client:
        started = time.perf_counter()
        result = await client.call_tool("beat", {})
        elapsed = time.perf_counter() - started
        assert not result.is_error and not result.structured_content["pending_signals"]
        return elapsed


async def over_stdio(ws: Workspace, sid: str, calls: int, env: dict) -> dict:
    params = server_params(ws, sid, env)
    sizes: dict = {}
    async with Client(stdio_client(params, errlog=sys.stderr), mode="legacy") as client:
        async def call(tool, **args):
            started = time.perf_counter()
            result = await client.call_tool(tool, args)
            elapsed = time.perf_counter() - started
            if result.is_error:
                raise SystemExit(f"{tool} failed: {result.content[0].text}")
            size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8"))
            sizes[tool] = max(sizes.get(tool, 0), size)
            return elapsed, result.structured_content

        first, answer = await call("beat")
        delivered = len(answer["pending_signals"])
        beats = [first] + [(await call("beat"))[0] for _ in range(calls - 1)]
        reads = [(await call("read_signals"))[0] for _ in range(calls)]
        for tool in ("list_agents", "read_notes", "read_whiteboard", "claim_check"):
            sizes.setdefault(tool, 0)
        await call("signals_pending")
        await call("read_notes")
        # the whole backlog, page after page, through the pure query (marks nothing)
        after, seen, pages = None, 0, 0
        started = time.perf_counter()
        while True:
            _elapsed, page = await call("read_signals", **({"after": after} if after is not None else {}))
            seen += len(page["signals"])
            pages += 1
            if page["next_after"] is None:
                break
            after = page["next_after"]
        paging = time.perf_counter() - started
    return {"first": first, "delivered": delivered, "beat_p50": statistics.median(beats),
            "read_p50": statistics.median(reads), "paging_s": paging, "pages": pages, "seen": seen,
            "sizes": {k: v for k, v in sizes.items() if v}}


def measure(tmp: Path, count: int, calls: int, env: dict) -> dict:
    ws, sid = make_backlog(tmp / f"backlog-{count}", count)
    raw = raw_select_s(ws, sid)
    library, library_seen = library_paging_s(ws, sid)
    assert library_seen == count, (library_seen, count)
    stdio = anyio.run(over_stdio, ws, sid, calls, env)
    assert stdio["seen"] == count, (stdio["seen"], count)
    empty_ws, empty_sid = make_backlog(tmp / f"empty-{count}", 0)
    empty = anyio.run(first_call_s, empty_ws, empty_sid, env)
    return {"count": count, "raw_s": raw, "library_s": library, "first_empty": empty, **stdio}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--signals", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=21)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    try:
        env = bench_env(tmp)
        small = measure(tmp, max(1000, args.signals // 10), args.calls, env)
        big = measure(tmp, args.signals, args.calls, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    per_small = small["paging_s"] / small["count"] * 1e6
    per_big = big["paging_s"] / big["count"] * 1e6
    largest = max(big["sizes"].items(), key=lambda kv: kv[1])
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines = [
        f"## bench_backlog: {big['count']:,} unread signals waiting for one agent, over stdio",
        "",
        f"Machine: {machine()} · load average {load:.1f} at the end  ",
        f"Command: `python benchmarks/bench_backlog.py --signals {args.signals} --calls {args.calls}`  ",
        "One `synapolis mcp` process per backlog, driven by the SDK's stdio client (`mcp.Client`, legacy mode); "
        "the backlog stored as `signals.send` stores it, undelivered and unread.",
        "",
        "| what | measured | baseline (same run) | target |",
        "|---|---|---|---|",
        f"| first delivering call (`beat`, piggyback of {big['delivered']}), a new server | {big['first'] * 1000:.1f} ms "
        f"| the same over an empty inbox: {big['first_empty'] * 1000:.1f} ms (p50 of {args.calls} beats after: "
        f"{big['beat_p50'] * 1000:.1f} ms) | what the backlog adds < 100 ms: "
        f"{met(big['first'] - big['first_empty'] < 0.1)} ({(big['first'] - big['first_empty']) * 1000:+.1f} ms) |",
        f"| default `read_signals` p50 ({args.calls} calls) | {big['read_p50'] * 1000:.1f} ms | at "
        f"{small['count']:,}: {small['read_p50'] * 1000:.1f} ms | < 100 ms: {met(big['read_p50'] < 0.1)} |",
        f"| paging through all {big['count']:,} (`read_signals` after `next_after`, {big['pages']} pages) | "
        f"{big['paging_s']:.2f} s | peer's single fetch: {PEER_FETCH_ALL_S} s (issue 15) | <= 2x ("
        f"{2 * PEER_FETCH_ALL_S:.1f} s): {met(big['paging_s'] <= 2 * PEER_FETCH_ALL_S)} |",
        f"| per signal paged, {big['count']:,} vs {small['count']:,} | {per_big:.1f} µs vs {per_small:.1f} µs "
        f"({per_big / per_small:.2f}x) | | linear: {met(per_big / per_small <= 1.3)} |",
        f"| the same pages in-process (library, no protocol) | {big['library_s']:.2f} s | one raw sqlite3 SELECT "
        f"of the {big['count']:,} rows: {big['raw_s']:.2f} s | (for information) |",
        f"| largest answer of any tool by default ({largest[0]}) | {largest[1] / 1024:.0f} KB | | < 256 KB: "
        f"{met(largest[1] < 256 * 1024)} |",
        "",
        "Answer sizes (the JSON-RPC result, text + structured content, largest seen per tool): "
        + ", ".join(f"{k} {v / 1024:.0f} KB" for k, v in sorted(big["sizes"].items())) + ".",
    ]
    publish(SECTION, "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
