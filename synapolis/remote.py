"""The remote mode (contract §16): the verbs and hooks of a machine that has only a `synapolis serve` URL and a token.

One more implementation behind the verbs: the same functions as `actions` (and `sleep.tired`,
`overview.collect`), each a call of the server's `/api/call/<verb>` (web/api_call.py), which runs the
library verb there with the identity rules of MCP over HTTP. Nothing of a store is opened or created
here: the state directory holds only this machine's own files (identity.json, heartbeats/).

Hot path: a hook or a verb through the server loads `http.client` (stdlib), nothing more; a blocked
or absent server is BusyError (exit 8) within busy_timeout_ms plus a connect timeout of at most 10 s.
"""

from __future__ import annotations

import json
import os

from .errors import BusyError, ForbiddenError, SynapolisError, UsageError

ENV_SERVER = "SYNAPOLIS_SERVER"
ENV_TOKEN = "SYNAPOLIS_TOKEN"
CONNECT_TIMEOUT_S = 10.0
# the verbs a machine without the store has, by CLI name; the rest work beside the store
CLI_VERBS = ("start", "beat", "signal", "read-signals", "ack-signals", "signals-pending", "note", "read-notes",
             "list-agents", "whiteboard-write", "whiteboard-read", "claim", "release", "claims", "claim-check",
             "guard", "tired", "memories", "escalations", "status", "doctor", "hook", "hooks")
# library functions (actions.*) the server runs for /api/call/<name>
ACTION_VERBS = ("start", "beat", "signal", "read_signals", "ack_signals", "signals_pending", "note", "read_notes",
                "list_agents", "whiteboard_write", "whiteboard_read", "claim", "release", "claim_check", "guard")
# the verbs that stay beside the store, and why (docs/API.md, "Verbs that stay beside the store")
LOCAL_ONLY = {
    "init": "nothing to set up here (the verbs make this machine's own files as they need them); run it there",
    "tokens": "tokens are the server's; run it on the server's machine",
    "serve": "a server of its own would serve this machine's store; unset SYNAPOLIS_SERVER to run one",
    "mcp": "a harness speaks MCP to the server itself: {url}/mcp with the token as its bearer (docs/MCP.md)",
    "monitor": "the monitor runs where the heartbeats and the store are: on the server's machine",
    "escalate": "escalation runs beside the store (the watchdog's cron on the server's machine)",
    "watchdog": "the watchdog's cron runs beside the store, on the server's machine",
    "notify": "the notify targets are the server's configuration; run it on the server's machine",
}
FOLLOW_WAIT_S = 10.0  # one long-poll of `read-signals --follow`; the server answers at once when a signal comes
ENV_FOLLOW_POLL = "SYNAPOLIS_FOLLOW_POLL_S"  # a shorter poll, for a proxy that cuts idle requests sooner
FOLLOW_RETRIES = 3    # reconnects in a row before a follower gives up (exit 8), backing off 0.5, 1, 2 s


class Target:
    """A server to go through: its URL split for http.client, and the token with the name of its variable."""

    __slots__ = ("url", "tls", "host", "port", "prefix", "token", "token_var", "busy_s")

    def __init__(self, url: str, token: str | None, token_var: str, busy_s: float):
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("http", "https") or not rest.split("/", 1)[0]:
            raise UsageError(f"{ENV_SERVER} must be an http:// or https:// URL of a `synapolis serve`, not {url!r}")
        netloc, _, path = rest.partition("/")
        netloc = netloc.rpartition("@")[2]
        host, port = netloc, None
        if netloc.startswith("["):  # [::1]:8765
            host, closed, tail = netloc[1:].partition("]")
            if not closed or (tail and not tail.startswith(":")):
                raise UsageError(f"{ENV_SERVER} {url!r} is not a URL (an IPv6 address goes in [brackets])")
            port = tail[1:] or None
        elif netloc.count(":") == 1:
            host, _, port = netloc.partition(":")
        try:
            port = int(port) if port else (443 if scheme == "https" else 80)
        except ValueError:
            raise UsageError(f"{ENV_SERVER} {url!r} has a port that is not a number") from None
        self.url, self.tls, self.host, self.port = url, scheme == "https", host, port
        self.prefix = "/" + path.strip("/") if path.strip("/") else ""
        self.token, self.token_var, self.busy_s = token, token_var, busy_s

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def follow_poll_s(env) -> float:
    """How long one long-poll of `read-signals --follow` waits: FOLLOW_WAIT_S, or $SYNAPOLIS_FOLLOW_POLL_S."""
    raw = env.get(ENV_FOLLOW_POLL)
    if not raw:
        return FOLLOW_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 25:  # 25: the server's own bound on one poll (web/api_call.FOLLOW_WAIT_MAX_S)
        raise UsageError(f"{ENV_FOLLOW_POLL} must be a number of seconds from 0.1 to 25, not {raw!r}")
    return value


