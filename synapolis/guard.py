"""The guard (contract §14): may the caller write these paths? A pure query over the claims held by live others."""

from __future__ import annotations

import os
from datetime import datetime

from .errors import UsageError
from .names import is_subagent_of, refuse_reserved, validate_agent_id

ENV_AGENT = "SYNAPOLIS_AGENT_ID"
ENV_TOKEN = "SYNAPOLIS_RUN_TOKEN"
MAX_PATHS = 100_000
MAX_PATH_CHARS = 4096


def guard_caller(ws, who=None, env=None, now: datetime | None = None) -> str | None:
    """The agent id the guard answers for, resolved as every verb resolves its caller (contract §3), or None
    (nobody: every path a live agent holds is blocked).

    Options first, then SYNAPOLIS_AGENT_ID, then identity.json (with its ambiguity rule: several live agents in
    its session and nothing naming this caller is nobody). The guard needs no session, so none is looked up
    for a named agent. A wrong run token is refused (exit 7) whatever the config; with require_run_token on, a
    caller presenting no token is nobody; with tokens off, the name is the identity, as for every verb."""
    env = {} if who is not None and who.named_only else os.environ if env is None else env
    agent = who.agent_id if who is not None else None
    if agent is None:
        agent = env.get(ENV_AGENT) or None
    if agent is None:
        from . import identity

        caller = identity.resolve(ws, who, env=env, required=False, need_session=False, now=now)
        if caller is None:
            return None
        agent, token, session_id = caller.agent_id, caller.run_token, caller.session_id
    else:
        validate_agent_id(agent, "agent id" if who is not None and who.agent_id else ENV_AGENT)
        refuse_reserved(agent)
        token = (who.run_token if who is not None else None) or env.get(ENV_TOKEN) or None
        session_id = who.session_id if who is not None else None
    # a run token presented is always checked: a wrong one is refused (exit 7, contract §3), as by every verb
    if token is not None or ws.config.require_run_token:
        if token is None:
            # a caller the transport vouched for (a token pinned to this agent, §13, §16) needs no run token
            return agent if who is not None and who.vouched and who.agent_id == agent else None
        from .agent_call import proven
        from .identity import Caller

        proven(ws, Caller(agent, session_id, token, "options"), None, required=False)
    return agent


def _check_paths(paths) -> list[str]:
    if isinstance(paths, str) or paths is None:
        raise UsageError("guard takes a list of paths")
    out = list(paths)
    if len(out) > MAX_PATHS:
        raise UsageError(f"guard takes at most {MAX_PATHS} paths at once, not {len(out)}")
    for path in out:
        if not isinstance(path, str):
            raise UsageError(f"a path is text, not {path!r}")
        if len(path) > MAX_PATH_CHARS:
            raise UsageError(f"a path is at most {MAX_PATH_CHARS} characters: {path[:60]!r}...")
    return out


def blocking(ws, caller: str | None, rel_paths: list[str], now: datetime) -> dict[str, list[dict]]:
    """{relative path: [claim records of live others whose pattern matches it]} (paths nobody blocks left out)."""
    from .claim_index import holders_of

    found = holders_of(ws, rel_paths, now)
    if not found:
        return {}
    from .claim_ops import holder_status  # only a path somebody holds asks who that is (not the claims facade)
    from .status import CLAIMABLE_FROM

    statuses: dict[str, str] = {}
    out: dict[str, list[dict]] = {}
    for path, records in found.items():
        for record in records:
            holder = record["claimed_by"]
            if caller is not None and (holder == caller or is_subagent_of(holder, caller)):
                continue
            if holder not in statuses:
                statuses[holder] = holder_status(ws, holder, now)
            if statuses[holder] in CLAIMABLE_FROM:
                continue  # its holder is gone: the claim is anyone's to take (§9), so it blocks nobody
            out.setdefault(path, []).append(dict(record, holder_status=statuses[holder]))
    return out


def guard(ws, who=None, paths=(), *, now: datetime | None = None, env=None) -> dict:
    """May the caller write `paths`? `{"allowed": bool, "blocked": [{path, item, claimed_by, expires_at, token},
    ...]}` (contract §14), plus `agent_id` (who it answered for, None for nobody) and `outside` (the paths it
    does not guard: outside the project).

    A path is absolute, or relative to the project root (the top of the git work tree holding the state
    directory's parent, else that parent). Blocked: a path matched by a claim that a live agent other than
    the caller and its sub-agents holds (with no identity, any live agent). A pure query: it refreshes nobody's
    heartbeat, delivers nothing and writes nothing."""
    from .project import project_of, split_paths
    from .store import clock

    paths = _check_paths(paths)
    moment = clock(ws, now)
    caller = guard_caller(ws, who, env, moment)
    root, _fold = project_of(ws)
    inside, outside = split_paths(ws, paths)
    blocked: list[dict] = []
    if inside:
        held = blocking(ws, caller, sorted({rel for _path, rel in inside}), moment)
        for path, rel in inside:
            for record in held.get(rel, ()):
                blocked.append({"path": path, "relative_path": rel, "item": record["item"],
                                "claimed_by": record["claimed_by"], "expires_at": record["expires_at"],
                                "token": record["token"], "session_id": record.get("session_id"),
                                "holder_status": record["holder_status"]})
    return {"allowed": not blocked, "blocked": blocked, "agent_id": caller, "root": root, "outside": outside,
            "pending_signals": [], "pending_remaining": 0}


def staged_paths(cwd: str | None = None) -> list[str]:
    """The paths of the git index's staged changes, relative to the work tree's top (`git diff --cached`):
    both sides of a rename (`--no-renames` lists the old path as deleted and the new one as added)."""
    import subprocess

    command = ["git", "-c", "diff.relative=false", "diff", "--cached", "--name-only", "-z", "--no-renames"]
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"guard --staged could not run git: {exc}") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UsageError("guard --staged: " + (why[0] if why else f"git exited {done.returncode}"))
    return [p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
