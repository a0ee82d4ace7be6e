"""Escalation incidents: the notifier, the writer, ack and listing (contract §6); the policy is rules/escalation.

Where incidents live is the store's business (`Store.escalation_book()`): files under the local lock with
the SQLite store (store/local/incidents.py, `file_book`), tables shared by every machine with the PostgreSQL
store, which then mirrors them into this machine's `escalations/` files for local readers (§12).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
from datetime import datetime

from .atomic import read_json
from .errors import InternalError, NotFoundError, UsageError
from .rules.escalation import (GLOBAL, GLOBAL_MIN_AGENTS, _event, _new_incident, _touch, incident_key,  # noqa: F401
                               is_open, reconcile)
from .store.local.incidents import (FileBook, file_book, file_log, is_incident, load_incidents,  # noqa: F401
                                    mirror)
from .timeutil import format_ts, utcnow

MAX_NOTIFICATIONS = 10  # per incident; the full story is in escalations.jsonl
MIN_ID_PREFIX = 6
_STDERR_TAIL = 300


def run_notifier(cmd: list[str] | None, incident: dict, event: str, timeout_s: float) -> dict | None:
    """Run `cmd` (never through a shell) with the incident as JSON on stdin, within `timeout_s`.

    Returns what happened as a record; never raises: a notifier's failure must not stop a pass.
    """
    if not cmd:
        return None
    record = {"at": format_ts(utcnow()), "event": event, "ok": False, "exit_code": None, "error": None}
    env = dict(os.environ, SYNAPOLIS_EVENT=event, SYNAPOLIS_INCIDENT_ID=str(incident.get("id")),
               SYNAPOLIS_INCIDENT_KEY=str(incident.get("key")))
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env, start_new_session=True)
    except (OSError, ValueError) as exc:
        record["error"] = f"cannot run {cmd[0]!r}: {getattr(exc, 'strerror', None) or exc}"
        return record
    payload = json.dumps(incident, ensure_ascii=False).encode("utf-8")
    try:
        _out, err = proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipe
            proc.stderr.close()
            proc.wait()
        record["error"] = f"timed out after {timeout_s}s (killed)"
        return record
    record["exit_code"] = proc.returncode
    record["ok"] = proc.returncode == 0
    if not record["ok"]:
        tail = (err or b"").decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        record["error"] = f"exit {proc.returncode}" + (f": {tail}" if tail else "")
    return record


def _kill_group(proc: subprocess.Popen) -> None:
    # the notifier runs in its own session, so its children die with it
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()
    except OSError:
        pass


def _deliver(ws, incident: dict, event: dict, on_alert=None) -> None:
    """Tell the world about one event: on_alert (opened/raised) and the notifier, recorded in both."""
    if on_alert is not None and event["event"] in ("opened", "raised"):
        try:
            on_alert(copy.deepcopy(incident))
            event["alert"] = {"ok": True}
        except Exception as exc:  # noqa: BLE001 - an alert hook must never stop the pass
            event["alert"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        cmd = ws.config.notify_cmd
    except UsageError as exc:  # an unsplittable string: the notifier fails, the incident still opens
        result = {"at": format_ts(utcnow()), "event": event["event"], "ok": False, "exit_code": None,
                  "error": exc.message}
    else:
        result = run_notifier(cmd, incident, event["event"], ws.config.notify_timeout_s)
    event["notify"] = result
    if result is not None:
        incident["notifications"] = (list(incident.get("notifications") or []) + [result])[-MAX_NOTIFICATIONS:]


def _log_record(event: dict, incident: dict) -> dict:
    record = {k: v for k, v in event.items() if k != "key_name"}
    record["incident"] = incident
    return record


def read_monitor(paths):
    """The current monitor document, or None when there is none yet."""
    try:
        document = read_json(paths.monitor)
    except FileNotFoundError:
        return None
    except ValueError:
        raise InternalError(f"{paths.monitor} is not valid JSON: run `synapolis monitor` to rewrite it") from None
    if not isinstance(document, dict):
        raise InternalError(f"{paths.monitor} is not a monitor document: run `synapolis monitor` to rewrite it")
    return document


def run_escalation(ws, now: datetime | None = None, on_alert=None) -> dict:
    """Reconcile incidents with the current monitor, tell the notifier, write files and the log.

    `on_alert(incident)` is called for each opened or raised incident; by default it is the `warn`
    broadcast into each active session the agent belongs to (contract §6). Its exceptions are
    recorded in the event, never raised.
    """
    store = ws.store
    now = now or store.now()
    if on_alert is None:
        from .alerts import warn_sessions

        def on_alert(incident):
            warn_sessions(ws, incident, now=now)
    paths = ws.paths
    # one writer at a time: on this machine, and with a shared store across every machine
    with store.escalation_book() as book:
        monitor = read_monitor(paths)
        current = book.current()
        if monitor is None:
            return {"monitor_generated_at": None, "events": [], "incidents": _open_list(current),
                    "message": "no monitor document yet: run `synapolis monitor` first"}
        incidents, events = reconcile(monitor, current, now, ws.config)
        for event in events:
            _deliver(ws, incidents[event["key_name"]], event, on_alert)
        changed = {name: incident for name, incident in incidents.items() if incident != current.get(name)}
        book.record(changed, [_log_record(e, incidents[e["key_name"]]) for e in events])
    if events:
        from .notify import incident_events

        # the `notify` targets (§15), beside notify_cmd: handed to a background sender, never waited for
        incident_events(ws, events, incidents, now=now)
    records = [{k: v for k, v in e.items() if k != "key_name"} for e in events]
    return {
        "monitor_generated_at": monitor.get("generated_at"),
        "events": records,
        "incidents": _open_list(incidents),
        "notify_failures": [e for e in records if e.get("notify") and not e["notify"]["ok"]],
        "alert_failures": [e for e in records if e.get("alert") and not e["alert"]["ok"]],
    }


def _sorted(incidents) -> list:
    return sorted(incidents, key=lambda i: (str(i.get("opened_at")), str(i.get("id"))))


def _open_list(incidents: dict) -> list:
    return _sorted(i for i in incidents.values() if is_open(i))


def list_incidents(ws, include_resolved: bool = False) -> dict:
    """Open incidents, or with `include_resolved` every incident ever (from the log and the files)."""
    store = ws.store
    current = store.incidents()
    if not include_resolved:
        return {"incidents": _open_list(current)}
    latest = {}
    for record in store.incident_log():
        incident = record.get("incident")
        if is_incident(incident):
            latest[incident["id"]] = incident
    for incident in current.values():  # the current records are the truth for current incidents
        latest[incident["id"]] = incident
    return {"incidents": _sorted(latest.values())}


def _find(current: dict, incident_id: str) -> str:
    exact = [name for name, i in current.items() if i["id"] == incident_id]
    if exact:
        return exact[0]
    if len(incident_id) < MIN_ID_PREFIX:
        raise NotFoundError(f"no current incident with id {incident_id!r} "
                            f"(give the full id or at least {MIN_ID_PREFIX} characters of it)")
    matches = [name for name, i in current.items() if i["id"].startswith(incident_id)]
    if not matches:
        raise NotFoundError(f"no current incident with id {incident_id!r}: `synapolis escalations --all` lists them")
    if len(matches) > 1:
        raise UsageError(f"id prefix {incident_id!r} matches {len(matches)} incidents; give more of it")
    return matches[0]


def ack(ws, incident_id: str, now: datetime | None = None) -> dict:
    """Acknowledge a current incident so it is not re-notified; acking twice changes nothing."""
    store = ws.store
    now = now or store.now()
    at = format_ts(now)
    with store.escalation_book() as book:
        current = book.current()
        name = _find(current, incident_id)
        incident = current[name]
        if incident.get("acked_at"):
            return {"incident": incident, "acked": False}
        incident["acked_at"] = at
        _touch(incident, "acked", at, notify=False)
        event = _event("acked", name, incident, at)
        _deliver(ws, incident, event)
        book.record({name: incident}, [_log_record(event, incident)])
    return {"incident": incident, "acked": True}
