"""The escalation writer's `warn`: a system broadcast into each session of a failing agent (contract §6)."""

from __future__ import annotations

from datetime import datetime

from . import signals as sig
from .sessions import active_sessions, sessions_of_agent
from .store import clock, open_session


def warn_sessions(ws, incident: dict, now: datetime | None = None) -> list[dict]:
    """The escalation writer's `warn`: a broadcast from `synapolis.watchdog` into each active session
    the incident's agent is registered in (every active session for `@global`)."""
    now = clock(ws, now)
    agent = str(incident.get("agent_id") or "@global")
    targets = active_sessions(ws) if agent.startswith("@") else sessions_of_agent(ws, agent)
    condition = incident.get("condition", "failing")
    failing = [str(a) for a in incident.get("agents") or []]
    what = (f"{len(failing) or 'many'} of {incident.get('total_agents', '?')} agents are failing at once"
            f"{': ' + ', '.join(failing[:10]) if failing else ''} (incident {incident.get('id', '?')}); "
            "the machine or the monitor is the likely cause"
            if agent.startswith("@") else
            f"agent {agent} is {condition} (incident {incident.get('id', '?')}, level {incident.get('level', 1)}); "
            "its work may need taking over")
    sent = []
    for session_id in targets:
        with open_session(ws, session_id) as store, store.write() as conn:
            doc, _aud = sig.send(conn, caller=None, recipient=sig.BROADCAST, content=what, now=now,
                                 config=ws.config, type_="warn", sender=sig.SYSTEM_SENDER, rate_limited=False)
        sent.append({"session_id": session_id, "signal_id": doc["id"]})
    return sent
