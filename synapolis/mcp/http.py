"""The streamable HTTP transport (contract §13): the same server as stdio at `/mcp`, behind bearer tokens.

Every request must carry `Authorization: Bearer <token>` naming a token of `synapolis tokens` (re-read when
tokens.json changes: a revocation applies to the next request). Without a valid one the answer is 401 and
nothing else happens: the body says only that a token is needed, never which agents exist. A valid token
becomes the request's Principal (in the ASGI scope, where the tools read it) and the SDK's authenticated
user, so the SDK also refuses an MCP session to any token but the one that opened it.
"""

from __future__ import annotations

import json

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from ..tokens import digest
from .state import PRINCIPAL_KEY, Principal

LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]


def _header(raw_headers, name: str) -> str | None:
    """One header of ASGI raw headers (a list of byte pairs), by its lower-case name."""
    raw = next((v for k, v in raw_headers if k.lower() == name.encode()), None)
    return raw.decode("latin-1") if raw is not None else None


def bearer(headers) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (ASGI raw headers or a mapping), else None."""
    if isinstance(headers, list):
        value = _header(headers, "authorization")
    else:
        value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def principal_for(record: dict, presented: str | None = None) -> Principal:
    """The Principal of a verified token record; `presented`: the bearer token itself, kept for the request."""
    return Principal(record["name"], record.get("agent_id"), bool(record.get("read_only")),
                     key=digest(presented) if presented else None, secret=presented)


async def unauthorized(send, message: str = "a valid bearer token is required (synapolis tokens create)") -> None:
    body = json.dumps({"error": {"type": "Unauthorized", "message": message}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="synapolis"')]})
    await send({"type": "http.response.body", "body": body})


class BearerGate:
    """ASGI: admit a request to `app` only with a valid bearer token, as that token's Principal. `on_end`
    hears the key (`state.client_key`) of each MCP session a client ends (its DELETE)."""

    def __init__(self, app, book, on_end=None):
        self.app = app
        self.book = book  # tokens.TokenBook
        self.on_end = on_end

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        presented = bearer(scope.get("headers") or [])
        record = self.book.verify(presented)
        if record is None:
            return await unauthorized(send)
        scope[PRINCIPAL_KEY] = principal_for(record, presented)
        # the SDK's session ownership compares this: one token's MCP session is not another's, nor that of a
        # new token given the name of a revoked one (its hash, not its name, says which token it is)
        scope["user"] = AuthenticatedUser(AccessToken(
            token="-", client_id=f"synapolis-token:{record['name']}:{digest(presented)}", scopes=[]))
        send = self._streams_end_when_revoked(presented, send)
        if self.on_end is None or scope.get("method") != "DELETE":
            return await self.app(scope, receive, send)
        status = []

        async def send_seeing_status(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, send_seeing_status)
        session_id = _header(scope.get("headers") or [], MCP_SESSION_ID_HEADER)
        if session_id and status and status[0] < 400:  # the SDK ended it (a stranger's DELETE is a 404)
            self.on_end(("http", session_id))


    def _streams_end_when_revoked(self, presented, send):
        """`send`, for a response that streams (the standing GET stream, a 2026-07-28 listen stream): each
        event it carries is sent only while the request's token (`presented`) is still valid. Revocation
        applies from the next request (§13), and a stream is one request that lasts: once the token is
        revoked (or tokens.json changed to refuse it) the stream is ended before the next push or keepalive,
        which would tell a revoked holder what changed. Ending the response also ends the SDK's side: the
        server's receive() answers http.disconnect once the response is complete."""
        state = {"streaming": False, "ended": False}
        book = self.book

        async def send_while_valid(message):
            if state["ended"]:
                return  # the stream was ended: what the SDK still writes goes nowhere
            kind = message["type"]
            if kind == "http.response.start":
                state["streaming"] = any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                                         for name, value in message.get("headers") or [])
            elif state["streaming"] and message.get("more_body") and book.verify(presented) is None:
                state["ended"] = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        return send_while_valid


def session_manager(server, *, loopback: bool, host: str | None = None) -> StreamableHTTPSessionManager:
    """The SDK's streamable HTTP session manager for `server` (both protocol eras: sessions for the
    handshake era, per-request for 2026-07-28). On loopback it checks Host and Origin against DNS
    rebinding, as the SDK does by default there: the usual loopback names and `host`, the address served
    (any 127.x is loopback, and its clients name it); elsewhere the bearer token is the guard and the Host
    is whatever name a proxy or the team uses."""
    hosts = list(LOOPBACK_HOSTS)
    if host:
        served = f"[{host.strip('[]')}]:*" if ":" in host else f"{host}:*"
        hosts += [served] if served not in hosts else []
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts,
        allowed_origins=[f"{scheme}://{name}" for scheme in ("http", "https") for name in hosts],
    ) if loopback else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    # JSON answers rather than an SSE stream per request: a tool call over HTTP is ~1.5 ms faster here, and
    # pushes travel on the standing GET stream (handshake era) or the listen stream (2026-07-28) either way
    return StreamableHTTPSessionManager(app=server.lowlevel, security_settings=security, json_response=True)
