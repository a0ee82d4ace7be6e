"""A hook event on a machine that goes through the team server (contract §16): the local heartbeat file first, then
the event to the server's `/api/hook/<harness>`, which registers, beats and delivers there; its answer printed here.

No store is opened or created on this machine. The server away or refusing is a line for stderr and an empty
answer, within the hook's own bound (the harness is never broken, §11).
"""

from __future__ import annotations

import json

# what the event means for the local heartbeat's declared status (hooks.EVENT_KINDS' kinds)
_STATUS = {"start": "active", "deliver": "active", "idle": "idle", "end": "stopped", "beat": None}
_FORWARDED_ENV = ("SYNAPOLIS_SUBSTRATE",)


def act(harness: str, event: dict, kind: str, ws, env, result: dict) -> None:
    """Handle one parsed event through the server named by `ws`'s config or `env`; fills `result` as
    hooks.handle does (output, problems, agent_id, delivered, withheld)."""
    from .. import remote
    from ..heartbeat import write_heartbeat
    from . import conversation as convo

    from . import quiet

    t = remote.target(ws.config, env)
    conversation = convo.conversation_id(event)
    rws = remote.RemoteWorkspace(ws, t).ensure()
    # the index spares the SHA-256 of the derived id on every call, as on the local quiet path
    key = quiet.known_key(rws, harness, conversation, env)
    if key is None:
        key = convo.agent_id_for(harness, conversation, env)
        quiet.remember_key(rws, harness, conversation, env, key)
    known = convo.load_state(rws, key)  # what the server said this conversation is, the last time
    agent_id = known.get("agent_id") or key
    result["agent_id"] = agent_id
    write_heartbeat(rws.paths, agent_id, harness=harness, status=_STATUS.get(kind), durable=False,
                    session_id=known.get("session_id"), now=quiet.clock()[1])
    budget = convo.deadline_s(env) - 0.25  # answer before run_bounded's timer gives up for us
    headers_env = json.dumps({k: env[k] for k in _FORWARDED_ENV if env.get(k)})
    headers = {"x-synapolis-env": headers_env}
    from ..identity import read_identity_file

    mine = read_identity_file(rws)  # this machine's `synapolis start`: a pinned token's hooks act as it
    if mine and mine.get("run_token"):
        headers["x-synapolis-identity"] = json.dumps({k: mine.get(k) for k in ("agent_id", "session_id",
                                                                              "run_token")})
    status, data = remote.request(t, "POST", f"/api/hook/{harness}",
                                  json.dumps(event, ensure_ascii=False).encode("utf-8"),
                                  timeout_s=max(budget, 0.5), extra_headers=headers)
    if status != 200:
        raise remote._error_from(t, status, data)
    answer = json.loads(data)
    result["problems"].extend(answer.get("problems") or [])
    result["output"] = answer.get("output") or {}
    result["delivered"] = answer.get("delivered") or []
    result["withheld"] = answer.get("withheld") or []
    served = answer.get("agent_id")
    if isinstance(served, str) and served and served != known.get("agent_id"):
        result["agent_id"] = served
        # remembered without any run token (the server holds it): the next call's local beat names the
        # agent the server registered
        convo.save_state(rws, key, {"agent_id": served, "session_id": None, "harness": harness,
                                    "conversation_id": conversation, "remote": t.url})
        if served != agent_id:
            write_heartbeat(rws.paths, served, harness=harness, status=_STATUS.get(kind), durable=False,
                            now=quiet.clock()[1])

