"""Who the caller is (contract §3): options, then environment, then identity.json; and identity.json itself."""

from __future__ import annotations

import os

from .atomic import atomic_write_json, read_json
from .errors import AmbiguousIdentityError, NoIdentityError, UsageError
from .names import is_reserved, refuse_reserved, validate_agent_id, validate_session_id
from .store.run_tokens import TOKEN_HASH_PREFIX, hash_token, is_hashed  # noqa: F401  (the store's, kept here)
from .timeutil import utcnow

ENV_AGENT = "SYNAPOLIS_AGENT_ID"
ENV_SESSION = "SYNAPOLIS_SESSION_ID"
ENV_TOKEN = "SYNAPOLIS_RUN_TOKEN"


# -- run tokens --------------------------------------------------------------------------------------

def new_token() -> str:
    """A fresh run token: 128 random bits as hex (what secrets.token_hex(16) returns, without loading
    secrets, hmac and OpenSSL on the start path)."""
    return os.urandom(16).hex()


def token_matches(presented, stored) -> bool:
    """Whether the `presented` run token is the one `stored` in a registry row (hashed, or in clear in a
    database an older synapolis wrote and no newer one has opened yet).

    Hashed: the two SHA-256 digests are compared. Their comparison need not take constant time: what
    timing could reveal is how far two digests agree, which leads at best to the stored digest (what
    session.db holds anyway), never to a token, since finding one from its digest is a preimage. The
    clear form is compared with hmac.compare_digest, imported on that path only (tests/test_startup.py).
    """
    if not isinstance(presented, str) or not isinstance(stored, str) or not stored:
        return False
    if is_hashed(stored):
        return hash_token(presented) == stored
    import hmac

    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), stored.encode("utf-8", "surrogatepass"))


# -- the caller ---------------------------------------------------------------------------------------


