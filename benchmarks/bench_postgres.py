#!/usr/bin/env python3
"""The PostgreSQL store's costs (contract §12, issue 13), each against a baseline measured in the same run
on the same server.

1. Sends per second in-process: `signals.send` in its own write transaction on the store, against a raw
   psycopg loop inserting one row per transaction into a table of the same shape (target: >= 0.3x).
   The whole verb `actions.signal` (identity, heartbeat file and copy, piggyback) is shown too, and the send's
   own three statements through the store's libpq calls with fixed arguments (the floor of any client) and
   from a psycopg cursor. In three placements: as the scheduler places the connections, with this process and
   the database's backends pinned to one CPU, and with them pinned to two (this process on one, the backends
   on the other: two machines' placement; `place`).
2. Eight writer processes on two state directories ("machines"), the same on SQLite (one machine) for scale.
3. `synapolis signal` and a hook call with the PostgreSQL store against `python -c "import psycopg"`
   (target: <= 1.3x), interleaved runs, medians.
4. Push: a signal stored through one state directory until the other's MCP watcher is told (p50 < 50 ms).
5. `list-agents` and a broadcast with 1,000 agents registered.

    python benchmarks/bench_postgres.py [--sends 2000] [--runs 21] [--agents 1000] [--no-write]

The server: $SYNAPOLIS_TEST_PG_URL, else a throwaway one from scripts/synapolis-test-postgres.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import HERE, bench_env, bench_parser, interpreter, machine, publish, ratio_table, synapolis_cmd, timed

import psycopg

from synapolis import actions, signals
from synapolis.identity import Who
from synapolis.store import clock, close_all, open_session
from synapolis.workspace import Workspace

SECTION = "bench_postgres"
SCRIPT = HERE.parent / "scripts" / "synapolis-test-postgres"


def server() -> tuple[str, str | None]:
    url = os.environ.get("SYNAPOLIS_TEST_PG_URL")
    if url:
        return url, None
    done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, check=True)
    found = dict(line.split("=", 1) for line in done.stdout.replace("export ", "").replace("'", "").split())
    return found["SYNAPOLIS_TEST_PG_URL"], found["SYNAPOLIS_TEST_PG_DIR"]


MADE = []  # the databases fresh_database made in this process, for drop_databases


def fresh_database(admin_url: str) -> str:
    name = "bench_" + secrets.token_hex(4)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    MADE.append(name)
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_databases(admin_url: str) -> None:
    """Drop every database fresh_database made here: left behind, each run's (100,000 signals and more) kept the
    server's autovacuum busy into the next runs, a load no run asked for."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while MADE:
            conn.execute(f"DROP DATABASE IF EXISTS {MADE.pop()} WITH (FORCE)")


def workspace(root: Path, url: str, **config) -> Workspace:
    ws = Workspace.open(root).ensure()
    doc = json.loads(ws.paths.config.read_text())
    doc.update(config, store=url)
    ws.paths.config.write_text(json.dumps(doc))
    return Workspace.open(root)


@contextlib.contextmanager
def composed_sends():
    """signals.send composed from the interface's single operations (six round trips), as before the store
    had its one-call send (Transaction.send_signal; schema 7)."""
    from synapolis.store.postgres import PostgresTransaction

    offered = PostgresTransaction.offers_send_signal
    PostgresTransaction.offers_send_signal = False  # signals.send then composes it (and never calls send_signal)
    try:
        yield
    finally:
        PostgresTransaction.offers_send_signal = offered


PLACEMENTS = ("free", "one", "split")  # as the scheduler places them; all on one CPU; client and server apart


def place(conn, placement: str, every_database: bool = False) -> set | None:
    """Pin this process and every server backend of its database: `one`, all on one CPU; `split`, this process
    on one CPU and the backends on the other (two machines' placement: the two ends share no CPU and no
    cache). None when the server's processes are not ours to pin (another user's, another machine's) or this
    machine has one CPU. Unpinned, a round trip's cost on this VM depends on where the scheduler put the two
    ends: the same `SELECT 1` transaction takes about 45 us on one connection and 250 us on the next, at
    random (a wake-up of the other, idle CPU), which decides a ratio between two connections more than either
    side's work; pinned either way, every connection pays the same. `every_database`: the backends of every
    database on the server, not only `conn`'s (a run over several fresh databases)."""
    kept = os.sched_getaffinity(0)
    client = {min(kept)}
    backends = client if placement == "one" else {max(kept)}
    if backends == client and placement == "split":
        return None
    pids = [row[0] for row in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND (%s OR datname = "
        "current_database())", (every_database,))]
    try:
        for pid in pids:
            os.sched_setaffinity(pid, backends)
    except OSError:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, kept)
        return None
    os.sched_setaffinity(0, client)
    return kept


