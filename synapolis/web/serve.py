"""Running the team server's app under uvicorn, and saying where it listens once it does."""

from __future__ import annotations

import sys


def run(state_dir, *, host: str, port: int, certfile=None, keyfile=None, loopback: bool = True,
        force_polling: bool = False) -> None:
    import anyio
    import uvicorn

    from .app import create_app

    tls = certfile is not None
    app = create_app(state_dir, loopback=loopback, secure=tls, force_polling=force_polling)
    config = uvicorn.Config(app, host=host, port=port, ssl_certfile=certfile, ssl_keyfile=keyfile,
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                if server.should_exit:
                    return
                await anyio.sleep(0.02)
            bound = server.servers[0].sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            # the port actually taken (--port 0), for people and for scripts that start a server
            print(f"synapolis serve: listening on {'https' if tls else 'http'}://{shown}:{bound[1]} "
                  f"(MCP at /mcp, dashboard at /)", file=sys.stderr, flush=True)

    anyio.run(main)
