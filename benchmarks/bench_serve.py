#!/usr/bin/env python3
"""The team server (`synapolis serve`): a tool call's round trip over HTTP against the same over stdio and
against a bare starlette route of the same server, and the dashboard's update latency.

Targets (issue 14): an MCP tool call over HTTP at most 2x its round trip over stdio; a CLI signal to the
page's server-sent event p50 under 500 ms. Baselines measured in the same run: the same calls to
`synapolis mcp` over stdio (alternating in blocks with the HTTP calls, so both see the same machine load),
and GET /healthz on the same server (a bare starlette route: HTTP, uvicorn and starlette with no MCP and no
verb, the transport's floor). Writes its section of benchmarks/RESULTS.md.

    python benchmarks/bench_serve.py [--calls 200] [--signals 40] [--no-write]
"""

from __future__ import annotations

import argparse
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

from _common import bench_env, machine, publish, synapolis_cmd

SECTION = "bench_serve"
# ping is measured in the handshake era on purpose (the protocol alone); the SDK warns 2026-07-28 removed it
warnings.filterwarnings("ignore", message="ping is removed")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

BLOCK = 20
VERBS = {"ping (protocol only)": None, "read_signals": {}, "list_agents": {}, "write_whiteboard": {"key": "k",
                                                                                                  "value": "v"}}


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class Serve:
    """A `synapolis serve --port 0` process; its URL once it listens."""

    def __init__(self, cmd, state: Path, env: dict):
        self.proc = subprocess.Popen([*cmd, "--state-dir", str(state), "serve", "--port", "0"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            found = re.search(r"listening on (\S+)", line)
            if found:
                self.url = found.group(1)
                threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
                return
        raise SystemExit("synapolis serve did not start")

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


async def round_trips(cmd, state: Path, env: dict, url: str, token: str, agent: dict, calls: int) -> dict:
    me = {"agent_id": agent["agent_id"], "session_id": agent["session_id"], "run_token": agent["run_token"]}
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "--state-dir", str(state), "mcp"],
                                   env={**env, "SYNAPOLIS_AGENT_ID": me["agent_id"],
                                        "SYNAPOLIS_SESSION_ID": me["session_id"], "SYNAPOLIS_RUN_TOKEN": me["run_token"]})
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
    results = {verb: {"http": [], "stdio": []} for verb in VERBS}
    results["GET /healthz (bare route)"] = {"http": []}
    async with Client(stdio_client(params, errlog=sys.stderr), mode="legacy") as over_stdio, \
            Client(streamable_http_client(url + "/mcp", http_client=http), mode="legacy") as over_http, \
            httpx2.AsyncClient(base_url=url) as bare:
        await over_http.call_tool("start_session", {"agent_id": "http-bench", "session_id": me["session_id"]})
        for verb, args in VERBS.items():
            for _ in range(10):  # warm-up
                await call(over_http, verb, args)
                await call(over_stdio, verb, args)
            done = 0
            while done < calls:
                for side, client in (("http", over_http), ("stdio", over_stdio)):
                    for _ in range(BLOCK):
                        began = time.perf_counter()
                        await call(client, verb, args)
                        results[verb][side].append(time.perf_counter() - began)
                done += BLOCK
        for _ in range(10):
            (await bare.get("/healthz")).raise_for_status()
        for _ in range(calls):
            began = time.perf_counter()
            (await bare.get("/healthz")).raise_for_status()
            results["GET /healthz (bare route)"]["http"].append(time.perf_counter() - began)
    return results


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
    server = Serve(cmd, state, env)
    try:
        rt = anyio.run(round_trips, cmd, state, env, server.url, token, stdio_agent, args.calls)
        live = dashboard_latency(cmd, state, env, server.url, token, args.signals)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    load = f"1-minute load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"

    lines = [
        "## Team server: tool round trips over HTTP vs stdio, dashboard update latency (bench_serve)",
        "",
        f"Machine: {machine()}  ",
        f"Command: `python benchmarks/bench_serve.py --calls {args.calls} --signals {args.signals}`  ",
        "One `synapolis serve` (uvicorn, the SDK's streamable HTTP, protocol 2025-11-25 with a session, JSON "
        "answers) and one `synapolis mcp` (stdio) on one state directory, each driven by the SDK's client. "
        f"Load: {load} ({os.cpu_count()} CPUs shared with other work: compare columns of one run).",
        "",
        f"### Round trips ({args.calls} calls each after 10 warm-up, HTTP and stdio alternating in blocks of "
        f"{BLOCK})",
        "",
        "| call | HTTP p50 | HTTP p99 | stdio p50 | stdio p99 | HTTP / stdio (p50) |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    for verb, r in rt.items():
        if "stdio" not in r:
            continue
        ratio = statistics.median(r["http"]) / statistics.median(r["stdio"])
        ratios.append((verb, ratio))
        lines.append(f"| {verb} | {ms(statistics.median(r['http']))} | {ms(pct(r['http'], .99))} | "
                     f"{ms(statistics.median(r['stdio']))} | {ms(pct(r['stdio'], .99))} | {ratio:.2f}x |")
    bare = rt["GET /healthz (bare route)"]["http"]
    lines.append(f"| baseline: GET /healthz, a bare starlette route of the same server | {ms(statistics.median(bare))} "
                 f"| {ms(pct(bare, .99))} | - | - | - |")
    met = sum(r <= 2.0 for _v, r in ratios)
    lines += [
        "",
        f"Target: HTTP at most 2x stdio: met by {met} of {len(ratios)} calls. The bare route is the floor of any "
        "call over HTTP on this server (a request through uvicorn and starlette, no MCP, no verb); what an MCP "
        "call adds over it is the SDK's streamable HTTP transport (a POST answered with JSON, session "
        "checks) and the verb itself.",
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--signals", type=int, default=40)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    publish(SECTION, run(args), write=not args.no_write)


if __name__ == "__main__":
    main()
