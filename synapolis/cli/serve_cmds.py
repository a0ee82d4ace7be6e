"""The `serve` verb: the team server (contract §13)."""

from __future__ import annotations

import click

from .common import pass_workspace


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Beyond loopback it needs a token to exist (synapolis tokens create).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to bind (0: any free port; the one taken is printed).")
@click.option("--certfile", type=click.Path(dir_okay=False, exists=True), default=None, help="TLS certificate (PEM).")
@click.option("--keyfile", type=click.Path(dir_okay=False, exists=True), default=None, help="TLS private key (PEM).")
@click.option("--polling", is_flag=True,
              help="Watch for changes by polling the state directory (for filesystems without inotify).")
@pass_workspace(create=True)
def serve_cmd(ws, host, port, certfile, keyfile, polling):
    """Serve the team: MCP over HTTP at /mcp, the dashboard at /, /api/status, /healthz.

    Every request needs a token from `synapolis tokens create` (as `Authorization: Bearer`, or the
    dashboard's sign-in). Setup for each harness: README "Serving a team", docs/MCP.md.

    Example: synapolis serve --host 0.0.0.0 --certfile cert.pem --keyfile key.pem
    """
    from ..errors import UsageError
    from ..tokens import exist

    if (certfile is None) != (keyfile is None):
        raise UsageError("--certfile and --keyfile go together")
    loopback = is_loopback(host)
    if not loopback and not exist(ws):
        raise UsageError(f"refusing to serve on {host}, beyond loopback, while no token exists: "
                         "create one first with `synapolis tokens create NAME`")
    tls = certfile is not None
    if not loopback and not tls:
        click.echo(f"synapolis serve: warning: plain HTTP on {host}: tokens and traffic cross the network in "
                   "clear; put TLS in front (--certfile/--keyfile, or a reverse proxy)", err=True)
    if not exist(ws):
        click.echo("synapolis serve: no token exists yet; every request will be refused until you run "
                   "`synapolis tokens create NAME`", err=True)
    # the SDK, starlette and uvicorn are imported here and nowhere else on the CLI's paths
    from ..store import keep_connections
    from ..web.serve import run

    keep_connections()  # a database store keeps a pool: this process serves many requests at once

    run(ws.root, host=host, port=port, certfile=certfile, keyfile=keyfile, loopback=loopback,
        force_polling=polling)
