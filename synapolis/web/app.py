"""The team server's web app: `/mcp` (the MCP server over streamable HTTP), `/` (the dashboard and its
login), `/events` (server-sent change events), `/api/dashboard`, `/api/agent?id=` (one agent's history),
`/api/post`, `/api/ack` (an incident), `/api/status`, `/healthz`, `/favicon.ico`.

People sign in with a token once (a form); the token then rides in a cookie that is HttpOnly (no script
reads it) and SameSite=Strict (no other site's page sends it), and Secure over TLS. Posting also needs a
CSRF token, an HMAC of the sign-in token under a key this process made, which only a page of ours can
read. `/mcp` takes only the bearer header, never the cookie. Every library call runs on a worker thread.
"""

from __future__ import annotations

import hmac
import secrets
from contextlib import asynccontextmanager
from hashlib import sha256
from pathlib import Path
from urllib.parse import parse_qsl

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import dashboard, overview, people
from . import api_call
from ..errors import BusyError, ForbiddenError, SynapolisError, UsageError
from ..mcp.http import BearerGate, bearer, principal_for, session_manager
from ..mcp.server import create_server
from ..tokens import TokenBook, digest

COOKIE = "synapolis_token"
KEEPALIVE_S = 15.0
EVENT_STREAMS_MAX = 64  # open dashboards (event streams) at once; each holds a connection for as long as it is open
_HTTP_STATUS = {1: 500, 2: 400, 3: 409, 4: 400, 5: 429, 6: 404, 7: 403, 8: 503}
FORM_TYPE = "application/x-www-form-urlencoded"  # what the login form and the page's posts send
LOGIN_BODY_MAX = 16 * 1024  # a sign-in carries one token (~50 characters)
FORM_FIELDS_MAX = 64
_PAGE = Path(__file__).with_name("dashboard.html")
# the tab's icon: a pulse (a heartbeat) on a dark tile; SVG, which browsers take at /favicon.ico too
FAVICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="7" '
           b'fill="#1b1f24"/><path d="M3 17h7l3-8 5 15 3-7h8" fill="none" stroke="#4ac26b" stroke-width="3" '
           b'stroke-linecap="round" stroke-linejoin="round"/></svg>')
_LOGIN = Path(__file__).with_name("login.html")


def _error(exc: SynapolisError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=_HTTP_STATUS.get(exc.exit_code, 500))


def _refused() -> JSONResponse:
    # the same answer whatever was wrong: no token, a wrong one, a revoked one
    return JSONResponse({"error": {"type": "Unauthorized", "message": "a valid token is required"}},
                        status_code=401, headers={"www-authenticate": 'Bearer realm="synapolis"'})


