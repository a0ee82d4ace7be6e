#!/usr/bin/env python3
"""Costs that must not grow with the swarm (issue 31), each against its baseline in the same run, with the
scaling curves behind them:

1. `actions.read_signals(limit=20)` with 100,000 signals in the session against 100 (<= 1.2x); curve over
   100 / 1k / 10k / 100k signals.
2. A broadcast (`signals.send` to `*` in a write transaction) with 1,000 agents registered against 2
   (<= 1.5x); curve over 2 / 10 / 100 / 1,000 / 10,000 agents, with the floor: the cheapest read of the ids of
   the registered agents alone, one string built in the database and split (the answer names every recipient,
   contract §7). A long-lived store keeps the audience between broadcasts (SQLite: store/local/audience.py);
   "first" is a broadcast with nothing kept, as a process's one `synapolis signal '*'` makes it.
3. `run_monitor` over 50,000 heartbeat files against json-loading them (<= 2.0x); curve over 1k / 10k / 50k.
4. `signals.send` in-process against a raw insert into the same table (<= 2.5x): a bare connection's
   BEGIN IMMEDIATE, INSERT, COMMIT on the same session.db (PostgreSQL: BEGIN, INSERT, COMMIT into `signals`,
   the session's rows of the shared table), each row's id spread as a SHA-256's is. SQLite's floor: the send's
   own statements issued on that bare connection with fixed inputs (no checks, no id, no audience judged).

PostgreSQL's three ratios between connections (1, 2 and 4) are measured again with this process and every server
process pinned (`placed`): on one CPU, and on two, which judges them as it judges issue 13's sends
(docs/STORE.md, "Placement").

The two sides of each comparison alternate in chunks; medians. `--load` runs two `python -c 'while 1: pass'`
processes for the whole run (the loaded column); `--pg` adds the PostgreSQL store's rows
($SYNAPOLIS_TEST_PG_URL). Each run writes its figures to benchmarks/flat-<quiet|loaded>.json (plot_flat.py
draws the curves from them) and its section of RESULTS.md.

    python benchmarks/bench_flat.py [--load] [--pg] [--runs 101] [--no-write]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _common import HERE, bench_parser, machine, publish

from synapolis import actions, signals  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.sessions import ts  # noqa: E402
from synapolis.signals import signal_id  # noqa: E402
from synapolis.store import clock, close_all, open_session  # noqa: E402
from synapolis.timeutil import format_ts, utcnow  # noqa: E402
from synapolis.workspace import Workspace  # noqa: E402

READ_SIZES = (100, 1_000, 10_000, 100_000)
AGENT_SIZES = (2, 10, 100, 1_000, 10_000)
FILE_SIZES = (1_000, 10_000, 50_000)
# bench_postgres.PLACEMENTS other than "free": all on one CPU; this process on one, the server's on the other
# (two machines' placement, which judges the PostgreSQL targets as it judges issue 13's: docs/STORE.md)
PINNED = ("one", "split")
PLACED = {"free": "as the scheduler places the two ends", "one": "client and server pinned to one CPU",
          "split": "client and server pinned to two CPUs (judged)"}


def workspace(root: Path, url: str | None) -> Workspace:
    ws = Workspace.open(root).ensure()
    doc = json.loads(ws.paths.config.read_text())
    doc["rate_limit_per_min"] = 10 ** 6
    if url:
        doc["store"] = url
    ws.paths.config.write_text(json.dumps(doc))
    return Workspace.open(root)


def database(admin: str | None) -> str | None:
    """A fresh PostgreSQL database on the test server, or None for the SQLite store."""
    if admin is None:
        return None
    from bench_postgres import fresh_database

    return fresh_database(admin)


def p50_ms(values) -> float:
    return statistics.median(values) * 1000


def alternate(sides: dict, runs: int, chunk: int = 5, prepare: dict | None = None) -> dict:
    """Run each of `sides` (name -> call(i)) `runs` times, the sides alternating in chunks; p50 ms each.
    `prepare` (name -> call()) runs before each call of that side, out of its timing."""
    times = {k: [] for k in sides}
    prepare = prepare or {}
    i = 0
    for _ in range(max(1, runs // chunk)):
        for key, call in sides.items():
            for _ in range(chunk):
                i += 1
                if key in prepare:
                    prepare[key]()
                began = time.perf_counter()
                call(i)
                times[key].append(time.perf_counter() - began)
    return {k: p50_ms(v) for k, v in times.items()}


# -- 1. the inbox page -----------------------------------------------------------------------------

def inbox_session(root: Path, url: str | None, total: int) -> tuple[Workspace, str]:
    """alice, bob, carol and dave; `total` signals. bob's inbox holds 40 unread spread over the whole history
    (to bob, to his sub-agents bob.x and bob.y.z, alice's broadcasts); the rest is the others' traffic and, a
    fifth of it, broadcasts from bob and his sub-agent bob.x, which bob never sees (the visibility rules)."""
    ws = workspace(root, url)
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    for name in ("bob", "carol", "dave"):
        actions.start(ws, agent_id=name, session_id=sid, env={}, write_identity=False)
    base = utcnow()
    mine = set(random.Random(31).sample(range(total), 40))
    with open_session(ws, sid) as store, store.write() as tx:
        for i in range(total):
            if i in mine:
                sender, to = "alice", ("bob", "bob.x", "*", "bob.y.z")[i % 4]
            elif i % 10 < 2:  # broadcasts bob does not see: his own and his sub-agent's
                sender, to = ("bob", "bob.x")[i % 2], "*"
            else:
                sender = ("carol", "dave", "bob", "alice")[i % 4]
                to = "dave" if sender == "carol" else "carol"
            stamp = format_ts(base + timedelta(microseconds=i), micro=True)
            content = f"signal {i} for {to}"
            tx.insert_signal({"id": signal_id(sender, to, "inform", content, stamp), "timestamp": stamp,
                              "sender": sender, "recipient": to, "type": "inform", "content": content,
                              "lamport": i + 1, "reply_to": None})
    return ws, sid


def inbox_curve(tmp: Path, admin: str | None, runs: int, sizes=READ_SIZES, placement: str = "free") -> dict | None:
    """The inbox page at each of `sizes` signals; PostgreSQL's in `placement` (`placed`), None when that placement
    cannot be made here."""
    urls = {n: database(admin) for n in sizes}
    made = {n: inbox_session(tmp / f"inbox-{placement}-{n}", urls[n], n) for n in sizes}
    for ws, sid in made.values():  # the first call of each opens its store: out of the timing
        actions.read_signals(ws, Who("bob", sid), limit=20, env={})
    sides = {n: (lambda i, ws=ws, sid=sid: actions.read_signals(ws, Who("bob", sid), limit=20, env={}))
             for n, (ws, sid) in made.items()}
    with placed(urls[sizes[0]], placement) as possible:
        return {str(k): v for k, v in alternate(sides, runs).items()} if possible else None


# -- 2. the broadcast ------------------------------------------------------------------------------

def crowd(root: Path, url: str | None, agents: int):
    ws = workspace(root, url)
    sid = actions.start(ws, agent_id="a0", env={}, write_identity=False)["session_id"]
    store = open_session(ws, sid)
    with store.write() as tx:
        stamp = ts(utcnow())
        for i in range(1, agents):
            tx.register_agent(f"a{i:05d}", harness="bench", substrate="", stamp=stamp, run_token=f"t{i}")
    return ws, store


def broadcast_curve(tmp: Path, admin: str | None, runs: int, sizes=AGENT_SIZES, placement: str = "free") -> dict | None:
    """A broadcast at each of `sizes` agents, kept and first, and the floor; PostgreSQL's in `placement`
    (`placed`), None when that placement cannot be made here."""
    urls = {n: database(admin) for n in sizes}
    made = {n: crowd(tmp / f"crowd-{placement}-{n}", urls[n], n) for n in sizes}

    def send(i, ws, store):
        with store.write() as tx:
            _sig, heard = signals.send(tx, caller="a0", recipient="*", content=f"to everyone {i}", now=clock(ws),
                                       config=ws.config)
        assert len(heard["live"]) + len(heard["waiting"]) == n_of[id(store)] - 1

    def ids(i, store):  # the floor: the answer names every recipient, so their ids are read at least; the
        # cheapest read of them there is: one string built inside the database, split into the list
        with store.read() as tx:
            if hasattr(tx, "conn"):  # SQLite: the session's own database
                text = tx.conn.execute("SELECT group_concat(id, char(10)) FROM agents").fetchone()[0]
            else:
                tx.cur.execute("SELECT string_agg(id, E'\\n') FROM agents WHERE session_id = %s", (tx.session_id,))
                text = tx.cur.fetchone()
                text = text[0] if isinstance(text, tuple) else next(iter(text.values()))
        assert len(text.split("\n")) == n_of[id(store)]

    def forget(store):  # what a new process has: no audience kept
        store.forget_audience()

    n_of = {id(store): n for n, (ws, store) in made.items()}
    sides, prepare = {}, {}
    for n, (ws, store) in made.items():
        sides[f"send {n}"] = lambda i, ws=ws, store=store: send(i, ws, store)
        sides[f"first {n}"] = lambda i, ws=ws, store=store: send(i, ws, store)
        prepare[f"first {n}"] = lambda store=store: forget(store)
        sides[f"ids {n}"] = lambda i, store=store: ids(i, store)
    for key, call in sides.items():  # the connections opened, so that `placed` pins their backends
        if key not in prepare:
            call(-1)
    with placed(urls[sizes[0]], placement) as possible:
        out = alternate(sides, runs, prepare=prepare) if possible else None
        for ws, store in made.values():
            store.close()
    return out


# -- 3. the monitor --------------------------------------------------------------------------------

def monitor_curve(tmp: Path, passes: int) -> dict:
    from bench_monitor import json_load_all, populate

    from synapolis import monitor
    from synapolis.monitor import run_monitor

    def forget():  # a process's first pass (a CLI `synapolis monitor`): nothing read before, not even the
        # monitor document the last pass wrote; what the last pass kept is freed here, out of the timing (a new
        # process has nothing to free)
        monitor._READS.clear()
        monitor._LAST_WRITTEN.clear()

    out = {}
    for files in FILE_SIZES:
        ws = Workspace.open(tmp / f"beats-{files}").ensure()
        populate(ws.paths.heartbeats, files, utcnow())
        json_load_all(ws.paths.heartbeats)  # the page cache warm for both sides alike
        run_monitor(ws)
        rounds = max(5, passes * 1000 // files)  # a median of 5 at least: a first pass of 50,000 varies by a tenth
        got = alternate({"base": lambda i: json_load_all(ws.paths.heartbeats), "monitor": lambda i: run_monitor(ws),
                         "first": lambda i: run_monitor(ws)}, rounds, chunk=1, prepare={"first": forget})
        out[str(files)] = got
        shutil.rmtree(ws.paths.heartbeats, ignore_errors=True)
    return out


# -- 4. the send -----------------------------------------------------------------------------------

def signal_like_id(i: int) -> str:
    """A raw row's id as a real signal's is: 64 hex characters spread evenly (a SHA-256), so each insert lands
    at a random place of the id index, as a send's does; counting ids (`f"{i:064x}"`) would all append at its
    end, a cheaper insert than any signal's."""
    return hashlib.sha256(b"raw %d" % i).hexdigest()


def send_pair(tmp: Path, admin: str | None, runs: int, placement: str = "free") -> dict | None:
    """The send against the raw insert; PostgreSQL's in `placement` (bench_postgres.place), None when that
    placement cannot be made here."""
    url = database(admin)
    ws = workspace(tmp / f"send-{placement}", url)
    sid = actions.start(ws, agent_id="sender", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="sink", session_id=sid, env={}, write_identity=False)
    store = open_session(ws, sid)
    if url is None:
        raw = sqlite3.connect(ws.files.session_db(sid), isolation_level=None)
        raw.execute("PRAGMA synchronous = NORMAL")

        def raw_insert(i):
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("INSERT INTO signals (id, timestamp, sender, recipient, type, content, lamport, reply_to) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (signal_like_id(i), ts(utcnow()), "sender", "sink", "inform",
                                                            f"raw {i}", i, None))
            raw.execute("COMMIT")

        from synapolis.store.local.signals import _INSERT_SIGNAL, _SPEND_AND_TICK

        stamp, rate, moment = ts(utcnow()), 10.0 ** 6, time.time()

        def floor(i):  # the store's own statements for this send, issued on a bare connection with fixed inputs
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("SELECT id, status, last_heartbeat FROM agents WHERE id IN (?) ORDER BY id",
                        ("sink",)).fetchall()
            lamport = raw.execute(_SPEND_AND_TICK, (rate, moment, rate / 60.0, "sender")).fetchone()[0]
            raw.execute(_INSERT_SIGNAL, (signal_like_id(i + 2 * 10 ** 9), stamp, "sender", "sink", "inform", f"floor {i}",
                                         lamport, None, None))
            raw.execute("COMMIT")
    else:
        floor = None
        import psycopg

        raw = psycopg.connect(url)

        def raw_insert(i):  # into `signals` itself, with its indexes, as on SQLite (the same table)
            raw.execute("INSERT INTO signals (session_id, id, timestamp, sender, recipient, type, content, "
                        "lamport) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        (sid, signal_like_id(i), ts(utcnow()), "sender", "sink", "inform", f"raw {i}", i))
            raw.commit()

    def send(i):
        with store.write() as tx:
            signals.send(tx, caller="sender", recipient="sink", content=f"send {i}", now=clock(ws),
                         config=ws.config)

    for i in range(20):  # prepared statements, the server's plans
        send(-i - 1)
        raw_insert(10 ** 9 + i)
        if floor is not None:
            floor(10 ** 8 + i)
    sides = {"raw": raw_insert, "send": send}
    if floor is not None:
        sides["floor"] = floor
    with placed(url, placement) as possible:
        out = alternate(sides, runs, chunk=20) if possible else None
        raw.close()
        store.close()
    return out


@contextlib.contextmanager
def placed(url: str | None, placement: str):
    """Yields whether `placement` is made: this process and every client backend of the server at `url` (each
    size of a curve has its own database) pinned as bench_postgres.place pins them; SQLite (url None) has only
    "free". Unpinned, a round trip on this VM costs about 10 us when the scheduler has put both ends on one CPU
    and 70 us when it wakes the other, idle one, and which a connection gets decides a ratio between two
    connections more than either side's work. The pinned connections are closed on the way out, so later parts
    get new, unpinned ones."""
    if placement == "free":
        yield True
        return
    kept = None
    if url is not None:
        import psycopg
        from bench_postgres import place

        with psycopg.connect(url) as conn:
            kept = place(conn, placement, every_database=True)
    try:
        yield kept is not None
    finally:
        if kept is not None:
            close_all()
            os.sched_setaffinity(0, kept)


# -- the run ---------------------------------------------------------------------------------------

def loaders(count: int) -> list:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--load", action="store_true", help="two busy-loop processes for the whole run")
    parser.add_argument("--pg", action="store_true", help="the PostgreSQL store's rows too ($SYNAPOLIS_TEST_PG_URL)")
    parser.add_argument("--runs", type=int, default=101)
    parser.add_argument("--passes", type=int, default=5, help="monitor passes at 1,000 files per file-size step")
    parser.add_argument("--only", nargs="*", default=["read", "broadcast", "send", "monitor"],
                        help="a part of the run (read broadcast send monitor): a look while working, not a result")
    args = parser.parse_args()
    admin = os.environ.get("SYNAPOLIS_TEST_PG_URL") if args.pg else None
    if args.pg and not admin:
        raise SystemExit("--pg needs SYNAPOLIS_TEST_PG_URL")
    tmp = Path(tempfile.mkdtemp(prefix="bench-flat-"))
    busy = loaders(2) if args.load else []
    figures = {"load": bool(args.load), "runs": args.runs}
    try:
        parts = {"read": inbox_curve, "broadcast": broadcast_curve,
                 "send": lambda t, a, runs: send_pair(t, a, max(runs * 20, 2000))}
        for store, url in (("sqlite", None), ("postgres", admin)):
            if store == "sqlite" or url:
                figures[store] = {k: run(tmp / store, url, args.runs) for k, run in parts.items() if k in args.only}
                close_all()
        if admin:  # the PostgreSQL ratios between connections again, each placement pinned (`placed`)
            for placement in PINNED:
                if "read" in args.only:
                    figures["postgres"][f"read {placement}"] = inbox_curve(
                        tmp / "postgres", admin, args.runs, sizes=(100, 100_000), placement=placement)
                if "broadcast" in args.only:
                    figures["postgres"][f"broadcast {placement}"] = broadcast_curve(
                        tmp / "postgres", admin, args.runs, sizes=(2, 1_000), placement=placement)
                if "send" in args.only:
                    figures["postgres"][f"send {placement}"] = send_pair(tmp / "postgres", admin,
                                                                         max(args.runs * 20, 2000), placement)
        if "monitor" in args.only:
            figures["monitor"] = monitor_curve(tmp, args.passes)
        figures["loadavg"] = os.getloadavg()[0]
        if admin:
            from bench_postgres import drop_databases

            close_all()
            drop_databases(admin)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    kind = "loaded" if args.load else "quiet"
    if not args.no_write:
        (HERE / f"flat-{kind}.json").write_text(json.dumps(figures, indent=1) + "\n", "utf-8")
    publish(f"bench_flat_{kind}", report(figures, args), write=not args.no_write)
    return 0


def report(f: dict, args) -> str:
    def ratio(r: float, target: float, judged: bool = True) -> str:
        return f"{r:.2f}x, {'met' if r <= target else 'NOT met'} (<= {target}x)" if judged else f"{r:.2f}x"

    flags = " --load" if args.load else ""
    flags += " --pg" if args.pg else ""
    lines = [f"## bench_flat ({'under two busy-loop processes' if args.load else 'quiet'}): costs that must not "
             "grow with the swarm (issue 31)", "",
             f"Machine: {machine()} · load average {f['loadavg']:.1f} at the end · shared with other engineers' "
             "work this run (ratios are from the same run only)  ",
             f"Command: `python benchmarks/bench_flat.py{flags} --runs {args.runs} --passes {args.passes}` "
             "(in-process, sides alternating in chunks; medians)", "",
             "| store | workload | measured | baseline (same run) | ratio vs target |", "|---|---|---|---|---|"]
    def compared(store, s, kind, label, top, bottom, base_label, target, digits) -> list:
        """One comparison's rows: as placed, then pinned on one CPU and on two (PostgreSQL, `placed`), the last
        judging when it was measured."""
        rows = []
        for placement in ("free",) + PINNED:
            m = s.get(kind if placement == "free" else f"{kind} {placement}")
            if not m:
                continue
            judged = placement == "split" or (placement == "free" and not s.get(f"{kind} split"))
            where = "" if placement == "free" and judged else ", " + PLACED[placement]
            rows.append(f"| {store} | {label}{where} | {m[top]:.{digits}f} ms | {base_label}: {m[bottom]:.{digits}f} "
                        f"ms | {ratio(m[top] / m[bottom], target, judged)} |")
        return rows

    for store in ("sqlite", "postgres"):
        s = f.get(store, {})
        lines += compared(store, s, "read", "`read_signals {limit: 20}`, 100,000 signals", "100000", "100",
                          "100 signals", 1.2, 2)
        broadcast = compared(store, s, "broadcast", "broadcast, 1,000 agents registered", "send 1000", "send 2",
                             "2 agents", 1.5, 2)
        if "broadcast" in s:
            b = s["broadcast"]
            broadcast[1:1] = [
                f"| {store} | the same, a process's first broadcast (nothing kept) | {b['first 1000']:.2f} ms | 2 agents: "
                f"{b['first 2']:.2f} ms | {b['first 1000'] / b['first 2']:.2f}x |",
                f"| {store} | (floor) the cheapest read of the 1,000 ids alone (one string built in the database, "
                f"split) | {b['ids 1000']:.3f} ms | 2: {b['ids 2']:.3f} ms | a 2-agent broadcast plus the 998 more ids: "
                f"{(b['send 2'] + b['ids 1000'] - b['ids 2']) / b['send 2']:.2f}x the 2-agent broadcast |"]
        send = compared(store, s, "send", "`signals.send` in-process", "send", "raw", "raw insert, same table", 2.5, 3)
        if "floor" in s.get("send", {}):
            snd = s["send"]
            send[1:1] = [f"| {store} | (floor) the send's own statements on a bare connection, fixed inputs | "
                         f"{snd['floor']:.3f} ms | raw insert: {snd['raw']:.3f} ms | {snd['floor'] / snd['raw']:.2f}x; "
                         f"the send's Python around them: {snd['send'] - snd['floor']:.3f} ms |"]
        lines += broadcast + send
    curves = []
    for store in ("sqlite", "postgres"):
        s = f.get(store, {})
        if "read" in s:
            curves.append(f"{store} read by signals " + ", ".join(f"{k}: {v:.2f}" for k, v in s["read"].items()))
        if "broadcast" in s:
            curves.append(f"{store} broadcast by agents " + ", ".join(
                f"{k.split()[1]}: {v:.2f}" for k, v in s["broadcast"].items() if k.startswith("send")))
            curves.append(f"{store} first broadcast by agents " + ", ".join(
                f"{k.split()[1]}: {v:.2f}" for k, v in s["broadcast"].items() if k.startswith("first")))
    if "monitor" in f:
        m = f["monitor"]
        big = m[str(FILE_SIZES[-1])]
        lines += [f"| files | `run_monitor`, {FILE_SIZES[-1]:,} heartbeat files, a repeated pass "
                  "(a watching monitor) | "
                  f"{big['monitor']:.0f} ms | json-loading them: {big['base']:.0f} ms | "
                  f"{ratio(big['monitor'] / big['base'], 2.0)} |",
                  f"| files | the same, a process's first pass (`synapolis monitor` once) | {big['first']:.0f} ms | "
                  f"json-loading them: {big['base']:.0f} ms | {ratio(big['first'] / big['base'], 2.0)} |"]
        curves.append("monitor by files (repeated / first pass / baseline) " + ", ".join(
            f"{k}: {v['monitor']:.0f} / {v['first']:.0f} / {v['base']:.0f}" for k, v in m.items()))
    lines += ["", "Curves (p50 ms; plot_flat.py draws them): " + "; ".join(curves) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
