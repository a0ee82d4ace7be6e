"""What keeps anyone who can open a connection from starving `serve` (issue 30): a cap on open connections
derived from the process's open-file limit, a deadline for each request's line, headers and body, a cap on
header bytes, and a log that says a repeated thing once a minute, not once per connection.

Uvicorn offers `timeout_keep_alive` (used: an idle connection between two requests), `limit_concurrency` and
`backlog`, but no deadline for a request that is never finished: its keep-alive timer is armed only after a
response, so a connection that sends nothing, or half a request (slowloris), is kept for ever, and 1,100 of
them against 1,024 descriptors left `/healthz` and every token unanswered while each failed accept logged a
traceback. `limit_concurrency` does not help either: it answers 503 to a finished request but never closes a
connection. So the smallest piece uvicorn lacks is added at its protocol level (`Bounded`, mixed into its own
httptools and h11 protocol classes): a timer per connection, and room made for a newcomer by closing the
oldest connection that is waiting on its client, never one whose request is being answered.
"""

from __future__ import annotations

import logging
import time

REQUEST_S = 10.0  # a request's line, headers and body, from the connection's start or the previous response
KEEP_ALIVE_S = 5  # uvicorn's own: an idle connection between two requests
HEAD_BYTES_MAX = 64 * 1024  # a request line and headers (ours are under 2 KiB; a browser's under 16)
BACKLOG = 128  # the listen queue: also how many connections one wake-up may accept before any is counted
RESERVED_FDS = BACKLOG + 128  # an accept burst, plus the files, database and watchers the server itself opens
MIN_CONNECTIONS = 16
LOG_EVERY_S = 60.0


def connection_cap(soft_limit: int | None = None) -> int:
    """How many connections the server keeps open: its open-file limit (RLIMIT_NOFILE, the soft one) less
    what it needs for everything else, so an accept never fails for want of a descriptor."""
    if soft_limit is None:
        import resource

        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft_limit == resource.RLIM_INFINITY:
            soft_limit = 1 << 16
    return max(MIN_CONNECTIONS, soft_limit - RESERVED_FDS)


class Bounded:
    """Mixed in before one of uvicorn's HTTP protocol classes (both keep `cycle`, `transport`, `loop`,
    `server_state` and `on_response_complete`). `cap` is set on the class made by `protocol_class`."""

    cap = MIN_CONNECTIONS
    _timer = None
    _head_bytes = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if getattr(self.server_state, "synapolis_stopping", False):
            # accepted before the server stopped listening, made after it closed the idle ones: nobody
            # would close it, and the stop would wait for it
            transport.close()
            return
        opened = _opened(self.server_state)
        opened[self] = None
        if len(opened) > self.cap:
            _make_room(opened, self)
        if not transport.is_closing():
            self._arm()

    def connection_lost(self, exc) -> None:
        _opened(self.server_state).pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if not (cycle is None or (cycle.response_complete and not cycle.more_body)):
            self._head_bytes = 0  # a head is complete: what comes is its body (or an answered one's rest)
            return
        # what arrived and still did not complete a request's head: a client sending headers without end
        self._head_bytes += len(data)
        if self._head_bytes > HEAD_BYTES_MAX and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                                 b"connection: close\r\n\r\n")
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._head_bytes = 0
        if not self.transport.is_closing():
            self._arm()  # the next request, if any, has REQUEST_S from now (idle ones go at KEEP_ALIVE_S)

    def waits_on_client(self) -> bool:
        """No request yet, or one whose line, headers or body are not all in; or a response done and
        nothing new complete. Only such a connection is closed for time or to make room."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(REQUEST_S, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.waits_on_client() and not self.transport.is_closing():
            # abort, not close: close waits for unsent data, which a client that never reads never takes
            self.transport.abort()
        # a request being answered keeps its connection; the timer starts again with its response's end


def _opened(server_state) -> dict:
    """The open connections, oldest first (a dict kept on uvicorn's shared server state)."""
    opened = getattr(server_state, "synapolis_opened", None)
    if opened is None:
        opened = server_state.synapolis_opened = {}
    return opened


def _make_room(opened: dict, newcomer) -> None:
    """Over the cap: close the oldest connection that waits on its client (idle, or a request half sent),
    else the newcomer, so a real client that connects now is answered however many idle ones are held."""
    victim = next((c for c in opened if c is not newcomer and c.waits_on_client()), newcomer)
    opened.pop(victim, None)
    victim._disarm()
    victim.transport.abort()
    logging.getLogger("uvicorn.error").warning(
        "synapolis serve: %d connections open, the most this process keeps (its open-file limit less %d); "
        "the oldest idle ones are closed to make room", len(opened) + 1, RESERVED_FDS)


def protocol_class(http: str, cap: int):
    """Uvicorn's protocol class for `http` ("httptools" or "h11") with the bounds mixed in."""
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type(f"Bounded{base.__name__}", (Bounded, base), {"cap": cap})


class OncePerMinute(logging.Filter):
    """Lets a record through once per LOG_EVERY_S for each logger, first line of its message and exception
    type: a flood of failed accepts, bad requests or evictions writes a line a minute, not a traceback each
    (asyncio's and uvloop's accept errors name the socket after the first line, which is left out)."""

    def __init__(self, every_s: float = LOG_EVERY_S):
        super().__init__()
        self.every_s = every_s
        self.last: dict = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = record.exc_info[0] if record.exc_info else None
        key = (record.name, str(record.msg).split("\n", 1)[0][:200], kind)
        now = time.monotonic()
        if now - self.last.get(key, -self.every_s) < self.every_s:
            return False
        if len(self.last) > 1000:
            self.last.clear()
        self.last[key] = now
        return True


def quiet_floods() -> None:
    """The once-a-minute rule on the loggers a flood writes to: uvicorn's, asyncio's (uvloop's too) and
    psycopg-pool's (one warning per failed connection while the database is away)."""
    once = OncePerMinute()
    for name in ("uvicorn.error", "asyncio", "psycopg.pool"):
        logging.getLogger(name).addFilter(once)
