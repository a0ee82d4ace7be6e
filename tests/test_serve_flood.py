"""Nobody can starve `serve` (issue 30): under `ulimit -n 1024`, 1,100 idle connections and a set of half-sent
requests (slowloris: headers without their end, a body cut short) from one process with no token. While they
are all open, `/healthz` and a valid token's request are answered within 2 s; the server closes every one of
them once its deadline passes; and its log stays a few lines, not a traceback per failed accept. Both HTTP
stacks: httptools on uvloop (the `serve` extra) and h11 on asyncio (SYNAPOLIS_SERVE_PLAIN=1)."""

from __future__ import annotations

import errno
import json
import os
import resource
import select
import signal
import socket
import time
import urllib.request

import pytest

from conftest import everything_said, start_server, wait_until
from synapolis.web import limits

pytest.importorskip("uvicorn")

SERVER_NOFILE = 1024
IDLE = 1100
HALF_SENT = 60
ANSWER_S = 2.0


def _server_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_NOFILE, SERVER_NOFILE))


@pytest.fixture
def many_files():
    """This test process may hold the flood's sockets: its soft open-file limit raised (and put back)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE + HALF_SENT + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-file limit {hard} is under the {wanted} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connect(port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.setblocking(False)
    code = sock.connect_ex(("127.0.0.1", port))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        return None
    return sock


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(url: str, token: str | None = None) -> tuple[int, float]:
    """(status, seconds) of one request on a new connection."""
    began = time.monotonic()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()
        return answer.status, time.monotonic() - began


def _ready(sock: socket.socket, events: int, timeout_s: float) -> bool:
    """poll(), not select(): the flood's descriptors are past select's 1,024."""
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(timeout_s * 1000))


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection (end of stream or reset); never blocks."""
    if not _ready(sock, select.POLLIN, 0):
        return False
    try:
        while sock.recv(65536):  # a 431 or 400 may come before the end
            pass
    except BlockingIOError:
        return False
    except (ConnectionResetError, ConnectionAbortedError):
        return True
    return True


@pytest.mark.parametrize("stack", ["httptools-uvloop", "h11-asyncio"])
def test_a_flood_of_idle_and_half_sent_connections_starves_nobody(state_dir, cli, many_files, stack):
    cli("init")
    token = json.loads(cli("tokens", "create", "ops", "--json").stdout)["token"]
    env = {"SYNAPOLIS_SERVE_PLAIN": "1"} if stack == "h11-asyncio" else None
    proc, base = start_server(state_dir, env=env, preexec_fn=_server_limit)
    port = int(base.rsplit(":", 1)[1])
    flood: list[socket.socket] = []
    try:
        baseline = _descriptors(proc.pid)
        for n in range(IDLE):
            sock = _connect(port)
            if sock is not None:
                flood.append(sock)
            if n % 50 == 49:
                # a breath per 50, so the server accepts them rather than the kernel's queue dropping the rest
                # (a connection the queue dropped is open at this end only and costs the server nothing): pacing
                # of the flood, not a wait for anything
                time.sleep(0.02)
        for n in range(HALF_SENT):  # headers without their end, or a body cut short
            sock = _connect(port)
            if sock is None:
                continue
            _ready(sock, select.POLLOUT, 5)
            with_body = n % 2
            head = (f"POST /api/post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                    f"Content-Type: application/x-www-form-urlencoded\r\n\r\nkind=note" if with_body
                    else "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            try:
                sock.send(head.encode())
            except OSError:
                pass  # already closed by the server to make room: as good
            flood.append(sock)
        assert len(flood) >= IDLE  # the kernel took them all: the server holds or has closed each

        # while they are all open: real clients are answered at once
        status, took = _get(base + "/healthz")
        assert status == 200 and took < ANSWER_S, took
        status, took = _get(base + "/api/status", token)
        assert status == 200 and took < ANSWER_S, took

        # the server closes every connection of the flood by the deadline (REQUEST_S): it holds none of them
        # (counted at its end, its descriptors: one the kernel's queue dropped looks open from here forever)
        wait_until(lambda: _descriptors(proc.pid) <= baseline + 4, limits.REQUEST_S + 5,
                   f"the server to close the flood (it held {baseline} descriptors before it)", interval_s=0.2)
        closed = sum(1 for sock in flood if _closed_by_server(sock))
        assert closed >= limits.connection_cap(SERVER_NOFILE), closed  # what it accepted, it closed
        status, _ = _get(base + "/healthz")
        assert status == 200
    finally:
        for sock in flood:
            sock.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    log = everything_said(proc)
    assert len(log.encode()) < 4096, log[:4096]
    assert "Too many open files" not in log and "Traceback" not in log, log
    assert f"at most {limits.connection_cap(SERVER_NOFILE)} connections" in log
    assert log.count("connections open, the most this process keeps") == 1, log  # said once


def test_endless_headers_are_cut_and_a_slow_honest_request_is_served(served):
    """A head past HEAD_BYTES_MAX is answered 431 and closed (it never finishes, so it is never parsed
    whole); a request sent slowly, in pieces over a few seconds but well within REQUEST_S, is answered."""
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        answer = b""
        try:
            for _ in range(2 * limits.HEAD_BYTES_MAX // 1024):
                sock.sendall(b"X-Pad: " + b"a" * 1016 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed under the sender: as good
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        assert answer.startswith(b"HTTP/1.1 431") or answer == b"", answer[:200]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(0.8)  # the client IS slow: the pause between pieces is what this request is, not a wait
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_repeated_log_line_is_said_once_a_minute():
    """The rule on the flood's loggers: 1,000 failed accepts (asyncio names a different socket after the first
    line each time, with a traceback) give one record; another message, or the same a minute later, gets
    through."""
    import logging

    once = limits.OncePerMinute()

    def record(msg, exc=None):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None,
                                 (type(exc), exc, None) if exc else None)

    too_many = OSError(errno.EMFILE, "Too many open files")
    passed = [once.filter(record(f"socket.accept() out of system resource\nsocket: <fd={n}>", too_many))
              for n in range(1000)]
    assert passed.count(True) == 1 and passed[0]
    assert once.filter(record("Exception in callback Something.else"))
    key = next(iter(once.last))
    once.last[key] -= limits.LOG_EVERY_S  # a minute on, as the clock would have it
    assert once.filter(record("socket.accept() out of system resource\nsocket: <fd=7>", too_many))
