"""`POST /api/call/<verb>` and `POST /api/hook/<harness>`: the library verbs and hooks for machines that have only
the server (contract §16), behind the same bearer tokens and with the identity rules of MCP over HTTP.
`/api/call/follow` is `read-signals --follow`'s long-poll (docs/API.md).

A call carries `{"who": {agent_id, session_id, run_token}, "args": [...], "kwargs": {...}}` and is answered with
the verb's own JSON object (status 200), or its error object with the HTTP status of its exit code. The caller
is always remote: only what it names counts (never this machine's environment or identity.json), a token
pinned to an agent acts only as that agent and its sub-agents, a read-only token only reads, as nobody.
"""

from __future__ import annotations

import inspect
import json

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import actions, agent_call
from ..errors import SynapolisError, UsageError
from ..identity import Who
from ..remote import ACTION_VERBS

CALL_BODY_MAX = 64 * 1024 * 1024  # a call carries at most a signal's or memories' text, bounded by the verb
READS = ("read_notes", "list_agents", "whiteboard_read", "claim_check", "guard")  # as MCP's read tools: writes=False
# verbs that act as nobody (no `who`): name -> (module, function, whether it writes)
PLAIN = {"claims": ("claims_view", "claims_view", False), "memories": ("sleep", "memories", False),
         "escalations": ("escalation", "list_incidents", False), "escalations_ack": ("escalation", "ack", True)}
FOLLOW_WAIT_MAX_S = 25.0  # one long-poll of `read-signals --follow` (remote.FOLLOW_WAIT_S asks for less)
# the library's own knobs, never a caller's: its clock, its environment, the hook's drain machinery
_SERVER_ONLY = {"env", "now", "fits", "withheld", "change_mark", "method", "write_identity", "live",
                "deterministic_id"}
# hook events carry the harness's environment only as far as the agent's id depends on it
_HOOK_ENV = ("SYNAPOLIS_SUBSTRATE",)


def _function(verb: str):
    if verb == "tired":
        from ..sleep import tired

        return tired
    if verb in PLAIN:
        import importlib

        module, name, _writes = PLAIN[verb]
        return getattr(importlib.import_module(f"..{module}", __package__), name)
    return getattr(actions, verb) if verb in ACTION_VERBS else None


def _who(principal, named: dict | None, writes: bool) -> Who:
    """mcp.state.ServerState.who for a stateless caller: a read-only token reads as nobody, a pinned one is
    its agent, everything else as named."""
    named = named if isinstance(named, dict) else {}
    agent_id, session_id, run_token = (named.get(k) for k in ("agent_id", "session_id", "run_token"))
    for value in (agent_id, session_id, run_token):
        if value is not None and not isinstance(value, str):
            raise UsageError("who: agent_id, session_id and run_token must be text")
    if principal.read_only:
        if writes:
            principal.check_may_write()
        return Who(None, session_id, None, named_only=True)
    # a pinned token vouches for its agent, as over MCP (mcp.state.ServerState.who)
    return Who(principal.acting_as(agent_id), session_id, run_token, named_only=True,
               vouched=principal.agent_id is not None)


def run_call(state, principal, verb: str, payload) -> dict:
    """Run one verb for a remote caller (on a worker thread); SynapolisError for what the CLI would refuse."""
    fn = _function(verb)
    if fn is None:
        raise UsageError(f"no verb {verb!r} here: one of {', '.join(ACTION_VERBS + ('tired',) + tuple(PLAIN))}")
    if not isinstance(payload, dict):
        raise UsageError("a call is a JSON object: {who, args, kwargs}")
    args, kwargs = payload.get("args") or [], payload.get("kwargs") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UsageError("args must be a list and kwargs an object")
    parameters = inspect.signature(fn).parameters
    allowed = set(parameters) - _SERVER_ONLY - {"ws", "who"}
    unknown = sorted(set(kwargs) - allowed)
    # nor by position: `args` fill the parameters after ws (and who), and a server-only one (escalation.ack's
    # `now`) is no caller's either
    positional = [n for n, p in parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD and n not in ("ws", "who")]
    unknown += sorted(set(positional[:len(args)]) & _SERVER_ONLY)
    if unknown:
        raise UsageError(f"{verb} takes no {', '.join(unknown)}")
    ws = state.workspace()
    if verb in PLAIN:  # they act as nobody: only the token's right to write counts
        if PLAIN[verb][2]:
            principal.check_may_write()
        try:
            return fn(ws, *args, **kwargs)
        except TypeError as exc:  # the wrong number of arguments: the caller's mistake, said as such
            raise UsageError(f"{verb}: {exc}") from None
    with agent_call.long_lived(state.live if state.fast else None):
        if verb == "start":
            principal.check_may_write()
            kwargs["agent_id"] = principal.acting_as(kwargs.get("agent_id"))
            result = fn(ws, *args, env={}, write_identity=False, **kwargs)
        else:
            named = payload.get("who")
            # claim_check acts as nobody (§9); every other verb as the caller the token allows
            who = None if verb == "claim_check" and named is None else _who(principal, named,
                                                                             writes=verb not in READS)
            if verb == "signals_pending":
                kwargs["method"] = "poll"
            if verb == "guard" and principal.read_only:
                kwargs.pop("commit", None)  # a read-only token is answered, but records no refused commit
            try:
                result = fn(ws, who, *args, env={}, **kwargs)
            except TypeError as exc:  # the wrong number of arguments: the caller's mistake, said as such
                raise UsageError(f"{verb}: {exc}") from None
    state.keep_open(ws, result.get("session_id") or (payload.get("who") or {}).get("session_id"))
    return result


