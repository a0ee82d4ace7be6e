"""How long `synapolis serve` takes to stop on SIGINT or SIGTERM with a dashboard's event stream open, against
the same stop with nothing connected (the baseline, same run). Target (issue 30): under a second, exit 0,
nothing on stderr but the start line. Before the fix the open stream held the stop until uvicorn's graceful
timeout (2 s) cancelled it, with a CancelledError traceback."""

from __future__ import annotations

import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import bench_env, bench_parser, machine, publish, synapolis_cmd


def start(state: Path, env: dict) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(synapolis_cmd() + ["--state-dir", str(state), "serve", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    raise SystemExit(f"serve did not start (exit {proc.wait()})")


def open_stream(port: int, token: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    seen = b""
    while b"event: hello" not in seen:
        seen += sock.recv(4096)
    return sock


def stop_once(state: Path, env: dict, token: str, signum: int, with_stream: bool) -> float:
    proc, port = start(state, env)
    stream = open_stream(port, token) if with_stream else None
    began = time.perf_counter()
    proc.send_signal(signum)
    code = proc.wait(timeout=30)
    took = time.perf_counter() - began
    said = proc.stderr.read()
    if stream is not None:
        stream.close()
    if code != 0 or said.strip():
        raise SystemExit(f"serve did not stop cleanly (exit {code}): {said[-500:]}")
    return took


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = bench_env(Path(tmp))
        state = Path(tmp) / "state"
        subprocess.run(synapolis_cmd() + ["--state-dir", str(state), "init"], check=True, capture_output=True, env=env)
        made = subprocess.run(synapolis_cmd() + ["--state-dir", str(state), "tokens", "create", "bench", "--json"],
                              check=True, capture_output=True, text=True, env=env)
        token = json.loads(made.stdout)["token"]
        rows = []
        for name, signum in (("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM)):
            times = {False: [], True: []}
            for _ in range(args.runs):  # alternating, so a slow moment of the machine weighs on both
                for with_stream in (False, True):
                    times[with_stream].append(stop_once(state, env, token, signum, with_stream))
            idle, busy = statistics.median(times[False]), statistics.median(times[True])
            rows.append(f"| {name} | {idle * 1000:.0f} ms | {busy * 1000:.0f} ms (max {max(times[True]) * 1000:.0f}) "
                        f"| {busy / idle:.2f}x |")
    text = "\n".join([
        "## Stopping the team server with a dashboard open (bench_serve_stop.py)", "",
        f"{machine()}; `{Path(sys.argv[0]).name} --runs {args.runs}`: signal sent to process gone, median of "
        f"{args.runs} stops each, exit 0 and a clean stderr checked on every one.", "",
        "| signal | nothing connected (baseline) | an event stream open | vs baseline |", "|---|---|---|---|",
        *rows])
    publish("bench_serve_stop", text, write=not args.no_write)


if __name__ == "__main__":
    main()
