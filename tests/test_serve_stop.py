"""Stopping `serve` while people and agents are connected (issue 30): an open dashboard (its event stream, read
raw and in a real headless Chromium) and an MCP client with its session open. SIGINT (Ctrl-C) and SIGTERM
each stop the server cleanly: exit 0, nothing on stderr but its start line (no "Exception in ASGI
application", no CancelledError), the event stream ended by the server. It takes about 0.2 s
(benchmarks/RESULTS.md); the bound here is only a generous one against hanging until uvicorn's graceful
timeout cancels the stream."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import anyio
import pytest

pytest.importorskip("mcp")
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

from conftest import dashboard_page, everything_said, mcp_http_client, ok, start_server  # noqa: E402

STOP_BOUND_S = 5.0  # generous: the stop itself takes ~0.2 s; uvicorn's graceful timeout is 2 s


def _open_event_stream(base: str, token: str) -> socket.socket:
    """GET /events on a raw socket, read until the stream's first event: a dashboard's connection."""
    host, port = base.split("://", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    seen = b""
    while b"event: hello" not in seen:
        chunk = sock.recv(4096)
        assert chunk, seen
        seen += chunk
    return sock


def _stop(proc, signum) -> float:
    began = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=30)
    return time.monotonic() - began


def _clean(proc) -> None:
    said = everything_said(proc)
    assert proc.returncode == 0, said
    lines = [line for line in said.splitlines() if line.strip()]
    # what it says when it starts, nothing else
    assert all(line.startswith("synapolis serve: ") for line in lines) and "listening on" in lines[-1], said
    assert "Traceback" not in said and "CancelledError" not in said


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("stack", ["httptools-uvloop", "h11-asyncio"])
def test_stopping_with_an_event_stream_and_an_mcp_session_open(state_dir, cli, signum, stack):
    cli("init")
    token = json.loads(cli("tokens", "create", "ops", "--json").stdout)["token"]
    proc, base = start_server(state_dir, env={"SYNAPOLIS_SERVE_PLAIN": "1"} if stack == "h11-asyncio" else None)
    stream = _open_event_stream(base, token)
    mcp_ready, mcp_done = threading.Event(), []

    async def agent():  # an MCP client holding its session (and its GET stream) open until the server goes
        try:
            async with mcp_http_client(base, token) as client:
                await ok(client, "list_agents")
                mcp_ready.set()
                await anyio.sleep(60)
        except Exception as exc:  # noqa: BLE001 - the server went away under it: what this test does
            mcp_done.append(exc)
        mcp_done.append("done")

    thread = threading.Thread(target=anyio.run, args=(agent,), daemon=True)
    thread.start()
    assert mcp_ready.wait(30)
    try:
        took = _stop(proc, signum)
    finally:
        if proc.poll() is None:
            proc.kill()
    _clean(proc)
    assert took < STOP_BOUND_S, took
    stream.settimeout(5)
    rest = b""
    while chunk := stream.recv(4096):  # the server ended the stream (the chunked body's last chunk, then close)
        rest += chunk
    stream.close()
    assert rest.endswith(b"0\r\n\r\n"), rest[-200:]  # the chunked body's last chunk: ended, not cut


def test_stopping_with_a_dashboard_open_in_a_browser(served, cli, browser):
    page = dashboard_page(browser, served, served.token("ops"))
    took = _stop(served.proc, signal.SIGTERM)
    _clean(served.proc)
    assert took < STOP_BOUND_S, took