def run_hook(state, principal, harness: str, raw: bytes, env: dict, identity=None) -> dict:
    """One hook event of a remote harness, handled here as `synapolis hook` would beside the store.

    A token pinned to an agent makes that agent the conversation's. When the caller's machine registered it
    with `synapolis start` (its identity.json, sent as `identity`), the conversation starts from that
    registration and its run token, as a resumed conversation does, instead of being refused as someone
    else's; a token that is not the agent's is refused there by the registration itself."""
    from ..harness import hooks

    principal.check_may_write()
    env = {k: v for k, v in env.items() if k in _HOOK_ENV and isinstance(v, str)}
    import os

    if os.environ.get("SYNAPOLIS_STORE_URL"):
        # the server's own store choice: the hooks' quiet paths (SQLite files only) must see it is not SQLite
        env["SYNAPOLIS_STORE_URL"] = os.environ["SYNAPOLIS_STORE_URL"]
    if principal.agent_id:
        env[hooks.PINNED_ENV] = principal.agent_id
        if isinstance(identity, dict) and identity.get("agent_id") == principal.agent_id:
            _adopt(state.workspace(), principal.agent_id, identity)
    with agent_call.long_lived(state.live if state.fast else None):
        result = _pretool(state, harness, raw, env)
        if result is None:
            result = hooks.handle(harness, raw, state_dir=state.root, env=env)
    return {k: result.get(k) for k in ("output", "problems", "agent_id", "event", "delivered", "withheld",
                                       "blocked")}


