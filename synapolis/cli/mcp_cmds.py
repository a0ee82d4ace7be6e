"""The `mcp` verb: the MCP server over stdio (contract §10)."""

from __future__ import annotations

import click

from .common import pass_workspace


@click.command("mcp")
@click.option("--polling", is_flag=True,
              help="Watch for new signals by polling the sessions folder (for filesystems without inotify).")
@pass_workspace(create=True)
def mcp_cmd(ws, polling):
    """Serve synapolis as MCP tools and resources over stdin/stdout, for a harness's MCP config.

    Identity comes from SYNAPOLIS_AGENT_ID / SYNAPOLIS_SESSION_ID / SYNAPOLIS_RUN_TOKEN in the server's
    environment, from the start_session tool, or from each call's agent_id and run_token.
    Configuration snippets for each harness: docs/MCP.md.

    Example: synapolis --state-dir ./state mcp
    """
    # the SDK is imported behind the front (mcp/front.py), and nowhere else on the CLI's paths: it is slow
    from ..mcp.front import serve

    serve(ws.root, polling)
