"""The stdio transport on the event loop's own pipe I/O (what `synapolis mcp` runs).

The SDK's stdio wraps the process's files and runs each readline, write and flush on a worker thread, three
thread hops per message; where stdin and stdout are pipes or sockets (what every harness gives a server)
these read and write them from the loop itself. Anything else (a file, a terminal) gets the SDK's stdio.

`serve_behind` is the same serving, with `synapolis mcp`'s front (mcp/front.py) between the wire and the SDK.
Importing this module imports neither anyio nor the SDK: the front uses `take_wire` before they load.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import asynccontextmanager


async def serve(lowlevel_server, *, fast: bool = True) -> None:
    """Serve `lowlevel_server` (an SDK low-level Server) over this process's stdin and stdout until EOF."""
    from mcp.server.stdio import stdio_server

    if fast and _pipes(0, 1):
        async with _pipe_stdio() as (stdin, stdout), stdio_server(stdin, stdout) as (read_stream, write_stream):
            await lowlevel_server.run(AnsweringBadLines(read_stream, write_stream), write_stream,
                                      lowlevel_server.create_initialization_options())
    else:
        async with stdio_server() as (read_stream, write_stream):
            await lowlevel_server.run(AnsweringBadLines(read_stream, write_stream), write_stream,
                                      lowlevel_server.create_initialization_options())


class AnsweringBadLines:
    """The SDK's stdio read stream, with each line that is not a JSON-RPC message answered as JSON-RPC 2.0
    says (§5.1: id null; -32700 for text that is not JSON, -32600 for JSON that is not a request, response
    or notification) instead of dropped unanswered, which is what the SDK's dispatcher does with them; so a
    client that sent a broken line learns it at once rather than waiting on a request that never arrived.
    Everything else passes through unchanged (the SDK's read-stream protocol: iteration, receive, close,
    `last_context`)."""

    def __init__(self, inner, write_stream):
        self._inner, self._write = inner, write_stream

    @property
    def last_context(self):
        return getattr(self._inner, "last_context", None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._next_message(self._inner.__anext__)

    async def receive(self):
        return await self._next_message(self._inner.receive)

    async def _next_message(self, take):
        """The next item `take` gives that is a message; each bad line before it answered."""
        while True:
            item = await take()
            if not isinstance(item, Exception):
                return item
            await self._answer(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self):
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._inner.__aexit__(*exc)

    async def _answer(self, exc: Exception) -> None:
        import anyio
        from mcp.shared.message import SessionMessage
        from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

        errors = exc.errors() if callable(getattr(exc, "errors", None)) else []
        not_json = any(e.get("type") == "json_invalid" for e in errors)
        error = ErrorData(code=PARSE_ERROR, message="Parse error: the line is not JSON") if not_json else \
            ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 request, response or notification")
        try:
            await self._write.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error)))
        except anyio.ClosedResourceError:
            pass  # the client went away: nobody to tell


async def serve_behind(lowlevel_server, front, queued, wire, begun: bytes = b"") -> None:
    """Serve `lowlevel_server` on `wire` (from `take_wire`) with `front` answering what it can: the SDK reads
    the lines `queued` before the front took over, then each line the front passes on (the first one `begun`
    before); what the SDK writes goes out unless the front drops it (the answer to a request it replayed)."""
    from mcp.server.stdio import stdio_server

    async with _pipe_stdio(wire) as (stdin, stdout):
        stdin.begin_with(begun)
        front.send = stdout.put
        lines = _FrontLines(front, stdin, queued)
        async with stdio_server(lines, _FrontWriter(front, stdout)) as (read_stream, write_stream):
            await lowlevel_server.run(AnsweringBadLines(read_stream, write_stream), write_stream,
                                      lowlevel_server.create_initialization_options())


class _FrontLines:
    """The lines the SDK reads: those queued, then each line of the wire the front does not answer itself."""

    def __init__(self, front, lines, queued):
        self._front, self._lines, self._queued = front, lines, deque(queued)

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while not self._queued:
            self._queued.extend(self._front.take(await self._lines.__anext__()))
        return self._queued.popleft()


class _FrontWriter:
    """stdout as the SDK writes it, minus what the front drops."""

    def __init__(self, front, writer):
        self._front, self._writer = front, writer

    async def write(self, text: str) -> None:
        if not self._front.drops(text):
            await self._writer.write(text)

    async def flush(self) -> None:
        await self._writer.flush()


def _pipes(*fds: int) -> bool:
    import stat

    if os.name != "posix":
        return False
    try:
        return all(stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in fds)
    except OSError:
        return False


class _PipeLines:
    """stdin as the SDK's stdio_server reads it (`async for line`), straight from the event loop."""

    def __init__(self, reader):
        self._reader = reader
        self._buffer = bytearray()
        self._scanned = 0

    def begin_with(self, data: bytes) -> None:
        """Read `data` (read off the wire before this reader existed) first."""
        self._buffer[:0] = data

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end + 1])
                del self._buffer[:end + 1]
                self._scanned = 0
                return line.decode("utf-8", errors="replace")
            self._scanned = len(self._buffer)
            chunk = await self._reader.read(1 << 16)
            if not chunk:  # end of input: a last line without its newline still counts, as for readline
                if not self._buffer:
                    raise StopAsyncIteration
                line, self._buffer[:] = bytes(self._buffer), b""
                return line.decode("utf-8", errors="replace")
            self._buffer += chunk


class _PipeWriter:
    """stdout as the SDK's stdio_server writes it (`await write`, `await flush`), without a thread."""

    def __init__(self, writer):
        self._writer = writer

    def put(self, text: str) -> None:
        """`text` onto the wire now (the transport buffers what the pipe does not take yet)."""
        import anyio

        if self._writer.transport.is_closing():
            raise anyio.ClosedResourceError  # the client went away: the SDK's writer ends quietly on this
        self._writer.write(text.encode("utf-8"))

    async def write(self, text: str) -> None:
        self.put(text)

    async def flush(self) -> None:
        import anyio

        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            raise anyio.ClosedResourceError from None


def take_wire():
    """(wire in, wire out): private duplicates of fds 0 and 1, as the SDK's stdio takes them: from now on fd 0
    reads /dev/null and fd 1 writes to stderr, so a stray print or a child process never corrupts the
    protocol. `_pipe_stdio` puts both back on its way out."""
    import fcntl

    wire_in = os.fdopen(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3), "rb", buffering=0)
    wire_out = os.fdopen(fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        try:
            os.dup2(2, 1)
        except OSError:  # no stderr: stray output goes nowhere rather than onto the wire
            os.dup2(null, 1)
    finally:
        os.close(null)
    return wire_in, wire_out


@asynccontextmanager
async def _pipe_stdio(wire=None):
    """(stdin lines, stdout writer) on `wire` (`take_wire`'s, taken here when not given), from the event loop;
    fds 0 and 1 are put back on the way out."""
    import asyncio

    loop = asyncio.get_running_loop()
    wire_in, wire_out = wire or take_wire()
    transports = []
    try:
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire_in)
        transports.append(transport)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, wire_out)
        transports.append(transport)
        yield _PipeLines(reader), _PipeWriter(asyncio.StreamWriter(transport, protocol, None, loop))
    finally:
        for fd, wire in ((0, wire_in), (1, wire_out)):
            try:
                os.dup2(wire.fileno(), fd)
                os.set_blocking(fd, True)
            except (OSError, ValueError):
                pass
        for transport in transports:
            transport.close()  # closes its duplicate
        for wire in (wire_in, wire_out)[len(transports):]:
            wire.close()