class _Record:
    """A tiny record type (a dataclass costs ~0.5 ms of start-up each, on every CLI call)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


class Who(_Record):
    """What the caller named explicitly (CLI options, MCP arguments).

    `named_only`: a remote caller (the HTTP server's clients): only what it names counts; neither the
    environment nor identity.json (which belong to the server's machine) is consulted, nor lends a token.
    `vouched`: the transport has proven the caller is `agent_id` by a credential of its own (a bearer token
    pinned to that agent or its parent, docs/MCP.md "Identity"), so it needs no run token; a run token it
    does present must still be right. Only a server sets it, never from what a call passes.
    """

    __slots__ = ("agent_id", "session_id", "run_token", "named_only", "vouched")

    def __init__(self, agent_id: str | None = None, session_id: str | None = None, run_token: str | None = None,
                 named_only: bool = False, vouched: bool = False):
        self.agent_id, self.session_id, self.run_token = agent_id, session_id, run_token
        self.named_only = named_only
        self.vouched = bool(vouched and agent_id is not None)


class Caller(_Record):
    """The resolved identity; `session_id` is None only when the agent is in no session (a bare beat).
    `vouched`: as Who's (the agent named was proven by the transport's credential)."""

    __slots__ = ("agent_id", "session_id", "run_token", "source", "vouched")

    def __init__(self, agent_id: str, session_id: str | None, run_token: str | None, source: str,
                 vouched: bool = False):
        # source: "options" | "env" | "identity.json"
        self.agent_id, self.session_id, self.run_token, self.source = agent_id, session_id, run_token, source
        self.vouched = vouched


def read_identity_file(ws) -> dict | None:
    """identity.json when it names a well-formed agent, else None."""
    try:
        document = read_json(ws.files.identity)
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or not isinstance(document.get("agent_id"), str):
        return None
    return document


def write_identity_file(ws, agent_id: str, session_id: str, run_token: str, **extra) -> dict:
    """Write identity.json (mode 0600: it holds the run token)."""
    document = {"agent_id": agent_id, "session_id": session_id, "run_token": run_token,
                **{k: v for k, v in extra.items() if v is not None},
                "written_at": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")}
    atomic_write_json(ws.files.identity, document, mode=0o600)
    return document


def _blank_to_none(value):
    # an unset environment variable and an empty one mean the same; an empty option does not
    return value if value else None


def _session_of(ws, agent_id: str, fallback: str | None) -> str | None:
    """The session an agent named without one acts in (docs/API.md)."""
    from . import sessions
    from .heartbeat import read_heartbeat

    active = sessions.active_sessions(ws)
    if not active:
        return fallback if fallback else None
    # fast path: the session its own heartbeat names, when it is active and holds the agent
    doc = read_heartbeat(ws.files.heartbeat(agent_id)).doc or {}
    hinted = doc.get("session_id")
    if hinted in active and _registered(ws, hinted, agent_id):
        return hinted
    mine = sessions.sessions_of_agent(ws, agent_id)
    if mine:
        return mine[0]
    if fallback:
        return fallback
    return active[0] if len(active) == 1 else None


def _registered(ws, session_id: str, agent_id: str) -> bool:
    from .sessions import agent_row, each_store

    return any(agent_row(conn, agent_id) is not None for _sid, conn in each_store(ws, [session_id]))


def _live_count(ws, session_id: str, now) -> int:
    from .sessions import count_live_agents, each_store

    return sum(count_live_agents(conn, now, ws.config) for _sid, conn in each_store(ws, [session_id]))


def named(ws, who: Who | None = None, env=None) -> Caller | None:
    """The caller as its names say, without opening any store (no registry, no ambiguity check): what a beat
    writes its local file as when the store is away (§12). None when nothing names a usable agent."""
    who = who or Who()
    env = {} if who.named_only else os.environ if env is None else env
    ident = None if who.named_only else read_identity_file(ws)
    agent = who.agent_id or _blank_to_none(env.get(ENV_AGENT))
    source = "options" if who.agent_id else "env"
    if agent is None and ident is not None:
        agent, source = ident["agent_id"], "identity.json"
    matches = ident is not None and ident.get("agent_id") == agent
    session = who.session_id or _blank_to_none(env.get(ENV_SESSION)) or (ident.get("session_id") if matches else None)
    token = who.run_token or _blank_to_none(env.get(ENV_TOKEN)) or (ident.get("run_token") if matches else None)
    try:
        validate_agent_id(agent if isinstance(agent, str) else "")
        if session is not None:
            validate_session_id(session if isinstance(session, str) else "")
    except UsageError:
        return None
    if is_reserved(agent):
        return None
    return Caller(agent, session, token if isinstance(token, str) else None, source)


def resolve(ws, who: Who | None = None, env=None, required: bool = True, need_session: bool = True,
            now=None) -> Caller | None:
    """The caller's identity, first match wins: `who`, the environment, identity.json (contract §3).

    `required=False` (read-only verbs) answers None instead of raising when there is no identity or
    it is ambiguous. `need_session=False` lets an agent in no session through (a bare `beat`).
    Names are validated (UsageError, exit 2) before anything is written.
    """
    who = who or Who()
    env = {} if who.named_only else os.environ if env is None else env
    for value, what in ((who.agent_id, "agent id"), (who.session_id, "session id")):
        if value is not None:
            (validate_agent_id if what == "agent id" else validate_session_id)(value, what)
    env_agent = _blank_to_none(env.get(ENV_AGENT))
    env_session = _blank_to_none(env.get(ENV_SESSION))
    env_token = _blank_to_none(env.get(ENV_TOKEN))
    if env_agent is not None:
        validate_agent_id(env_agent, ENV_AGENT)
    if env_session is not None:
        validate_session_id(env_session, ENV_SESSION)

    ident = None
    if who.agent_id is not None:
        agent, source = who.agent_id, "options"
    elif env_agent is not None:
        agent, source = env_agent, "env"
    else:
        ident = None if who.named_only else read_identity_file(ws)
        agent, source = (ident["agent_id"], "identity.json") if ident else (None, None)
    if agent is None:
        if not required:
            return None
        raise NoIdentityError("no identity: pass --agent-id and --session-id, set SYNAPOLIS_AGENT_ID, "
                              "or run `synapolis start`")
    if is_reserved(agent):
        if source == "identity.json" and not required:
            return None  # a planted identity.json makes a reader act as nobody, not as the system
        refuse_reserved(agent, "agent id" if source != "identity.json" else "identity.json agent_id")
    if source == "identity.json":
        try:
            validate_agent_id(agent, "identity.json agent_id")
        except UsageError:
            if not required:
                return None
            raise

    if ident is None and not who.named_only:
        ident = read_identity_file(ws)
    ident_matches = ident is not None and ident.get("agent_id") == agent
    ident_session = ident.get("session_id") if ident_matches and isinstance(ident.get("session_id"), str) else None
    if ident_session is not None:
        try:
            validate_session_id(ident_session, "identity.json session_id")
        except UsageError:
            if source != "identity.json":
                ident_session = None  # only a hint for a caller that named itself: a broken one is ignored
            elif not required:
                return None
            else:
                raise

    session = who.session_id or env_session
    if session is None:
        if source == "identity.json":
            session = ident_session
        else:
            session = _session_of(ws, agent, ident_session)
    if session is not None:
        validate_session_id(session)

    # a token belongs to one agent in one session: take it only from a source naming both the same way
    token = who.run_token
    if token is None and env_token is not None and env_agent in (None, agent) and env_session in (None, session):
        token = env_token
    if token is None and ident_matches and isinstance(ident.get("run_token"), str) \
            and ident.get("session_id") in (None, session):
        token = ident["run_token"]

    if source == "identity.json" and session is not None:
        # identity.json names one agent for the whole state directory; with several agents live in
        # that session it is probably not this caller's, so refuse rather than guess (§3).
        live = _live_count(ws, session, now or utcnow())
        if live > 1:
            if not required:
                return None
            raise AmbiguousIdentityError(
                f"{live} agents are active in session {session} and nothing names this caller: pass "
                "--agent-id (or set SYNAPOLIS_AGENT_ID) instead of relying on identity.json")
    if session is None and need_session:
        if not required:
            return None
        raise NoIdentityError(f"agent {agent} is in no active session: pass --session-id or run "
                              "`synapolis start`")
    return Caller(agent, session, token, source, vouched=who.vouched and source == "options")
