#!/usr/bin/env python3
"""The team server (`synapolis serve`): a tool call's round trip over HTTP against the same over stdio and
against a bare starlette route of the same server, and the dashboard's update latency.

Targets (issue 14): an MCP tool call over HTTP at most 2x its round trip over stdio; a CLI signal to the
page's server-sent event p50 under 500 ms. Baselines measured in the same run: the same calls to
`synapolis mcp` over stdio (alternating in blocks with the HTTP calls, so all see the same machine load),
and GET /healthz on the same server (a bare starlette route: HTTP, uvicorn and starlette with no MCP and no
verb, the transport's floor). Two clients: the Python SDK's, and the TypeScript SDK 1.x's that Claude Code
and Gemini CLI connect with (tests/clients/rtt.mjs; needs node and `npm ci` in tests/clients). Two servers
side by side: `serve` as installed (httptools and uvloop when present) and with SYNAPOLIS_SERVE_PLAIN=1 (h11
and asyncio); for each, the server process's CPU time per call (Linux), which other work on the machine
moves less than wall time. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_serve.py [--calls 200] [--signals 40] [--no-write] [--against DIR]

`--against DIR` adds a third `serve`, run from another checkout's `synapolis` package (DIR on PYTHONPATH,
e.g. `git worktree add /tmp/before main`), to the Python client's blocks: this tree's server CPU per call
against that one's, side by side in one run (print only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path

from _common import bench_env, bench_parser, machine, publish, synapolis_cmd

SECTION = "bench_serve"
CLIENTS = Path(__file__).resolve().parents[1] / "tests" / "clients"
# ping is measured in the handshake era on purpose (the protocol alone); the SDK warns 2026-07-28 removed it
warnings.filterwarnings("ignore", message="ping is removed")

from contextlib import AsyncExitStack  # noqa: E402

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from synapolis.web.serve import PLAIN_ENV  # noqa: E402

BLOCK = 20
AGAINST = "HTTP, --against"  # the server run from another checkout (--against)
VERBS = {"ping (protocol only)": None, "read_signals": {}, "list_agents": {}, "write_whiteboard": {"key": "k",
                                                                                                  "value": "v"}}


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) process `pid` has used (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pid(args_end: list[str], exclude=()) -> int | None:
    """The pid of a child of this process whose command line ends with `args_end` (Linux), else None: the
    stdio server, which the SDK's client starts and does not name."""
    try:
        tasks = os.listdir("/proc/self/task")
        children = {int(p) for t in tasks for p in open(f"/proc/self/task/{t}/children").read().split()}
    except OSError:
        return None
    for pid in sorted(children - set(exclude)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv[-len(args_end):] == args_end:
            return pid
    return None


class Serve:
    """A `synapolis serve --port 0` process; its URL once it listens, and what it runs on."""

    def __init__(self, cmd, state: Path, env: dict, cwd=None):
        self.proc = subprocess.Popen([*cmd, "--state-dir", str(state), "serve", "--port", "0"], env=env, cwd=cwd,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            found = re.search(r"listening on (\S+) .*; ([^)]+)\)", line)
            if found:
                self.url, self.stack = found.group(1), found.group(2)
                threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
                return
        raise SystemExit("synapolis serve did not start")

    def cpu_s(self) -> float | None:
        """CPU seconds the server process has used (Linux), else None."""
        return process_cpu_s(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=15)


async def call(client, verb, args):
    if args is None:
        await client.send_ping()
        return
    result = await client.call_tool(verb, args)
    if result.is_error:
        raise SystemExit(f"{verb} failed: {result.content[0].text}")


async def round_trips(cmd, state: Path, env: dict, servers: dict, token: str, agent: dict, calls: int) -> dict:
    """The Python SDK's client: for each verb, stdio and each server's HTTP alternating in blocks. Per verb and
    side: the round trips (seconds), and for a server the CPU seconds it used per call."""
    me = {"agent_id": agent["agent_id"], "session_id": agent["session_id"], "run_token": agent["run_token"]}
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "--state-dir", str(state), "mcp"],
                                   env={**env, "SYNAPOLIS_AGENT_ID": me["agent_id"],
                                        "SYNAPOLIS_SESSION_ID": me["session_id"], "SYNAPOLIS_RUN_TOKEN": me["run_token"]})
    results = {verb: {side: [] for side in ["stdio", *servers]} for verb in VERBS}
    cpu = {verb: {side: 0.0 for side in ["stdio", *servers]} for verb in VERBS}
    client_cpu = {verb: {side: 0.0 for side in ["stdio", *servers]} for verb in VERBS}
    bare = {side: [] for side in servers}
    bare_cpu = {}  # side -> (server CPU, client CPU) per request
    async with AsyncExitStack() as stack:
        clients = {"stdio": await stack.enter_async_context(Client(stdio_client(params, errlog=sys.stderr),
                                                                   mode="legacy"))}
        for n, (side, server) in enumerate(servers.items()):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
            client = await stack.enter_async_context(Client(streamable_http_client(server.url + "/mcp", http_client=http),
                                                            mode="legacy"))
            await client.call_tool("start_session", {"agent_id": f"http-bench-{n}", "session_id": me["session_id"]})
            clients[side] = client
        stdio_pid = child_pid(["--state-dir", str(state), "mcp"], exclude=[s.proc.pid for s in servers.values()])
        cpu_of = {side: server.cpu_s for side, server in servers.items()} | {"stdio": lambda: process_cpu_s(stdio_pid)}
        for verb, args in VERBS.items():
            for _ in range(10):  # warm-up
                for client in clients.values():
                    await call(client, verb, args)
            done = 0
            while done < calls:
                for side, client in clients.items():
                    before = cpu_of[side]()
                    ours = time.process_time()
                    for _ in range(BLOCK):
                        began = time.perf_counter()
                        await call(client, verb, args)
                        results[verb][side].append(time.perf_counter() - began)
                    client_cpu[verb][side] += time.process_time() - ours
                    if before is not None:
                        cpu[verb][side] += cpu_of[side]() - before
                done += BLOCK
        for side, server in servers.items():
            async with httpx2.AsyncClient(base_url=server.url) as plain:
                for n in range(10 + calls):
                    if n == 10:
                        before, ours = server.cpu_s(), time.process_time()
                    began = time.perf_counter()
                    (await plain.get("/healthz")).raise_for_status()
                    if n >= 10:
                        bare[side].append(time.perf_counter() - began)
                spent = server.cpu_s() - before if before is not None else None
                bare_cpu[side] = (None if spent is None else spent / calls, (time.process_time() - ours) / calls)
    return {"times": results, "cpu": {v: {s: c / calls for s, c in sides.items()} for v, sides in cpu.items()},
            "client_cpu": {v: {s: c / calls for s, c in sides.items()} for v, sides in client_cpu.items()},
            "bare": bare, "bare_cpu": bare_cpu}