def _pretool(state, harness: str, raw: bytes, env: dict) -> dict | None:
    """A sandbox's pre-tool event (harness.remote_guard): the guard decided here for the project-relative
    paths it names, never for its tool's input (another machine's absolute paths mean nothing here); None
    for any other event. The answer is the harness's own, as beside the store (harness.pretool.decide)."""
    from ..harness import hooks
    from ..harness.remote_guard import PATHS_KEY

    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or PATHS_KEY not in event:
        return None
    result = {"output": {}, "problems": [], "agent_id": None, "event": None, "delivered": [], "withheld": []}
    paths = event.get(PATHS_KEY)
    if (harness not in hooks.PRETOOL_EVENTS or hooks.event_name(event) != hooks.PRETOOL_EVENTS[harness]
            or not isinstance(paths, list) or not all(isinstance(p, str) for p in paths)):
        raise UsageError(f"{PATHS_KEY} comes with a pre-tool event of a known harness, as a list of paths")
    try:
        hooks.parse_event(raw)
    except hooks.HookInputError as exc:
        raise UsageError(str(exc)) from None
    result["event"] = hooks.event_name(event)
    from ..harness import pretool

    ws = hooks._workspace(state.root, env, {})
    try:
        # relative paths: the guard takes them relative to this server's project root
        pretool.decide(harness, event, ws, env, result, [p for p in paths if not p.startswith("/")])
    except Exception as exc:  # noqa: BLE001 - the guard never blocks work because of its own failure
        result["output"] = {}
        result["problems"].append("guard: " + (getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"))
    return result


def _adopt(ws, agent_id: str, identity: dict) -> None:
    """Seed the pinned agent's hook state with the caller's registration, unless the hooks hold one already."""
    from ..harness import hooks

    token, session = identity.get("run_token"), identity.get("session_id")
    if not isinstance(token, str) or not (session is None or isinstance(session, str)):
        return
    current = hooks.load_state(ws.ensure(), agent_id)
    if current.get("run_token"):
        return
    hooks.save_state(ws, agent_id, {"agent_id": agent_id, "session_id": session, "run_token": token})


async def _body(request: Request, limit: int) -> bytes | Response:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return JSONResponse(UsageError(f"a call may be at most {limit} bytes").to_json(), status_code=413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return JSONResponse(UsageError(f"a call may be at most {limit} bytes").to_json(), status_code=413)
    return bytes(body)


async def follow(state, principal, payload, stopping) -> dict:
    """One long-poll of `read-signals --follow` (remote.follow_signals): the caller's signals after sequence
    `after`, answered as soon as there is one, else after `wait_s` (at most FOLLOW_WAIT_MAX_S) with none. Woken
    by the server's change feed (a signal stored by any process), never a sleep loop; a stopping server ends the
    wait at once (`stopping()`), so shutting down never waits for a follower."""
    import time

    if not isinstance(payload, dict):
        raise UsageError("a call is a JSON object: {who, args, kwargs}")
    kwargs = payload.get("kwargs") if isinstance(payload.get("kwargs"), dict) else {}
    wait_s = kwargs.pop("wait_s", 10)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s:
        raise UsageError("wait_s must be a number of seconds >= 0")
    if kwargs.get("after") is None:
        raise UsageError("a follow names `after`: the last sequence it has")
    call = {"who": payload.get("who"), "kwargs": kwargs}
    deadline = time.monotonic() + min(float(wait_s), FOLLOW_WAIT_MAX_S)
    while True:
        seen = state.changes
        result = await anyio.to_thread.run_sync(run_call, state, principal, "read_signals", call)
        left = deadline - time.monotonic()
        if result.get("signals") or left <= 0 or stopping():
            return result
        await state.next_change(seen, min(left, 1.0))  # a slice at a time: a stopping server is seen within 1 s


def routes(state, signed_in, refused, error, stopping=lambda: False):
    """The endpoints, for web.app: `signed_in(request)` -> (record, token, from_cookie) | None (a bearer
    header only is taken here), `refused()` the 401, `error(exc)` a SynapolisError's answer, `stopping()`
    whether the server is shutting down (a long-poll ends then)."""
    from starlette.routing import Route

    from ..mcp.http import principal_for

    async def api_call(request: Request) -> Response:
        who = signed_in(request)
        if who is None or who[2]:  # the cookie is the dashboard's: a call carries the bearer header
            return refused()
        body = await _body(request, CALL_BODY_MAX)
        if isinstance(body, Response):
            return body
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            return error(UsageError("the call's body is not JSON"))
        principal = principal_for(who[0])
        verb = request.path_params["verb"]
        try:
            if verb == "follow":
                result = await follow(state, principal, payload, stopping)
            else:
                result = await anyio.to_thread.run_sync(run_call, state, principal, verb, payload)
        except SynapolisError as exc:
            return error(exc)
        return Response(json.dumps(result, ensure_ascii=False, default=str), media_type="application/json")

    async def api_hook(request: Request) -> Response:
        who = signed_in(request)
        if who is None or who[2]:
            return refused()
        from ..harness.hooks import MAX_INPUT_BYTES

        body = await _body(request, MAX_INPUT_BYTES)
        if isinstance(body, Response):
            return body
        try:
            env = json.loads(request.headers.get("x-synapolis-env") or "{}")
            identity = json.loads(request.headers.get("x-synapolis-identity") or "null")
        except ValueError:
            env, identity = {}, None
        principal = principal_for(who[0])
        try:
            result = await anyio.to_thread.run_sync(run_hook, state, principal, request.path_params["harness"],
                                                    body, env if isinstance(env, dict) else {}, identity)
        except SynapolisError as exc:
            return error(exc)
        return JSONResponse(result)

    async def api_whoami(request: Request) -> Response:
        who = signed_in(request)
        if who is None or who[2]:
            return refused()
        record = who[0]
        return JSONResponse({"token": record["name"], "agent_id": record.get("agent_id"),
                             "read_only": bool(record.get("read_only"))})

    return [Route("/api/call/{verb}", api_call, methods=["POST"]),
            Route("/api/hook/{harness}", api_hook, methods=["POST"]),
            Route("/api/whoami", api_whoami)]

