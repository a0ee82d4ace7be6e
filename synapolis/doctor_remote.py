"""`doctor` on a machine that goes through the team server (contract §16): the server answers, the token is taken,
and what that token may do. The token itself is never printed, only the name of its variable."""

from __future__ import annotations

import json
import os

CHECK = "server"


def configured(root, env=None) -> bool:
    """Whether this state directory goes through a server ($SYNAPOLIS_SERVER or the config's `server`)."""
    from .config import load_config
    from .errors import UsageError
    from .remote import ENV_SERVER

    env = os.environ if env is None else env
    if env.get(ENV_SERVER):
        return True
    try:
        return bool(load_config(os.path.join(root, "synapolis.json")).values.get("server"))
    except UsageError:
        return False  # a broken config is its own finding


def check_server(root, env=None) -> list[dict]:
    from .config import load_config
    from .doctor import FAIL, OK, WARN, finding
    from .errors import SynapolisError, UsageError
    from .remote import request, target

    try:
        t = target(load_config(os.path.join(root, "synapolis.json")), env)
    except UsageError as exc:
        return [finding(CHECK, FAIL, exc.message, "set SYNAPOLIS_SERVER to the URL `synapolis serve` prints")]
    if t is None:
        return []
    found = []
    try:
        status, _ = request(t, "GET", "/healthz", auth=False)
    except SynapolisError as exc:
        return [finding(CHECK, FAIL, exc.message, "start `synapolis serve` there, or fix SYNAPOLIS_SERVER")]
    if status != 200:
        return [finding(CHECK, FAIL, f"{t.url}/healthz answered HTTP {status}: not a `synapolis serve`?",
                        "point SYNAPOLIS_SERVER at the URL `synapolis serve` prints")]
    found.append(finding(CHECK, OK, f"{t.url} answers (every verb and hook goes through it; no store here)"))
    fix = f"set {t.token_var} to a token of `synapolis tokens create NAME` run beside the server's store"
    if not t.token:
        return found + [finding("server token", FAIL, f"{t.token_var} is not set", fix)]
    try:
        status, data = request(t, "GET", "/api/whoami")
    except SynapolisError as exc:
        return found + [finding("server token", FAIL, exc.message, fix)]
    if status == 401:
        return found + [finding("server token", FAIL, f"the server refused the token in {t.token_var}", fix)]
    try:
        me = json.loads(data)
        name = me["token"]
    except (ValueError, KeyError, TypeError):
        return found + [finding("server token", FAIL, f"/api/whoami answered HTTP {status} without an answer",
                                "upgrade synapolis on the server")]
    may = ("may only read (no beats, signals or hooks)" if me.get("read_only") else
           f"acts only as agent {me['agent_id']} and its sub-agents" if me.get("agent_id") else
           "acts as whoever `synapolis start` makes it")
    status_of = WARN if me.get("read_only") else OK
    return found + [finding("server token", status_of, f"{t.token_var} holds token {name!r}: it {may}",
                            "a read-only token cannot run the hooks: ask for one that may write"
                            if me.get("read_only") else None, token=name, agent_id=me.get("agent_id"),
                            read_only=bool(me.get("read_only")))]