def create_app(state_dir, *, loopback: bool = True, secure: bool = False, env=None,
               force_polling: bool = False, host: str | None = None) -> Starlette:
    server = create_server(state_dir, env, force_polling=force_polling)
    state = server.state
    book = TokenBook(state.workspace())
    manager = session_manager(server, loopback=loopback, host=host)  # host: the address served
    poster = dashboard.Poster(state.workspace)
    csrf_key = secrets.token_bytes(32)
    # the server is stopping (TeamApp.closing): made in the lifespan, an anyio Event needs the running loop
    stopping: dict = {"event": None, "streams": 0}

    def signed_in(request: Request):
        """(token record, token, from the cookie?) for a valid bearer header or sign-in cookie, else None."""
        token = bearer(request.headers)
        from_cookie = token is None
        if from_cookie:
            token = request.cookies.get(COOKIE)
        record = book.verify(token)
        return None if record is None else (record, token, from_cookie)

    def csrf_for(token: str) -> str:
        return hmac.new(csrf_key, digest(token).encode(), sha256).hexdigest()

    def collect() -> dict:
        """The page's data. The server first holds a connection to each active session (as it does for the
        sessions its tools work in): otherwise the page's own read, as the last connection out, would
        checkpoint and delete a WAL, a change that fires the next event, and the page would refetch forever."""
        ws = state.workspace()
        for session_id in dashboard.shown_sessions(ws):
            state.keep_open(ws, session_id)
        return dashboard.collect(ws)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def api_status(request: Request) -> Response:
        if signed_in(request) is None:
            return _refused()
        return JSONResponse(await anyio.to_thread.run_sync(lambda: overview.collect(state.workspace())))

    async def api_dashboard(request: Request) -> Response:
        who = signed_in(request)
        if who is None:
            return _refused()
        record, token, _ = who
        data = await anyio.to_thread.run_sync(collect)
        data["me"] = {"token": record["name"], "agent_id": record.get("agent_id"),
                      "read_only": bool(record.get("read_only")), "csrf": csrf_for(token),
                      # who the page posts as: the pinned agent, else this token's person (people.py)
                      "posts_as": None if record.get("read_only") else
                      record.get("agent_id") or people.person_id(record["name"])}
        data["changes"] = state.changes
        return JSONResponse(data, headers={"cache-control": "no-store"})

    async def api_agent(request: Request) -> Response:
        if signed_in(request) is None:
            return _refused()
        agent_id = request.query_params.get("id") or ""
        data = await anyio.to_thread.run_sync(lambda: dashboard.agent_view(state.workspace(), agent_id))
        return JSONResponse(data, headers={"cache-control": "no-store"})

    async def api_ack(request: Request) -> Response:
        who = signed_in(request)
        if who is None:
            return _refused()
        record, token, from_cookie = who
        form = await _read_form(request, LOGIN_BODY_MAX)
        if isinstance(form, Response):
            return form
        if from_cookie and (not hmac.compare_digest(str(form.get("csrf") or ""), csrf_for(token))
                            or _cross_site(request)):
            return _cross_site_refused()
        principal = principal_for(record)

        def ack():
            from ..escalation import ack as ack_incident

            principal.check_may_write()
            incident_id = _field(form, "incident_id")
            if not incident_id:
                raise UsageError("name the incident to ack")
            return ack_incident(state.workspace(), incident_id)

        return JSONResponse(await anyio.to_thread.run_sync(ack))

    async def favicon(request: Request) -> Response:
        return Response(FAVICON, media_type="image/svg+xml", headers={"cache-control": "max-age=86400"})

    async def events(request: Request) -> Response:
        who = signed_in(request)
        if who is None:
            return _refused()
        token = who[1]
        headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
        if request.method == "HEAD":
            # the headers alone, and the end: an endless stream with its body dropped never ended, and a
            # keep-alive client's next request on the connection was never answered
            return Response(media_type="text/event-stream", headers=headers)

        if stopping["streams"] >= EVENT_STREAMS_MAX:
            return JSONResponse(BusyError(f"{EVENT_STREAMS_MAX} event streams are open, the most this server "
                                          "keeps; try again later").to_json(), status_code=503,
                                headers={"retry-after": "30"})

        async def stream():
            stopping["streams"] += 1
            try:
                seen = state.changes
                yield f"event: hello\ndata: {seen}\n\n"
                while True:
                    now = await _next_change_or_stop(state, seen, stopping["event"])
                    if now is None:  # the server is stopping: the stream ends, and the page reconnects later
                        return
                    if await request.is_disconnected():
                        return
                    if book.verify(token) is None:  # revoked while the page was open: the stream ends with it
                        return
                    if now == seen:
                        yield ": keepalive\n\n"
                    else:
                        seen = now
                        yield f"event: change\ndata: {seen}\n\n"
            finally:
                stopping["streams"] -= 1

        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def api_post(request: Request) -> Response:
        who = signed_in(request)
        if who is None:
            return _refused()
        record, token, from_cookie = who
        content_max = int(state.workspace().config.max_content_bytes)
        # a note or a signal's content is at most max_content_bytes, each byte at most 3 when URL-encoded
        form = await _read_form(request, 3 * content_max + LOGIN_BODY_MAX)
        if isinstance(form, Response):
            return form
        if from_cookie:  # a browser: the page's CSRF token, and no other site's origin
            if not hmac.compare_digest(str(form.get("csrf") or ""), csrf_for(token)) or _cross_site(request):
                return _cross_site_refused()
        principal = principal_for(record, token)

        def post():
            principal.check_may_write()
            # a person posts as a person, never "as" an agent they name: a pinned token posts as its agent, and
            # an agent_id the form still sends must be that one (ForbiddenError otherwise)
            named = _field(form, "agent_id") or None
            if named is not None and (principal.agent_id is None or named != principal.agent_id):
                raise ForbiddenError(f"token {principal.name} posts as "
                                     + (f"agent {principal.agent_id}" if principal.agent_id else "a person")
                                     + f", not as {named}")
            session_id = _field(form, "session_id")
            if not session_id:
                raise UsageError("pick a session")
            kind = _field(form, "kind") or "note"
            if kind not in ("note", "signal"):  # a typo must not post the form's text as a note
                raise UsageError(f"kind must be note or signal, not {kind!r}")
            key = _field(form, "idempotency_key") or None  # the page sets one per post (dashboard.html)
            if kind == "signal":
                return poster.post(principal.name, principal.agent_id, session_id, to=_field(form, "to"),
                                   content=_field(form, "content"), type=_field(form, "type") or "inform",
                                   idempotency_key=key)
            return poster.post(principal.name, principal.agent_id, session_id, note=_field(form, "text"),
                               idempotency_key=key)

        return JSONResponse(await anyio.to_thread.run_sync(post))

    async def page(request: Request) -> Response:
        if signed_in(request) is None:
            return HTMLResponse(_LOGIN.read_text(encoding="utf-8").replace("{{message}}", ""),
                                headers=_PAGE_HEADERS)
        return HTMLResponse(_PAGE.read_text(encoding="utf-8"), headers=_PAGE_HEADERS)

    async def login(request: Request) -> Response:
        # another site's page auto-submitting this form would sign the browser in with a token of its choosing
        # (SameSite=Strict keeps the cookie from being sent cross-site, not from being set by the answer)
        if _cross_site(request):
            return _cross_site_refused()
        form = await _read_form(request, LOGIN_BODY_MAX)
        if isinstance(form, Response):
            return form
        token = _field(form, "token").strip()
        if book.verify(token) is None:
            return HTMLResponse(_LOGIN.read_text(encoding="utf-8").replace(
                "{{message}}", '<p class="error" role="alert">That token is not valid.</p>'),
                status_code=401, headers=_PAGE_HEADERS)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/")
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure)
        return response

    @asynccontextmanager
    async def lifespan(_app):
        stopping["event"] = anyio.Event()
        async with manager.run():
            await state.start_change_feed()
            yield

    mcp = BearerGate(StreamableHTTPASGIApp(manager), book, on_end=state.forget)
    routes = [
        Route("/mcp", mcp),  # through the router only when TeamApp leaves a request to starlette (a root_path)
        Route("/healthz", healthz),
        Route("/api/status", api_status),
        Route("/api/dashboard", api_dashboard),
        Route("/api/agent", api_agent),
        Route("/api/post", api_post, methods=["POST"]),
        Route("/api/ack", api_ack, methods=["POST"]),
        Route("/favicon.ico", favicon),
        Route("/events", events),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", page),
        # §16: the CLI and hooks of remote machines; a follower's long-poll ends when the server stops
        *api_call.routes(state, signed_in, _refused, _error,
                         stopping=lambda: stopping["event"] is not None and stopping["event"].is_set()),
    ]
    # a verb's refusal, a synapolis.json broken since the server started, a store away: the error's JSON with
    # its HTTP status, in one place for every route (/mcp answers its own errors)
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={SynapolisError: lambda _request, exc: _error(exc)})
    app.state.synapolis = state
    team = TeamApp(app, mcp)
    team.closing = lambda: stopping["event"] is not None and stopping["event"].set()
    return team