def target(config, env=None) -> Target | None:
    """The server this machine goes through ($SYNAPOLIS_SERVER, else the config's `server`), or None."""
    env = os.environ if env is None else env
    values = config.values
    url = env.get(ENV_SERVER) or values.get("server")
    if not url:
        return None
    token_var = values.get("token_env") or ENV_TOKEN
    return Target(url, env.get(token_var) or None, token_var, values.get("busy_timeout_ms", 5000) / 1000)


# -- the wire ---------------------------------------------------------------------------------------

_CONNECTIONS: dict = {}  # one keep-alive connection per server, for a process that makes several calls


def request(t: Target, method: str, path: str, body: bytes | None = None, *, timeout_s: float | None = None,
            auth: bool = True, extra_headers: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of one request to the server; BusyError naming the host when it cannot be reached in
    time: a connect timeout of at most CONNECT_TIMEOUT_S, the whole call within `timeout_s`."""
    import time

    total = t.busy_s + CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    if auth and not t.token:
        raise ForbiddenError(f"no token for the server {t.where}: set {t.token_var} "
                             f"(`synapolis tokens create NAME` on the server prints one)")
    headers = {"content-type": "application/json"}
    headers.update(extra_headers or {})
    if auth:
        headers["authorization"] = f"Bearer {t.token}"
    deadline = time.monotonic() + total
    try:
        if t.tls:
            return _over_http_client(t, method, path, body, headers, deadline)
        return _over_socket(t, method, path, body, headers, deadline)
    except (OSError, ValueError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (
            getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        raise BusyError(f"the server {t.where} cannot be reached ({reason}); is `synapolis serve` running "
                        f"at {t.url}?") from None


def _connect_timeout(deadline: float) -> float:
    import time

    return max(min(CONNECT_TIMEOUT_S, deadline - time.monotonic()), 0.05)


def _over_http_client(t, method, path, body, headers, deadline):
    """HTTPS: the standard library's client (TLS needs `ssl` anyway), one keep-alive connection per server."""
    import http.client
    import time

    for attempt in (1, 2):
        conn = _CONNECTIONS.get(t.url)
        reused = conn is not None
        if conn is None:
            conn = _CONNECTIONS[t.url] = http.client.HTTPSConnection(t.host, t.port,
                                                                     timeout=_connect_timeout(deadline))
        try:
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(max(deadline - time.monotonic(), 0.05))
            conn.request(method, t.prefix + path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            _CONNECTIONS.pop(t.url, None)
            if reused and attempt == 1 and not isinstance(exc, TimeoutError):
                continue  # the server closed an idle keep-alive connection: once more on a new one
            if isinstance(exc, http.client.HTTPException):
                raise ValueError(f"not an HTTP answer: {type(exc).__name__}") from None
            raise
    raise AssertionError("unreachable")


def _over_socket(t, method, path, body, headers, deadline):
    """Plain HTTP/1.1, one request on its own connection. Not http.client: importing it (with email.parser
    and ssl) was most of a quiet hook's cost through the server (benchmarks/RESULTS.md, bench_remote); a
    request to `synapolis serve` and its answer (always with Content-Length) need only this."""
    import socket
    import time

    host = t.host.encode("idna") if not t.host.isascii() else t.host.encode("ascii")  # bytes: no idna import
    sock = socket.create_connection((host, t.port), timeout=_connect_timeout(deadline))
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.05))
        body = body or b""
        lines = [f"{method} {t.prefix + path} HTTP/1.1", f"host: {t.where}", "connection: close",
                 f"content-length: {len(body)}"] + [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        data = bytearray()
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ValueError("the connection closed before an answer")
            data += chunk
            sock.settimeout(max(deadline - time.monotonic(), 0.05))
        head, _, rest = bytes(data).partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP answer: {status_line[:60]!r}")
        fields = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        rest = bytearray(rest)
        length = fields.get("content-length")
        while length is None or len(rest) < int(length):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
            sock.settimeout(max(deadline - time.monotonic(), 0.05))
        if fields.get("transfer-encoding", "").lower() == "chunked":
            rest = _unchunk(bytes(rest))
        return int(parts[1]), bytes(rest if length is None else rest[:int(length)])
    finally:
        sock.close()


def _unchunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        end = data.index(b"\r\n", i)
        size = int(data[i:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        i = end + 4 + size


def _error_from(t: Target, status: int, data: bytes) -> SynapolisError:
    if status == 401:
        return ForbiddenError(f"the server {t.where} refused the token in {t.token_var} "
                              "(unknown or revoked): ask for a new one (`synapolis tokens create`)")
    try:
        err = json.loads(data)["error"]
        type_name, message = str(err["type"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        # a proxy in front of a server that is down answers 502-504: the server is away; anything else
        # (a 404 at a wrong path, a web page) means the URL names something else
        kind = BusyError if status >= 500 else UsageError
        return kind(f"the server {t.where} answered HTTP {status} without a synapolis answer "
                    f"(is {t.url} the URL `synapolis serve` prints?)")
    from . import errors

    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, SynapolisError)]
    cls = next((c for c in classes if c.type_name == type_name), None)
    exc = SynapolisError.__new__(cls or SynapolisError)
    details = {k: v for k, v in err.items() if k not in ("type", "message", "exit_code")}
    SynapolisError.__init__(exc, message, **details)
    if cls is None:  # a type this version does not know: keep its name and exit code
        exc.type_name = type_name
        exc.exit_code = int(err.get("exit_code") or 1)
    return exc


def call(t: Target, name: str, payload: dict, *, extra_s: float = 0.0) -> dict:
    """POST /api/call/<name> with `payload`; the library's answer, or its error raised as the same class."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    status, data = request(t, "POST", f"/api/call/{name}", body, timeout_s=t.busy_s + CONNECT_TIMEOUT_S + extra_s)
    if status != 200:
        raise _error_from(t, status, data)
    try:
        return json.loads(data)
    except ValueError:
        raise BusyError(f"the server {t.where} answered with something that is not JSON") from None


# -- the verbs ---------------------------------------------------------------------------------------

def _identity(ws, who, env) -> dict:
    """What this machine knows of the caller (§3: options, then environment, then identity.json), named
    explicitly for the server, which consults nothing of its own machine for a remote caller."""
    from .identity import ENV_AGENT, ENV_SESSION, ENV_TOKEN as ENV_RUN_TOKEN, read_identity_file

    agent = getattr(who, "agent_id", None)
    session = getattr(who, "session_id", None)
    token = getattr(who, "run_token", None)
    if agent is None:
        agent = env.get(ENV_AGENT) or None
    ident = read_identity_file(ws) or {}
    if agent is None:
        agent = ident.get("agent_id")
    own = ident.get("agent_id") == agent
    if session is None:
        session = env.get(ENV_SESSION) or (ident.get("session_id") if own else None)
    if token is None:
        token = env.get(ENV_RUN_TOKEN) or (ident.get("run_token") if own and ident.get("session_id") in
                                           (None, session) else None)
    return {"agent_id": agent, "session_id": session, "run_token": token}


def _local_beat(ws, agent_id, **fields) -> None:
    """The local heartbeat file, written before the server hears of the beat (§16)."""
    from .heartbeat import write_heartbeat

    if agent_id:
        write_heartbeat(ws.paths, agent_id, durable=False, **fields)


def _keep_local(ws, heartbeat) -> None:
    """The server's heartbeat as this machine's file too: one seq, one status, wherever it is read."""
    from .atomic import atomic_write_json
    from .names import validate_agent_id

    if isinstance(heartbeat, dict) and isinstance(heartbeat.get("agent_id"), str):
        validate_agent_id(heartbeat["agent_id"])
        atomic_write_json(ws.files.heartbeat(heartbeat["agent_id"]), heartbeat, durable=False)


def _clean(kwargs: dict) -> dict:
    # the library's own knobs (a clock, an environment) are the server's, not a caller's to send
    return {k: v for k, v in kwargs.items() if k not in ("env", "now")}


def make_verbs(t: Target, env=None) -> dict:
    """name -> the remote implementation of `actions.<name>` (and `tired`, `collect`) for target `t`."""
    env = os.environ if env is None else env

    def acting(name):
        def verb(ws, who=None, *args, **kwargs):
            # claim_check acts as nobody (who None); every other verb resolves its caller here (§3)
            me = None if name == "claim_check" else _identity(ws, who, env)
            if name == "beat":
                _local_beat(ws, me["agent_id"], status=kwargs.get("status"), session_id=me["session_id"],
                            **{k: kwargs[k] for k in ("task", "ttl_s", "note") if kwargs.get(k) is not None})
            extra = float(kwargs.get("wait_s") or 0)
            answer = call(t, name, {"who": me, "args": list(args), "kwargs": _clean(kwargs)}, extra_s=extra)
            if name == "beat":
                _keep_local(ws, answer.get("heartbeat"))
            return answer
        verb.__name__ = name
        return verb

    def start(ws, **kwargs):
        write_identity = kwargs.pop("write_identity", True)
        kwargs = _clean(kwargs)
        from .identity import ENV_AGENT

        if kwargs.get("agent_id") is None and env.get(ENV_AGENT) and kwargs.get("conversation_id") is None:
            kwargs["agent_id"] = env[ENV_AGENT]
        answer = call(t, "start", {"kwargs": kwargs}, extra_s=t.busy_s)
        _keep_local(ws, answer.get("heartbeat"))
        if write_identity and answer.get("run_token"):
            from .identity import write_identity_file

            write_identity_file(ws, answer["agent_id"], answer["session_id"], answer["run_token"])
        return answer

    def tired(ws, who=None, **kwargs):
        if kwargs.get("memories") is not None:
            from .sleep import coerce_memories

            # checked here (bad input is exit 2 before anything is sent), and sent as the JSON list it is
            kwargs["memories"] = coerce_memories(kwargs["memories"])
        return call(t, "tired", {"who": _identity(ws, who, env), "args": [], "kwargs": _clean(kwargs)},
                    extra_s=t.busy_s)

    def collect(ws, *args, **kwargs):
        status, data = request(t, "GET", "/api/status")
        if status != 200:
            raise _error_from(t, status, data)
        return json.loads(data)

    def follow_signals(ws, who=None, *, unread_only: bool = True, limit=None, **_ignored):
        """As actions.follow_signals: the caller's signals, then each new one, as long-polls of the server's
        `/api/call/follow`; the server away for FOLLOW_RETRIES reconnects in a row is BusyError (exit 8)."""
        import time

        from .rules.signals import follow_from

        wait_s = follow_poll_s(env)  # a bad value said before anything is read
        first = verbs["read_signals"](ws, who, unread_only=unread_only, limit=limit)
        yield from first["signals"]
        last = follow_from(first, limit)  # past a page cut by its size: the rest of the unread next
        me = _identity(ws, who, env)
        if first.get("agent_id"):  # as the server resolved it: the same agent on every poll
            me.update(agent_id=first["agent_id"], session_id=first.get("session_id") or me["session_id"])
        failures = 0
        while True:
            kwargs = {"unread_only": unread_only, "after": last, "limit": limit, "wait_s": wait_s}
            try:
                answer = call(t, "follow", {"who": me, "kwargs": kwargs}, extra_s=wait_s)
            except BusyError:
                failures += 1
                if failures > FOLLOW_RETRIES:
                    raise
                time.sleep(0.25 * 2 ** failures)
                continue
            failures = 0
            for item in answer.get("signals") or []:
                if item["sequence"] > last:
                    last = item["sequence"]
                    yield item

    def guard(ws, who=None, paths=(), commit=False, **kwargs):
        """The guard asked of the server for this machine's project-relative paths (only those travel); each
        blocked path named as it was given here, the paths outside the project answered here. `commit` is sent
        only when set, and a server older than it is asked again without (the refusal stands, unrecorded)."""
        from .guard import _check_paths

        inside, outside = relative_paths(ws, _check_paths(paths))
        try:
            answer = acting("guard")(ws, who, list(inside), **kwargs, **({"commit": True} if commit else {}))
        except UsageError as exc:
            if not (commit and "takes no commit" in exc.message):
                raise
            answer = acting("guard")(ws, who, list(inside), **kwargs)
        for b in answer.get("blocked") or []:
            b["path"] = inside.get(b.get("path"), b.get("path"))
        answer["outside"] = outside + list(answer.get("outside") or [])
        return answer

    def plain(name):
        def verb(ws, *args, **kwargs):  # acts as nobody: no identity is sent
            return call(t, name, {"args": list(args), "kwargs": _clean(kwargs)})
        return verb

    verbs = {name: acting(name) for name in ACTION_VERBS if name != "start"}
    verbs.update(start=start, tired=tired, collect=collect, follow_signals=follow_signals, guard=guard,
                 claims_view=plain("claims"), memories=plain("memories"), list_incidents=plain("escalations"),
                 ack=plain("escalations_ack"))
    return verbs


def relative_paths(ws, paths) -> tuple[dict[str, str], list[str]]:
    """({project-relative path: the path as given} for the paths inside this machine's project, [the others]).
    A sandbox's clone and the team's checkout share project-relative paths, never absolute ones, in their case:
    the server folds them where its own file system ignores case (folded here, `src/Api.py` missed its claim)."""
    from .project import split_paths

    inside, outside = split_paths(ws, paths, keep_case=True)
    found: dict[str, str] = {}
    for path, rel in inside:
        found.setdefault(rel, path)
    return found, outside


class RemoteWorkspace:
    """A state directory on a machine that goes through a server: its own files only (identity.json,
    heartbeats/), the config it was found with, and the server (`remote`). `ensure` makes the folder and
    heartbeats/, never a store's files."""

    __slots__ = ("paths", "config", "remote")

    def __init__(self, ws, remote: Target):
        self.paths, self.config, self.remote = ws.paths, ws.config, remote

    @property
    def root(self):
        return self.paths.root

    @property
    def files(self):
        return self.paths.files

    def ensure(self) -> "RemoteWorkspace":
        files = self.files
        try:
            if not os.path.isdir(files.root):
                os.makedirs(files.root, mode=0o700, exist_ok=True)
            os.makedirs(files.heartbeats, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create state directory {files.root}: {exc.strerror}") from None
        return self


def activate(ws, verb: str | None, env=None):
    """`ws` as it is when no server is configured; else, for a verb the server has, a RemoteWorkspace with
    the library's verbs in this process replaced by the server's (the CLI is one call per process), and
    UsageError (exit 2) for a verb that works only beside the store."""
    t = target(ws.config, env)
    if t is None:
        return ws
    name = (verb or "").split(" ")[0]
    if name not in CLI_VERBS:
        why = LOCAL_ONLY.get(name, "").format(url=t.url.rstrip("/"))
        raise UsageError(f"`synapolis {verb}` works beside the store, and this machine goes through the server "
                         f"{t.where} ({ENV_SERVER}): {why or 'run it there'}")
    from . import actions

    verbs = make_verbs(t, env)
    for name in ACTION_VERBS + ("follow_signals",):
        setattr(actions, name, verbs[name])
    if verb == "tired":
        from . import sleep

        sleep.tired = verbs["tired"]
    elif verb == "status":
        from . import overview

        overview.collect = verbs["collect"]
    elif verb == "claims":
        from . import claims_view

        claims_view.claims_view = verbs["claims_view"]
    elif verb == "memories":
        from . import sleep

        sleep.memories = verbs["memories"]
    elif (verb or "").startswith("escalations"):
        from . import escalation

        escalation.list_incidents, escalation.ack = verbs["list_incidents"], verbs["ack"]
    return RemoteWorkspace(ws, t).ensure()