def ts_round_trips(cmd, state: Path, env: dict, server, token: str, agent: dict, calls: int, http_agent: str) -> dict | None:
    """The TypeScript SDK's client (tests/clients/rtt.mjs), stdio and this server's HTTP alternating in blocks,
    then (a run of its own, outside the server CPU measured per SDK call) node's fetch of the same server without
    the SDK; None where node or the client's packages are missing."""
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        return None
    identity = {k: agent[k] for k in ("agent_id", "session_id", "run_token")}
    before = server.cpu_s()
    done = subprocess.run([node, "rtt.mjs", json.dumps(cmd), str(state), server.url, token, str(calls), str(BLOCK),
                           json.dumps(identity), http_agent], cwd=CLIENTS, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"rtt.mjs failed: {done.stderr[-2000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    client_cpu = times.pop("_cpu", {})
    spent = server.cpu_s() - before if before is not None else None
    floors = subprocess.run([node, "rtt.mjs", json.dumps(cmd), str(state), server.url, token, str(calls), str(BLOCK),
                             json.dumps(identity), http_agent, "fetch"], cwd=CLIENTS, capture_output=True, text=True,
                            env=env, timeout=600)
    if floors.returncode != 0:
        raise SystemExit(f"rtt.mjs fetch failed: {floors.stderr[-2000:]}")
    fetched = json.loads(floors.stdout.strip().splitlines()[-1])["_fetch"]
    return {verb: {side: [ms / 1000 for ms in values] for side, values in sides.items()} for verb, sides in times.items()} \
        | {"_cpu_per_call": spent / (calls + 10) / len(times) if spent is not None else None,
           "_client_cpu": {verb: (c["http"] / 1000, c["stdio"] / 1000) for verb, c in client_cpu.items()},
           "_fetch": {name: ([ms / 1000 for ms in f["times"]], f["cpu"] / 1000) for name, f in fetched.items()}}


def dashboard_latency(cmd, state: Path, env: dict, url: str, token: str, signals: int) -> dict:
    """For each signal sent by a CLI process: from its stored timestamp (taken inside the sender before its
    commit) and from the CLI's launch, to the `change` event on the page's /events stream."""
    arrivals: list[float] = []
    heard = threading.Condition()
    ready = threading.Event()
    stop = threading.Event()

    def listen():
        try:
            with httpx2.Client(base_url=url, timeout=60) as client:
                with client.stream("GET", "/events", headers={"authorization": f"Bearer {token}"}) as stream:
                    for line in stream.iter_lines():
                        if line == "event: hello":
                            ready.set()
                        elif line == "event: change":
                            with heard:
                                arrivals.append(time.time())
                                heard.notify_all()
                        if stop.is_set():
                            return
        except httpx2.HTTPError:
            if not stop.is_set():
                raise

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise SystemExit("no hello on /events")
    stored, launched, missed = [], [], 0
    for n in range(signals):
        time.sleep(0.3)  # let the previous burst of events settle: each measurement starts from quiet
        with heard:
            seen = len(arrivals)
        began = time.time()
        done = subprocess.run([*cmd, "--state-dir", str(state), "signal", "receiver", f"m{n}", "--agent-id",
                               "sender", "--json"], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"signal failed: {done.stderr}")
        at = datetime.fromisoformat(json.loads(done.stdout)["signal"]["timestamp"].replace("Z", "+00:00")).timestamp()
        with heard:
            # the first event after this signal was stored (the CLI's start-up may already have caused others)
            if not heard.wait_for(lambda: any(t >= at for t in arrivals[seen:]), timeout=5):
                missed += 1
                continue
            first = min(t for t in arrivals[seen:] if t >= at)
        stored.append(first - at)
        launched.append(first - began)
    stop.set()
    return {"stored": stored, "launched": launched, "missed": missed}


def floor_table(rt: dict, ts: dict | None) -> list[str]:
    """Per (client, call) on the default stack: the CPU each side spends on one call, and the floor a server
    with a free HTTP transport would leave: the client's own CPU over HTTP plus the server's CPU for the same
    call over stdio (the verb and the protocol, no HTTP), against the target (twice the stdio round trip)."""
    if not any(rt["cpu"][verb]["HTTP"] for verb in VERBS):
        return []  # no /proc here: the server's CPU is unknown
    lines = [
        "What one call costs in CPU on each side (default stack; in parentheses the same over stdio). A round "
        "trip spends the client's CPU and the server's mostly one after the other, so the client's own CPU over "
        "HTTP plus what the server spends on the call over stdio is the floor of the HTTP round trip even for "
        "a server whose HTTP transport cost nothing: where that floor exceeds twice the stdio round trip, no "
        "server-side change meets the target for that client. The server's CPU is from the Python client's "
        "run (the same server work for either client).",
        "",
        "| client | call | client CPU, HTTP (stdio) | server CPU, HTTP (stdio) | floor: client HTTP + server stdio "
        "| target: 2x stdio p50 | floor within the target? |",
        "|---|---|---|---|---|---|---|",
    ]
    clients = [("Python SDK", rt["client_cpu"], rt["times"])]
    if ts is not None:
        clients.append(("TypeScript SDK", {v: {"HTTP": c[0], "stdio": c[1]} for v, c in ts["_client_cpu"].items()},
                        {v: {"stdio": ts[v]["stdio"]} for v in VERBS}))
    for client, client_cpu, times in clients:
        for verb in VERBS:
            if verb not in client_cpu:
                continue
            mine, server = client_cpu[verb], rt["cpu"][verb]
            floor = mine["HTTP"] + server["stdio"]
            target = 2 * statistics.median(times[verb]["stdio"])
            lines.append(f"| {client} | {verb} | {mine['HTTP'] * 1000:.2f} ms ({mine['stdio'] * 1000:.2f}) | "
                         f"{server['HTTP'] * 1000:.2f} ms ({server['stdio'] * 1000:.2f}) | {ms(floor)} | "
                         f"{ms(target)} | {'yes' if floor <= target else 'no'} |")
    return lines


def run(args) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    env = bench_env(tmp)
    cmd = synapolis_cmd()
    state = tmp / "state"
    state.mkdir()
    (state / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 1_000_000}))

    def cli(*a):
        done = subprocess.run([*cmd, "--state-dir", str(state), *a, "--json"], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"synapolis {' '.join(a)} failed: {done.stderr}")
        return json.loads(done.stdout)

    token = cli("tokens", "create", "bench")["token"]
    sender = cli("start", "--agent-id", "sender")
    cli("start", "--agent-id", "receiver", "--session-id", sender["session_id"])
    stdio_agent = cli("start", "--agent-id", "stdio-bench", "--session-id", sender["session_id"])
    load_before = os.getloadavg()[0]
    servers = {"HTTP": Serve(cmd, state, env), "HTTP, plain stack": Serve(cmd, state, {**env, PLAIN_ENV: "1"})}
    if args.against:
        # `python -m synapolis` in that checkout (`-m` puts the working directory first on sys.path, ahead
        # of PYTHONPATH): the console script next to this interpreter is this tree's
        against = str(Path(args.against).resolve())
        servers[AGAINST] = Serve([sys.executable, "-m", "synapolis"], state, {**env, "PYTHONPATH": against},
                                 cwd=against)
    try:
        rt = anyio.run(round_trips, cmd, state, env, servers, token, stdio_agent, args.calls)
        ts = {side: ts_round_trips(cmd, state, env, server, token, stdio_agent, args.calls, f"http-bench-ts-{n}")
              for n, (side, server) in enumerate(servers.items()) if side != AGAINST}
        live = dashboard_latency(cmd, state, env, servers["HTTP"].url, token, args.signals)
    finally:
        stacks = {side: server.stack for side, server in servers.items()}
        for server in servers.values():
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    load = f"1-minute load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"

    def cpu_ms(value):
        return "-" if value is None else f"{value * 1000:.2f} ms"

    lines = [
        "## Team server: tool round trips over HTTP vs stdio, dashboard update latency (bench_serve)",
        "",
        f"Machine: {machine()}  ",
        f"Command: `python benchmarks/bench_serve.py --calls {args.calls} --signals {args.signals}`  ",
        "One state directory; `synapolis mcp` (stdio) and two `synapolis serve` (the SDK's streamable HTTP, protocol "
        f"2025-11-25 with a session, JSON answers): **HTTP** on {stacks['HTTP']}, **HTTP, plain stack** on "
        f"{stacks['HTTP, plain stack']} (SYNAPOLIS_SERVE_PLAIN=1). "
        + (f"**{AGAINST}**: `serve` run from {args.against} on {stacks[AGAINST]}. " if args.against else "") +
        f"Load: {load} ({os.cpu_count()} CPUs shared with other work: compare columns of one run).",
        "",
        f"### Round trips ({args.calls} calls each after 10 warm-up, the sides alternating in blocks of {BLOCK})",
        "",
        "Server CPU: CPU time the `serve` process spent per call (user + system, from /proc); client CPU: the "
        "client's own, over HTTP / over stdio (this process for the Python client, node's `process.cpuUsage()` for "
        "the TypeScript one). The machine's other work moves CPU time much less than wall time.",
        "",
        "| client | call | server | HTTP p50 | HTTP p99 | stdio p50 | stdio p99 | HTTP / stdio (p50) | server CPU per call "
        "| client CPU per call, HTTP / stdio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []

    def row(client, verb, side, http, stdio, cpu, client_cpu=None):
        ratio = statistics.median(http) / statistics.median(stdio)
        ratios.append((client, verb, side, ratio))
        ours = "-" if client_cpu is None else f"{client_cpu[0] * 1000:.2f} / {client_cpu[1] * 1000:.2f} ms"
        lines.append(f"| {client} | {verb} | {side} | {ms(statistics.median(http))} | {ms(pct(http, .99))} | "
                     f"{ms(statistics.median(stdio))} | {ms(pct(stdio, .99))} | {ratio:.2f}x | {cpu_ms(cpu)} | {ours} |")

    for verb in VERBS:
        for side in servers:
            row("Python SDK", verb, side, rt["times"][verb][side], rt["times"][verb]["stdio"], rt["cpu"][verb][side],
                (rt["client_cpu"][verb][side], rt["client_cpu"][verb]["stdio"]))
    for side, times in ts.items():
        if times is None:
            continue
        for verb in VERBS:
            row("TypeScript SDK", verb, side, times[verb]["http"], times[verb]["stdio"],
                times["_cpu_per_call"] if verb == next(iter(VERBS)) else None, times["_client_cpu"].get(verb))
    for side, values in rt["bare"].items():
        server_cpu, client_cpu = rt["bare_cpu"][side]
        lines.append(f"| httpx2 | baseline: GET /healthz, a bare starlette route | {side} | "
                     f"{ms(statistics.median(values))} | {ms(pct(values, .99))} | - | - | - | {cpu_ms(server_cpu)} | "
                     f"{client_cpu * 1000:.2f} ms / - |")
    for side, times in ts.items():
        for name, (values, client_cpu) in ({} if times is None else times["_fetch"]).items():
            lines.append(f"| node fetch, no SDK | baseline: {name} | {side} | {ms(statistics.median(values))} | "
                         f"{ms(pct(values, .99))} | - | - | - | - | {client_cpu * 1000:.2f} ms / - |")
    met = [(c, v, s) for c, v, s, r in ratios if r <= 2.0 and s == "HTTP"]
    total = [r for r in ratios if r[2] == "HTTP"]
    lines += [
        "",
        f"Target: HTTP at most 2x stdio: met by {len(met)} of {len(total)} (client, call) pairs on the default "
        "stack" + (f" ({', '.join(f'{c}: {v}' for c, v, _ in met)})" if met else "") + ". "
        + ("" if all(t is not None for t in ts.values()) else "The TypeScript rows need node and `npm ci` in "
           "tests/clients. ")
        + "The TypeScript client's server CPU is per call over all its verbs. The bare route is the floor of any "
        "call over HTTP on this server (a request through uvicorn and starlette, no MCP, no verb); what an MCP "
        "call adds over it is the SDK's streamable HTTP transport (a POST answered with JSON, session checks) "
        "and the verb itself. The `node fetch, no SDK` rows are the TypeScript client's own floor: node's `fetch` "
        "(what the SDK's transport posts with) asking the same server for the bare route, and posting a JSON-RPC "
        "ping with the session's headers as the SDK does; where that ping costs what the SDK's does, the SDK adds "
        "nothing to what its HTTP stack spends.",
        "",
        *floor_table(rt, ts.get("HTTP")),
        "",
        f"### Dashboard: `synapolis signal` (another process) to the page's `change` event ({args.signals} signals, "
        f"{live['missed']} missed)",
        "",
        "| from | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| the signal stored (its timestamp, inside the sender) | {ms(pct(live['stored'], .5))} | "
        f"{ms(pct(live['stored'], .99))} | {ms(max(live['stored']))} |",
        f"| the CLI's launch (adds its start-up) | {ms(pct(live['launched'], .5))} | "
        f"{ms(pct(live['launched'], .99))} | {ms(max(live['launched']))} |",
        "",
        "Target: p50 under 500 ms. The event is what the page listens to (`/events`, server-sent); the page then "
        "fetches `/api/dashboard` once per event.",
    ]
    return "\n".join(lines)


def main():
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--signals", type=int, default=40)
    parser.add_argument("--against", metavar="DIR", default=None,
                        help="another checkout whose serve runs beside this one's (print only)")
    args = parser.parse_args()
    publish(SECTION, run(args), write=not args.no_write and not args.against)


if __name__ == "__main__":
    main()