async def _next_change_or_stop(state, seen: int, stop) -> int | None:
    """state.next_change(seen, KEEPALIVE_S), or None as soon as `stop` (an anyio Event) is set."""
    if stop is None:
        return await state.next_change(seen, KEEPALIVE_S)
    if stop.is_set():
        return None
    found = []
    async with anyio.create_task_group() as tg:
        async def change():
            found.append(await state.next_change(seen, KEEPALIVE_S))
            tg.cancel_scope.cancel()

        async def stopped():
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(change)
        tg.start_soon(stopped)
    return found[0] if found else None


class TeamApp:
    """ASGI: an HTTP request for `/mcp` straight to the MCP endpoint, everything else (the page, the API, the
    lifespan) to the starlette app. MCP calls are most of the traffic, and starlette's own layers (its error
    and exception middlewares, the router's matching) did nothing for them but cost each one: the endpoint
    answers every error itself, and uvicorn answers 500 to anything that escapes an app."""

    def __init__(self, app: Starlette, mcp):
        self.app = app
        self.mcp = mcp
        self.closing = lambda: None  # create_app's: ends the event streams when the server stops
        self.state = app.state  # what create_app's callers read (`app.state.synapolis`)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/mcp" and not scope.get("root_path"):
            return await self.mcp(scope, receive, send)
        return await self.app(scope, receive, send)


# nothing on the page comes from elsewhere, and nothing else may frame it; no address of ours is told to
# another site, while our own requests carry our origin (under no-referrer a browser sends `Origin: null` with
# the sign-in form, which could not be told from another site's sandboxed page)
_PAGE_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff", "referrer-policy": "same-origin", "cache-control": "no-store",
}


async def _read_form(request: Request, limit: int) -> dict | Response:
    """The fields of a URL-encoded form body of at most `limit` bytes, else the refusal to answer with.

    Not starlette's `request.form()`: before any token is checked (the sign-in), that parses multipart bodies
    too, spooling each file part to a temporary file of any size, and keeps up to 1000 fields of 1 MB each
    in memory: anyone who could reach the port could fill the server's disk or memory. Ours read at most
    `limit` bytes, of the one type our pages send."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != FORM_TYPE:
        return _bad_body(415, f"a form must be sent as {FORM_TYPE}")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return _bad_body(413, f"a form may be at most {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return _bad_body(413, f"a form may be at most {limit} bytes")
    try:
        # the bytes of a field, raw or %-escaped, are UTF-8 (WHATWG's URL-encoded parser; curl -d sends them
        # raw), an invalid sequence replaced: the raw ones decoded here, the escaped ones by parse_qsl
        return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True,
                              max_num_fields=FORM_FIELDS_MAX))
    except ValueError:
        return _bad_body(400, f"a form may have at most {FORM_FIELDS_MAX} fields")


def _cross_site(request: Request) -> bool:
    """Whether a browser sent this request from a page of another origin than this server's (no Origin: not
    a browser's cross-site post, which always carries one)."""
    origin = request.headers.get("origin")
    return origin is not None and origin.split("://", 1)[-1] != request.headers.get("host")


def _cross_site_refused() -> JSONResponse:
    return JSONResponse(ForbiddenError("cross-site request refused").to_json(), status_code=403)


def _bad_body(status: int, message: str) -> JSONResponse:
    return JSONResponse(UsageError(message).to_json(), status_code=status)


def _field(form, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""