def bench_sends(tmp: Path, url: str, count: int, chunk: int = 20, placement: str = "free") -> dict | None:
    """Sends per second, in small interleaved chunks of `chunk` sends (raw, bare, cursor, store, composed,
    verb) so that load on a shared machine weighs on all of them alike; the medians of the chunks. `placement`: one of
    PLACEMENTS (see `place`); None when that placement is not possible here."""
    label = placement
    pinned = placement != "free"
    ws = workspace(tmp / f"sends-{label}", url, rate_limit_per_min=10 ** 6)
    sid = actions.start(ws, agent_id="sender", session_id=f"bench-{label}", env={})["session_id"]
    actions.start(ws, agent_id="sink", session_id=sid, env={})
    raw = psycopg.connect(url)  # baseline: one row per transaction into a table shaped like `signals`
    raw.execute(f"CREATE TABLE raw_signals_{label} (session_id TEXT, id TEXT, sequence BIGINT GENERATED ALWAYS AS "
                "IDENTITY PRIMARY KEY, timestamp TEXT, sender TEXT, recipient TEXT, type TEXT, content TEXT, "
                "lamport BIGINT, reply_to TEXT, UNIQUE (session_id, id))")
    raw.commit()
    store = open_session(ws, sid)
    # the floor of any client: the send's own three statements (BEGIN; SELECT synapolis_send(...); COMMIT) with
    # fixed arguments through the libpq calls the store makes, none of synapolis's Python around them (checks,
    # id, audience, clock); and the same statement through a psycopg cursor's execute, as the store sent it before
    from synapolis.store.postgres import NOTIFY_CHANNEL, SEND_CALL, _command, _execute_send, _key, _text_array

    bare = psycopg.connect(url, autocommit=True)
    through_cursor = psycopg.connect(url)
    rounds = max(count // chunk, 5)
    rates = {"raw": [], "store": [], "composed": [], "verb": [], "bare": [], "cursor": []}
    kept = None
    if pinned:
        with store.write() as tx:  # the store's own connection is open before its backend is pinned
            signals.send(tx, caller="sender", recipient="sink", content="first", now=clock(ws), config=ws.config)
        kept = place(raw, placement)
        raw.commit()
        if kept is None:
            for conn in (raw, bare, through_cursor):
                conn.close()
            return None
    n = 0

    def fixed_send(n, kind):
        return (sid, f"{n:064x}", "2030-01-01T00:00:00.000000Z", "sender", "sink", "inform", f"{kind} {n}", "sender",
                _text_array(["sink"]), float(10 ** 6), time.time(), _key(sid, "signals"), NOTIFY_CHANNEL, None, None,
                None, None, None)

    def timed(kind, send_one, size=chunk):  # `size` sends of one kind, each numbered anew, as one rate
        nonlocal n
        started = time.perf_counter()
        for _i in range(size):
            n += 1
            send_one(n)
        rates[kind].append(size / (time.perf_counter() - started))

    def raw_insert(n):
        raw.execute(f"INSERT INTO raw_signals_{label} (session_id, id, timestamp, sender, recipient, type, "
                    "content, lamport) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (sid, f"{n:064x}", "2030-01-01T00:00:00.000000Z", "sender", "sink", "inform", f"raw {n}", n))
        raw.commit()

    def bare_send(n):
        _command(bare, b"BEGIN")
        _execute_send(bare, fixed_send(n, "bare"))
        _command(bare, b"COMMIT")

    def cursor_send(n):
        through_cursor.execute(SEND_CALL, fixed_send(n, "cursor"))
        through_cursor.commit()

    def store_send(n):  # signals.send in its own store write transaction
        with store.write() as tx:
            signals.send(tx, caller="sender", recipient="sink", content=f"store {n}", now=clock(ws), config=ws.config)

    def verb_send(n):
        actions.signal(ws, Who("sender", sid), "sink", f"verb {n}", env={}, piggyback=False)

    for _ in range(rounds):
        timed("raw", raw_insert)
        timed("bare", bare_send)
        timed("cursor", cursor_send)
        timed("store", store_send)
        with composed_sends():  # the same sends without the store's one-call send: before, in this run
            timed("composed", store_send)
        timed("verb", verb_send, chunk // 4)
    for conn in (raw, bare, through_cursor):
        conn.close()
    if kept is not None:
        close_all()  # the store's pinned connection goes; the benches after this one get new, unpinned ones
        os.sched_setaffinity(0, kept)
    out = {k: statistics.median(v) for k, v in rates.items()}
    out["raw_ratio"] = 1.0
    for kind in ("bare", "cursor", "store", "composed", "verb"):
        out[kind + "_ratio"] = statistics.median(k / r for k, r in zip(rates[kind], rates["raw"]))
    out["count"] = count
    return out


WRITER = r"""
import sys
from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
for i in range(int(sys.argv[4])):
    actions.signal(ws, Who(sys.argv[2], sys.argv[3]), "reader", f"{sys.argv[2]} {i}", env={}, piggyback=False)
"""


def eight_writers(dirs: list[Path], per_writer: int) -> float:
    """Signals per second of 8 writer processes spread over `dirs`, while nobody reads."""
    sid = "bench8"
    first = Workspace.open(dirs[0])
    actions.start(first, agent_id="reader", session_id=sid, env={})
    for i in range(8):
        actions.start(Workspace.open(dirs[i % len(dirs)]), agent_id=f"w{i}", session_id=sid, env={})
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(dirs[i % len(dirs)]), f"w{i}", sid, str(per_writer)],
                              env={**os.environ, "PYTHONPATH": str(HERE.parent)}) for i in range(8)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("a writer failed")
    return 8 * per_writer / (time.perf_counter() - started)


def bench_cli(tmp: Path, url: str, runs: int) -> list:
    env = bench_env(tmp)
    ws = workspace(tmp / "cli", url, rate_limit_per_min=10 ** 6)
    sid = actions.start(ws, agent_id="alice", session_id="cli", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    cmd = synapolis_cmd() + ["--state-dir", str(ws.root)]
    hook_event = json.dumps({"session_id": "0f7e6d5c-1111-2222-3333-444455556666", "hook_event_name": "PostToolUse",
                             "cwd": str(tmp), "tool_name": "Bash"})
    cases = [
        ('`python -c "import psycopg"` (baseline)', [sys.executable, "-c", "import psycopg"], None),
        ("`synapolis signal` (PostgreSQL store)", cmd + ["signal", "--agent-id", "alice", "--session-id", sid,
                                                         "bob", "hello"], None),
        ("`synapolis hook claude-code` PostToolUse (PostgreSQL store)", cmd + ["hook", "claude-code"], hook_event),
    ]
    for _name, argv, stdin in cases:  # warm-up: bytecode caches, the hook's first registration
        timed(argv, env, stdin=stdin)
    samples = {name: [] for name, _a, _s in cases}
    for _ in range(runs):
        for name, argv, stdin in cases:
            samples[name].append(timed(argv, env, stdin=stdin))
    base = statistics.median(samples[cases[0][0]])
    return [(name, statistics.median(samples[name]), statistics.median(samples[name]) / base)
            for name, _a, _s in cases]


def bench_push(tmp: Path, url: str, rounds: int) -> list[float]:
    from synapolis.mcp.watch import SessionWatcher, Subscriptions, current_value

    laptop = workspace(tmp / "push-laptop", url, rate_limit_per_min=10 ** 6)
    runner = workspace(tmp / "push-runner", url, rate_limit_per_min=10 ** 6)
    sid = actions.start(laptop, agent_id="alice", session_id="push", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    uri = f"synapolis://session/{sid}/inbox/alice"
    subscriptions = Subscriptions()
    subscriptions.add(uri, "client", current_value(laptop, uri))
    woken = threading.Event()
    watcher = SessionWatcher(laptop, subscriptions, lambda uris: woken.set()).start()
    # the other "machine" sends from a process of its own, so the two share no connection
    sender = subprocess.Popen([sys.executable, "-c", (
        "import sys\nfrom synapolis import actions\nfrom synapolis.identity import Who\n"
        "from synapolis.workspace import Workspace\nws = Workspace.open(sys.argv[1])\n"
        "for line in sys.stdin:\n"
        "    actions.signal(ws, Who('bob', sys.argv[2]), 'alice', line.strip(), env={}, piggyback=False)\n"
        "    print('sent', flush=True)\n"), str(runner.root), sid],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    latencies = []
    try:
        time.sleep(1.0)
        for i in range(rounds):
            woken.clear()
            began = time.perf_counter()
            sender.stdin.write(f"push {i}\n")
            sender.stdin.flush()
            if not woken.wait(5):
                raise SystemExit("a push never arrived")
            latencies.append((time.perf_counter() - began) * 1000)
            sender.stdout.readline()
            time.sleep(0.05)
    finally:
        sender.stdin.close()
        sender.wait()
        watcher.stop()
    return latencies


def bench_many_agents(tmp: Path, url: str, agents: int) -> dict:
    ws = workspace(tmp / "many", url, rate_limit_per_min=10 ** 6)
    sid = actions.start(ws, agent_id="a0", session_id="many", env={})["session_id"]
    with open_session(ws, sid) as store, store.write() as tx:
        stamp = actions.ts(clock(ws))
        for i in range(1, agents):
            tx.register_agent(f"a{i}", harness="bench", substrate="", stamp=stamp, run_token=f"t{i}")
    who = Who("a0", sid)
    lists, sends = [], []
    for _ in range(5):
        began = time.perf_counter()
        listed = actions.list_agents(ws, who, env={}, piggyback=False)
        lists.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        actions.signal(ws, who, "*", "to everyone", env={}, piggyback=False)
        sends.append((time.perf_counter() - began) * 1000)
    assert len(listed["agents"]) == agents
    return {"list_ms": statistics.median(lists), "broadcast_ms": statistics.median(sends)}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--push", type=int, default=30)
    parser.add_argument("--per-writer", type=int, default=100)
    args = parser.parse_args()
    admin_url, cluster = server()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            url = fresh_database(admin_url)
            placed = {placement: bench_sends(tmp, url, args.sends, placement=placement) for placement in PLACEMENTS}
            pg_dirs = [workspace(tmp / f"m{i}", url, rate_limit_per_min=10 ** 6).root for i in range(2)]
            pg_writers = eight_writers(pg_dirs, args.per_writer)
            lite = Workspace.open(tmp / "lite").ensure()
            doc = json.loads(lite.paths.config.read_text())
            doc["rate_limit_per_min"] = 10 ** 6
            lite.paths.config.write_text(json.dumps(doc))
            lite_writers = eight_writers([lite.root], args.per_writer)
            cli = bench_cli(tmp, url, args.runs)
            push = bench_push(tmp, url, args.push)
            many = bench_many_agents(tmp, url, args.agents)
            close_all()
        drop_databases(admin_url)
    finally:
        if cluster:
            subprocess.run(["bash", str(SCRIPT), "destroy", cluster], capture_output=True)
    judged = placed["split"] or placed["free"]
    ratio = judged["store_ratio"]
    worst_cli = max(r for _n, _s, r in cli[1:])
    p50 = statistics.median(push)
    p90 = sorted(push)[int(len(push) * 0.9) - 1]
    lines = [
        "## The PostgreSQL store (bench_postgres.py)",
        "",
        f"Machine: {machine()} · PostgreSQL 15 on 127.0.0.1 (scripts/synapolis-test-postgres: fsync off) · "
        f"load average {os.getloadavg()[0]:.1f} when measured  ",
        f"Command: `python benchmarks/bench_postgres.py --sends {args.sends} --runs {args.runs} "
        f"--agents {args.agents} --push {args.push} --per-writer {args.per_writer}`  ",
        interpreter(),
        "",
        "| sends per second (in-process, one transaction each; medians of interleaved chunks of 20) | as the "
        "scheduler places them | vs baseline | client and server backends on one CPU | vs baseline | client on one "
        "CPU, server backends on the other (two machines) | vs baseline |",
        "|---|---|---|---|---|---|---|",
        *(f"| {title} | " + " | ".join(f"{placed[p][key]:.0f} | {placed[p][key + '_ratio']:.2f}x" if placed[p]
                                       else "- | -" for p in PLACEMENTS) + " |"
          for key, title in (
              ("raw", "raw psycopg single-row insert loop (baseline)"),
              ("store", "`signals.send` in a store write transaction"),
              ("composed", "the same, composed from single operations (before schema 7)"),
              ("bare", "its three statements through the store's libpq calls, none of synapolis's Python (the floor "
                       "of any client)"),
              ("cursor", "the same statements from a psycopg cursor's execute (the store before stop 25)"),
              ("verb", "the whole verb `actions.signal` (heartbeat file, copy, registry)"))),
        "",
        "Unpinned, a round trip's cost here depends on where the scheduler put the client and its server "
        "backend: the same `BEGIN; SELECT 1; COMMIT` takes about 45 us on one connection and 250 us on the next, "
        "at random (waking the other, idle CPU of a VM), so a ratio between two connections says more about "
        "their placement than about either side's work. Pinned (`place`), every connection of a column is placed "
        "alike. On one CPU a send costs the sum of both sides' CPU work, and the client's Python runs cold "
        "after each round trip on the CPU its backend has just used. On two, the client and the server share "
        "no CPU and no cache, and each round trip pays one wake-up of the other side, as a round trip between "
        "two machines pays the network (more: a LAN's round trip is 50 us or more): that is the store's case "
        "(§12: agents on laptops, CI runners and sandboxes, one database server), and the column the target "
        "is judged by."
        + ("" if placed["split"] else " Pinning was not possible here (the server's processes are not this "
                                      "user's, or one CPU): the target is judged unpinned."),
        "",
        f"Target: at least 0.3x the baseline — {'met' if ratio >= 0.3 else 'NOT met'} ({ratio:.2f}x"
        f"{', client and server on two CPUs' if placed['split'] else ''}; the floor of any client, bare libpq calls, "
        f"{judged['bare_ratio']:.2f}x; on one CPU "
        + (f"{placed['one']['store_ratio']:.2f}x, floor {placed['one']['bare_ratio']:.2f}x" if placed["one"] else "-")
        + ").",
        "A send is three round trips (BEGIN; `SELECT synapolis_send(...)`, a PL/pgSQL function that checks the "
        "audience and the caller, spends a token, locks, inserts, raises the Lamport clock and notifies; COMMIT), "
        "the baseline's three (BEGIN, INSERT, COMMIT); composed from the interface's single operations it was "
        "six (the audience and the caller's row; the bucket read FOR UPDATE; its write; the insert). On this "
        "machine the server shares the two CPUs with the client. Schema 8 finds a duplicate id through the "
        "unique index (`ON CONFLICT`) instead of schema 7's planned `EXISTS`, whose plan, made while the table "
        "was new, read every earlier signal of the session (0.17x on a quiet machine, falling as the table "
        "grew); it also spends the token in one statement and returns three fields per audience row. "
        "The client sends BEGIN, the send and COMMIT with libpq's own calls (`pgconn.exec_`; the send a statement "
        "each connection prepares at its second send, `exec_prepared`) instead of a cursor's execute, and quotes "
        "the audience's `text[]` itself: about 324,000 instructions of client work a send, of which 252,000 are "
        "synapolis's own Python, against 369,000 with the send through a cursor and 598,000 before stop 21 "
        "(callgrind; the baseline's insert loop: 157,000). "
        "docs/STORE.md (\"Round trips\") says what each step costs and what was tried. "
        "Both store rows take `now` from `Store.now()`, which runs on a monotonic anchor of the server's "
        "clock (a round trip every 30 s instead of one per send). "
        "A connection's first `synapolis_send` costs ~4 ms (PL/pgSQL compiles it once per connection), "
        "which a CLI call pays once.",
        "",
        "| 8 writer processes, 100 signals each | signals per second |",
        "|---|---|",
        f"| PostgreSQL, two state directories | {pg_writers:.0f} |",
        f"| SQLite, one state directory (baseline) | {lite_writers:.0f} |",
        "",
        *ratio_table(cli),
        "",
        f"Target: at most 1.3x the baseline — {'met' if worst_cli <= 1.3 else 'NOT met'} ({worst_cli:.2f}x).",
        "",
        f"Push across machines (LISTEN/NOTIFY, {len(push)} signals, send in another process until the watcher's "
        f"notify): p50 {p50:.1f} ms, p90 {p90:.1f} ms, max {max(push):.1f} ms. "
        f"Target: p50 under 50 ms — {'met' if p50 < 50 else 'NOT met'}.",
        "",
        f"With {args.agents} agents registered: `list_agents` {many['list_ms']:.1f} ms, a broadcast "
        f"`actions.signal` {many['broadcast_ms']:.1f} ms (medians of 5, in-process).",
    ]
    publish(SECTION, "\n".join(lines), write=not args.no_write)


if __name__ == "__main__":
    main()
