"""The pre-tool guard of a machine that goes through the team server (contract §14, §16): the paths a tool call
would write, made relative to this machine's project, asked of the server's `/api/hook/<harness>`, which
decides with its claims and the conversation's identity as it knows them (harness.pretool.decide) and
answers in the harness's own shape.

A clone of the repository in a sandbox and the team's checkout share project-relative paths, never absolute
ones: only relative paths travel (a path outside this machine's project is not guarded, as beside the store),
and the tool's input (a whole file's content, a patch) stays here. The server away, refusing or slow: the
tool runs, with one line on stderr, within the hook's bound (the guard never blocks work because of its own
failure; docs/HOOKS.md, "Through the team server").
"""

from __future__ import annotations

import json

PATHS_KEY = "synapolis_paths"  # the event key carrying the project-relative paths (web/api_call.run_hook)


def ask(harness: str, event: dict, ws, env, result: dict, wanted: list[str]) -> None:
    """Fill `result` (output, problems, agent_id, blocked) with the server's answer for this pre-tool event."""
    from .. import remote
    from . import conversation as convo

    rel, _outside = remote.relative_paths(ws, wanted)
    if not rel:
        return  # nothing inside the project: nothing to guard, no call
    t = remote.target(ws.config, env)
    forwarded = {"session_id": convo.conversation_id(event), "hook_event_name": convo.event_name(event),
                 "tool_name": event.get("tool_name") or event.get("toolName"), PATHS_KEY: list(rel)}
    headers = {"x-synapolis-env": json.dumps({k: env[k] for k in ("SYNAPOLIS_SUBSTRATE",) if env.get(k)})}
    budget = convo.deadline_s(env) - 0.25  # answer before run_bounded's timer gives up for us
    try:
        status, data = remote.request(t, "POST", f"/api/hook/{harness}", json.dumps(forwarded).encode("utf-8"),
                                      timeout_s=max(budget, 0.5), extra_headers=headers)
        if status != 200:
            raise remote._error_from(t, status, data)
        answer = json.loads(data)
    except (ValueError, OSError) as exc:
        result["problems"].append(f"guard: the server {t.where} gave no answer ({exc}); the tool runs")
        return
    except Exception as exc:  # noqa: BLE001 - a SynapolisError (away, refused): the tool runs
        result["problems"].append(f"guard: {getattr(exc, 'message', None) or exc}; the tool runs")
        return
    result["problems"].extend(answer.get("problems") or [])
    result["agent_id"] = answer.get("agent_id")
    output = answer.get("output")
    result["output"] = output if isinstance(output, dict) else {}
    blocked = answer.get("blocked")
    if isinstance(blocked, list) and blocked:
        # the server names each path as it was sent (project-relative); here, as the tool named it
        result["blocked"] = [dict(b, path=rel.get(b.get("path"), b.get("path"))) if isinstance(b, dict) else b
                             for b in blocked]
