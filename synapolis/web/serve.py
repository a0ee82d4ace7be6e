"""Running the team server's app under uvicorn, and saying where it listens once it does."""

from __future__ import annotations

import os
import signal
import sys

PLAIN_ENV = "SYNAPOLIS_SERVE_PLAIN"  # "1": h11 and asyncio even where httptools and uvloop are installed


def http_stack(env=None) -> tuple[str, bool]:
    """(uvicorn's HTTP implementation, whether the event loop is uvloop's): httptools and uvloop where they are
    installed (the `serve` extra) and not turned off by SYNAPOLIS_SERVE_PLAIN=1, else h11 and asyncio, which
    uvicorn and the SDK bring anyway. The C parser and loop take 10-20% off the server's CPU per request
    (benchmarks/RESULTS.md, bench_serve)."""
    from importlib.util import find_spec

    if (os.environ if env is None else env).get(PLAIN_ENV) == "1":
        return "h11", False
    return ("httptools" if find_spec("httptools") else "h11"), find_spec("uvloop") is not None


GC_THRESHOLDS = (20_000, 20, 20)  # Python's default is (700, 10, 10) (before 3.13)


def settle_garbage_collector() -> None:
    """Once the app is built: what was made so far (the SDK, starlette, pydantic's schemas, our tools) lives
    as long as the process, so it is moved out of the collector's sight (`gc.freeze`), and the collector runs
    after 20,000 new objects rather than 700: each HTTP request makes hundreds (the request, its headers, its
    streams, the messages), so the default ran a collection every request or two. Cyclic garbage lives a little
    longer; 0.1-0.2 ms of server CPU per call less, side by side (docs/MCP.md)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def check_can_listen(host: str, port: int, certfile=None, keyfile=None) -> None:
    """Refuse, as one line, what would make uvicorn fail to start: a certificate and key that do not load
    (UsageError), a host that does not resolve or is not this machine's, a port not ours to take
    (UsageError), a port another process listens on (ConflictError). Uvicorn itself would log the cause,
    then exit its task with SystemExit inside ours: a traceback and exit 3, or an InternalError naming an
    ExceptionGroup. The addresses are bound as asyncio binds them (each one the host resolves to, reusing
    the address, IPv6 only on IPv6), then let go for uvicorn."""
    import errno
    import socket

    from ..errors import ConflictError, UsageError

    if certfile is not None:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"--certfile {certfile} and --keyfile {keyfile} are not a certificate (PEM) and "
                             f"its key: {getattr(exc, 'strerror', None) or exc}") from None
    shown = f"{host or '*'}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"cannot listen on {shown}: {getattr(exc, 'strerror', None) or exc}") from None
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == getattr(socket, "AF_INET6", None) and hasattr(socket, "IPV6_V6ONLY"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConflictError(f"cannot listen on {shown}: another process listens there "
                                    "(pick another --port, or 0 for any free one)") from None
            raise UsageError(f"cannot listen on {shown}: {exc.strerror or exc}") from None
        finally:
            sock.close()


def run(state_dir, *, host: str, port: int, certfile=None, keyfile=None, loopback: bool = True,
        force_polling: bool = False) -> None:
    import anyio
    import uvicorn

    from ..errors import UsageError
    from . import limits
    from .app import create_app

    class Server(uvicorn.Server):
        """Uvicorn's server, which tells the app it is stopping before it waits for the requests in flight:
        uvicorn waits up to timeout_graceful_shutdown for them, then cancels what is left (a traceback
        each), and an open event stream (a dashboard) never ends by itself. Told, the streams end at once."""

        def __init__(self, config, app):
            super().__init__(config)
            self.team_app = app

        async def shutdown(self, sockets=None):
            self.server_state.synapolis_stopping = True  # web/limits.py: a connection made from now is closed
            self.team_app.closing()
            await super().shutdown(sockets)

    check_can_listen(host, port, certfile, keyfile)
    from ..store import store_url
    from ..workspace import Workspace

    # a SYNAPOLIS_STORE_URL that does not parse: one line and exit 2 now, not a traceback from the app's start
    store_url(Workspace.open(state_dir))
    tls = certfile is not None
    http, uvloop = http_stack()
    app = create_app(state_dir, loopback=loopback, secure=tls, force_polling=force_polling, host=host)
    cap = limits.connection_cap()
    # no access log: nothing reads it, and formatting a line per request costs every call. The bounds of
    # web/limits.py: uvicorn's keep-alive for idle connections, our protocol class for the rest; no
    # limit_concurrency (it answers 503 but closes nothing; the protocol's cap closes); no WebSocket upgrade
    # (nothing here speaks it, and an upgraded connection would leave the protocol's count)
    config = uvicorn.Config(app, host=host, port=port, ssl_certfile=certfile, ssl_keyfile=keyfile,
                            http=limits.protocol_class(http, cap), ws="none", log_level="warning",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=2,
                            timeout_keep_alive=limits.KEEP_ALIVE_S, backlog=limits.BACKLOG,
                            h11_max_incomplete_event_size=limits.HEAD_BYTES_MAX)
    limits.quiet_floods()  # after uvicorn.Config, which sets its loggers up
    server = Server(config, app)
    settle_garbage_collector()

    failed = []

    async def serve():
        # uvicorn catches SIGINT and SIGTERM while it serves, then raises the one it caught again with the
        # handler found before it: the default one would kill the process by SIGTERM after a clean stop (exit
        # 143), so the handlers it finds ignore them, and the defaults come back once it is done
        stops = (signal.SIGINT, signal.SIGTERM)
        before = {number: signal.signal(number, signal.SIG_IGN) for number in stops}
        try:
            await server.serve()
        except SystemExit:  # uvicorn could not start after all (it logged why): taken between check and bind
            failed.append(True)
        finally:
            for number, handler in before.items():
                signal.signal(number, handler)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            while not server.started:
                if server.should_exit or failed:
                    return
                await anyio.sleep(0.02)
            bound = server.servers[0].sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            # the port actually taken (--port 0), for people and for scripts that start a server
            print(f"synapolis serve: listening on {'https' if tls else 'http'}://{shown}:{bound[1]} "
                  f"(MCP at /mcp, dashboard at /; {http}{', uvloop' if uvloop else ''}; at most {cap} connections)", file=sys.stderr, flush=True)

    anyio.run(main, backend_options={"use_uvloop": uvloop})
    if failed:
        raise UsageError(f"cannot listen on {host or '*'}:{port} (the line above says why)")
