"""The synapolis MCP server: the SDK's MCPServer with our error shape and compact schemas, built per state
directory with every tool, resource and push registered (`create_server`), whatever transport serves it."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

from . import stdio, tools
from .errors import as_synapolis_error, error_result
from .state import ServerState

INSTRUCTIONS = (
    "synapolis: coordination between parallel coding agents in one session. Call start_session once; later "
    "calls act as the agent it made: over stdio for this server process (before it, SYNAPOLIS_AGENT_ID/"
    "SYNAPOLIS_SESSION_ID/SYNAPOLIS_RUN_TOKEN of the server's environment apply); over HTTP for this MCP "
    "session, or with no session (2026-07-28) for this bearer token and client; a token pinned to an agent is "
    "that agent. Any tool may name agent_id (+run_token, session_id) explicitly; a wrong run_token is refused. "
    "Every result has pending_signals: signals delivered with this answer; handle them, then ack_signals. "
    "Answers are pages: pending_remaining > 0 means more wait (signals_pending delivers the next page). "
    "A signal: id, sequence, timestamp, sender, recipient, type, content, lamport, read, delivered_at; a sender "
    "synapolis.person.NAME is a person (person: NAME). "
    "Errors read '<Type> (exit N): message'. Subscribe to synapolis://session/{session_id}/inbox/{agent_id} "
    "to be told when a signal arrives."
)


def _compact_schema(node, collapse_optional: bool):
    """Drop what costs tokens and says nothing (titles, `default: null`, `additionalProperties: true`).

    `collapse_optional` turns `anyOf: [X, null]` into X: right for inputs (leaving a key out is how a
    caller says null), wrong for outputs, where null is a real value a client validates against.
    """
    if isinstance(node, list):
        return [_compact_schema(item, collapse_optional) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties" and value is True:
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: _compact_schema(sub, collapse_optional) for name, sub in value.items()}
        else:
            out[key] = _compact_schema(value, collapse_optional)
    options = out.get("anyOf")
    if collapse_optional and isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        (kept,) = [o for o in options if o != {"type": "null"}]
        out.pop("anyOf")
        out = {**kept, **out}
    return out




class SynapolisMCP(MCPServer):
    """MCPServer with the contract's error shape on every tool call and compact tool schemas."""

    _tools_cache: list | None = None
    fast_stdio = True
    lowlevel = None  # the SDK's low-level Server inside this one (`lowlevel_of`)

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except MCPError:
            raise
        except ToolError as exc:
            return error_result(as_synapolis_error(exc, name))

    async def list_tools(self):
        # the list is fixed once built; an agent pays for its size on every turn, so trim it once
        if self._tools_cache is None:
            listed = await super().list_tools()
            self._tools_cache = [
                tool.model_copy(update={
                    "input_schema": _compact_schema(tool.input_schema, True),
                    "output_schema": _compact_schema(tool.output_schema, False) if tool.output_schema else None,
                })
                for tool in listed
            ]
        return self._tools_cache

    async def run_stdio_async(self) -> None:
        """stdio on the event loop's own pipe I/O where it can (see `stdio`), else the SDK's."""
        await stdio.serve(self.lowlevel, fast=self.fast_stdio)


def lowlevel_of(server: MCPServer):
    """The SDK's low-level `Server` inside `server`, which serves `add_request_handler` and `run` on any
    streams. MCPServer keeps it private (a public accessor is planned, says the SDK's migration guide); its
    one public road today is the streamable HTTP session manager, documented for mounting the server in
    another app, which holds it as `app`. `streamable_http_app()` only builds that manager (nothing runs
    until its `run()`); the HTTP transport builds its own (`http.session_manager`).
    """
    server.streamable_http_app()
    return server.session_manager.app


async def _no_prompts(ctx, call_next):
    """Advertise no `prompts` capability: there are none, and a client that sees it asks for the empty list
    on every connect. The SDK registers the prompt handlers itself and has no public way to drop them; this
    middleware (the SDK's public seam around every message) edits the capabilities of the answer to the
    handshake (`initialize`) and to `server/discover` (2026-07-28)."""
    result = await call_next(ctx)
    if ctx.method in ("initialize", "server/discover") and isinstance(result, dict):
        capabilities = result.get("capabilities")
        if isinstance(capabilities, dict):
            capabilities.pop("prompts", None)
    return result


def create_server(state_dir, env=None, *, force_polling: bool = False, fast: bool = True) -> SynapolisMCP:
    """Build the server for one state directory; `env` is what the harness gave the process.

    `fast=False` does per call what the CLI does (resolve, open, refresh; the SDK's stdio; every verb on a
    worker thread; the watcher from the start): the baseline benchmarks/bench_mcp.py measures against.
    """
    from importlib.metadata import PackageNotFoundError, version

    state = ServerState(state_dir, env, force_polling=force_polling, fast=fast)

    @asynccontextmanager
    async def lifespan(_server):
        state.start_watching(anyio.lowlevel.current_token())
        if not fast:
            await anyio.to_thread.run_sync(state._start_watcher)
        try:
            yield {}
        finally:
            await anyio.to_thread.run_sync(state.stop_watching)

    try:
        server_version = version("synapolis")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        server_version = "0"
    server = SynapolisMCP("synapolis", version=server_version, instructions=INSTRUCTIONS,
                          subscriptions=state.bus, lifespan=lifespan, log_level="WARNING")
    server.state = state
    server.fast_stdio = fast
    server.lowlevel = lowlevel_of(server)
    server.middleware.append(_no_prompts)
    tools.register_tools(server, state)
    tools.register_resources(server, state)
    tools.register_subscriptions(server, state)
    return server

