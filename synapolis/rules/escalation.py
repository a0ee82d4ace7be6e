"""The escalation policy (contract §6): incidents reconciled with a monitor document at `now`. Pure."""

from __future__ import annotations

import copy
import secrets
from datetime import datetime

from ..errors import UsageError
from ..names import validate_agent_id
from ..status import FAILING
from ..timeutil import format_ts, parse_ts


GLOBAL = "@global"
GLOBAL_MIN_AGENTS = 4


def incident_key(name: str) -> str:
    return f"heartbeat:{name}"


def is_open(incident) -> bool:
    return isinstance(incident, dict) and incident.get("status") == "open"


def _new_incident(name: str, level: int, condition: str, at: str, **extra) -> dict:
    incident = {
        "id": secrets.token_hex(8),
        "key": incident_key(name),
        "agent_id": name,
        "level": level,
        "condition": condition,
        "status": "open",
        "opened_at": at,
        "updated_at": at,
        "resolved_at": None,
        "acked_at": None,
        "notifications": [],
        "notified_at": at,
        "last_event": "opened",
        "resolution": None,
    }
    incident.update(extra)
    return incident


def _touch(incident: dict, event: str, at: str, notify: bool = True) -> None:
    incident["updated_at"] = at
    incident["last_event"] = event
    if notify:
        incident["notified_at"] = at


def _event(event: str, name: str, incident: dict, at: str) -> dict:
    return {"at": at, "event": event, "key_name": name, "incident_id": incident["id"], "key": incident["key"],
            "agent_id": incident["agent_id"], "level": incident["level"], "condition": incident["condition"]}


def _due(incident: dict, now: datetime, repeat_after_s: float) -> bool:
    if not is_open(incident) or incident.get("acked_at"):
        return False
    try:
        last = parse_ts(incident.get("notified_at") or incident["opened_at"])
    except (KeyError, ValueError):
        return True
    return (now - last).total_seconds() >= repeat_after_s


def _valid_name(agent_id: str) -> bool:
    try:
        validate_agent_id(agent_id)
        return True
    except UsageError:
        return False


def reconcile(monitor_doc: dict, current_incidents: dict, now: datetime, config) -> tuple[dict, list]:
    """The incidents after reconciling `current_incidents` with `monitor_doc` at `now`, and the events.

    Pure. `current_incidents` maps a key name (agent id or "@global") to that key's current incident
    (open or resolved). State-based, so a second call with the result changes nothing.
    """
    at = format_ts(now)
    incidents = copy.deepcopy(current_incidents)
    events: list[dict] = []
    statuses = {a["agent_id"]: a.get("effective_status") for a in monitor_doc.get("agents") or []
                if isinstance(a, dict) and isinstance(a.get("agent_id"), str)}
    failing = sorted(agent for agent, status in statuses.items() if status in FAILING)
    dead = [agent for agent in failing if statuses[agent] == "dead"]
    global_now = len(statuses) >= GLOBAL_MIN_AGENTS and 2 * len(failing) > len(statuses)
    notified = set()

    current = incidents.get(GLOBAL)
    if global_now:
        level = 2 if dead else 1
        if not is_open(current):
            incidents[GLOBAL] = _new_incident(GLOBAL, level, "global", at, agents=failing, total_agents=len(statuses))
            events.append(_event("opened", GLOBAL, incidents[GLOBAL], at))
            notified.add(GLOBAL)
        else:
            if level > current["level"]:
                current["level"] = level
                _touch(current, "raised", at)
                events.append(_event("raised", GLOBAL, current, at))
                notified.add(GLOBAL)
            if current.get("agents") != failing or current.get("total_agents") != len(statuses):
                current["agents"], current["total_agents"] = failing, len(statuses)
                current["updated_at"] = at
    elif is_open(current):
        _resolve(current, at, "fewer than half of the agents fail")
        events.append(_event("resolved", GLOBAL, current, at))
        notified.add(GLOBAL)

    for name in sorted((set(statuses) | set(incidents)) - {GLOBAL}):
        if not _valid_name(name):
            continue  # no incident file can be named after it; the global count still saw it
        status = statuses.get(name)
        incident = incidents.get(name)
        if status in FAILING:
            level = 2 if status == "dead" else 1
            if global_now:
                pass  # the global incident stands for every agent failing now (likely one cause)
            elif not is_open(incident):
                incidents[name] = _new_incident(name, level, status, at)
                events.append(_event("opened", name, incidents[name], at))
                notified.add(name)
            elif level > incident["level"]:
                incident["level"], incident["condition"] = level, status
                _touch(incident, "raised", at)
                events.append(_event("raised", name, incident, at))
                notified.add(name)
            elif incident["condition"] != status:
                # stale <-> invalid at one level, or dead back to stale: no news, keep the level
                incident["condition"] = status
                incident["updated_at"] = at
        elif is_open(incident):
            _resolve(incident, at, f"recovered: {status}" if status else "heartbeat file removed")
            events.append(_event("resolved", name, incident, at))
            notified.add(name)

    for name in sorted(incidents):
        incident = incidents[name]
        if name not in notified and _due(incident, now, config.repeat_after_s):
            _touch(incident, "renotified", at)
            events.append(_event("renotified", name, incident, at))
    return incidents, events


def _resolve(incident: dict, at: str, why: str) -> None:
    incident["status"] = "resolved"
    incident["resolved_at"] = at
    incident["resolution"] = why
    _touch(incident, "resolved", at)
