"""Telling people (contract §15): events built once, rendered per target format, handed to a background sender.

Other code hands an event over with `emit(ws, type, subject, data, line=...)`; escalation does it for
every incident event. Nothing here waits for the network: `hand_over` writes the pass's events to a spool
file and starts `python -m synapolis.notify_send` in its own session, which outlives the verb or hook
that started it (a thread would die with a CLI process, or keep it from exiting). With no `notify`
targets configured, `emit` returns before importing anything, so a hook pays nothing for it.
"""

from __future__ import annotations

import os
import sys

INCIDENT_PREFIX = "io.synapolis.incident."
INCIDENT_EVENTS = ("opened", "raised", "renotified", "resolved")  # `acked` is the person's own act: not told
GUARD_DENIED = "io.synapolis.guard.denied"
CLAIMS_DEADLOCK = "io.synapolis.claims.deadlock"
TEST = "io.synapolis.test"
OUTBOX = "notify-outbox"  # spool files of passes handed over, each removed by its sender
FAILURE_LOG = "notify-failures.jsonl"  # one line per target still failing after its tries, per pass
# keys never sent, at any depth of `data`: the contract promises no token, run token or password leaves
_SECRET_WORDS = ("token", "password", "passwd", "secret")
_TAGS = {"opened": "warning", "raised": "rotating_light", "renotified": "warning", "resolved": "white_check_mark",
         GUARD_DENIED: "no_entry", CLAIMS_DEADLOCK: "lock", TEST: "test_tube"}


def wants(target: dict, event_type: str) -> bool:
    """Whether `target` takes events of `event_type` (the sender's rule, `notify_send.wants`)."""
    from .notify_send import wants as sender_wants  # the sender owns the rule; imported only when a target exists

    return sender_wants(target, event_type)


def scrub(data):
    """`data` without any key that names a secret (token, run token, password), at any depth."""
    if isinstance(data, dict):
        return {k: scrub(v) for k, v in data.items()
                if not (isinstance(k, str) and any(word in k.lower() for word in _SECRET_WORDS))}
    if isinstance(data, list):
        return [scrub(v) for v in data]
    return data


def source(ws) -> str:
    import socket

    return f"synapolis://{socket.gethostname() or 'localhost'}/{os.path.basename(os.path.abspath(ws.paths.files.root))}"


def message(ws, event_type: str, subject: str, data, line: str | None = None, title: str | None = None,
            high: bool = False, tag: str | None = None, now=None) -> dict:
    """One event as the sender takes it: the CloudEvent's attributes and data, and the readable line, title,
    priority and tags the chat formats use. The id is made here, once, so every try sends the same one."""
    import uuid

    from .timeutil import format_ts, utcnow

    text = line or f"{event_type} {subject}"
    return {
        "event": {"specversion": "1.0", "id": str(uuid.uuid4()), "source": source(ws), "type": event_type,
                  "time": format_ts(now or utcnow(), micro=True), "subject": subject,
                  "datacontenttype": "application/json", "data": scrub(data)},
        "line": text,
        "title": title or f"synapolis: {subject}",
        "priority": "high" if high else "default",
        "tags": ["synapolis"] + ([tag or _TAGS.get(event_type)] if (tag or _TAGS.get(event_type)) else []),
    }


def targets(ws) -> list:
    try:
        return list(ws.config.values.get("notify") or [])
    except AttributeError:
        return []


def emit(ws, event_type: str, subject: str, data, *, line: str | None = None, title: str | None = None,
         high: bool = False, now=None) -> bool:
    """Hand one event to every configured target that wants it; returns at once (True when handed over).

    The public way in for other code, e.g. the guard: `emit(ws, GUARD_DENIED, path, denial, line="guard
    refused Edit of src/app.py for alice (bob holds it): synapolis claims")`. `subject` is the agent id or
    the path; `data` what `--json` shows (keys naming tokens or passwords are dropped); `line` one readable
    line for chat, ending with the command that acts on it; `high` makes ntfy's priority high. Never raises.
    """
    if not targets(ws):
        return False
    try:
        return hand_over(ws, [message(ws, event_type, subject, data, line=line, title=title, high=high, now=now)])
    except Exception:  # noqa: BLE001 - telling people must never break the verb or hook that tells
        return False


def _ack_cmd(ws, incident_id: str) -> str:
    import shlex

    return f"synapolis --state-dir {shlex.quote(os.path.abspath(ws.paths.files.root))} escalations ack {incident_id}"


def incident_message(ws, event: str, incident: dict, now=None) -> dict:
    """The message of one escalation event (`opened`, `raised`, `renotified`, `resolved`) about `incident`."""
    name, level, condition, iid = incident["agent_id"], incident["level"], incident["condition"], incident["id"]
    if name == "@global":
        failing = incident.get("agents") or []
        what = (f"{len(failing)} of {incident.get('total_agents', '?')} agents fail at once "
                f"({', '.join(failing[:5])}{', ...' if len(failing) > 5 else ''}): likely the machine or the monitor")
    else:
        what = f"agent {name} is {condition}"
    if event == "resolved":
        line = f"resolved: {what.replace(' is ', ' was ', 1) if name != '@global' else 'the global incident'} " \
               f"({incident.get('resolution') or 'recovered'}; incident {iid})"
    else:
        lead = {"opened": "", "raised": "now worse: ", "renotified": "still unacked: "}[event]
        line = f"{lead}{what} (level {level}, incident {iid}); ack: {_ack_cmd(ws, iid)}"
    return message(ws, INCIDENT_PREFIX + event, name, incident, line=line,
                   title=f"synapolis: {name} {'resolved' if event == 'resolved' else condition}",
                   high=event != "resolved" and (condition in ("dead", "global") or name == "@global"),
                   tag=_TAGS[event], now=now)


def incident_events(ws, events: list, incidents: dict, now=None) -> bool:
    """Hand over every incident event of one escalation pass (`events` as `reconcile` made them). Never raises."""
    if not targets(ws):
        return False
    try:
        messages = [incident_message(ws, e["event"], incidents[e["key_name"]], now=now)
                    for e in events if e["event"] in INCIDENT_EVENTS]
        return hand_over(ws, messages) if messages else False
    except Exception:  # noqa: BLE001 - a pass never fails for telling people
        return False


def hand_over(ws, messages: list) -> bool:
    """Spool `messages` (one pass) with the targets that want them and start the detached sender; returns
    without waiting. False when no target wants any of them."""
    wanted = [t for t in targets(ws) if any(wants(t, m["event"]["type"]) for m in messages)]
    if not wanted:
        return False
    import json
    import subprocess
    import tempfile

    root = os.path.abspath(ws.paths.files.root)
    spool = {"targets": wanted, "messages": messages, "failure_log": os.path.join(root, FAILURE_LOG)}
    outbox = os.path.join(root, OUTBOX)
    try:
        os.makedirs(outbox, mode=0o700, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="pass-", suffix=".json", dir=outbox)
    except OSError:  # a read-only state directory: the system's temp folder still works
        fd, path = tempfile.mkstemp(prefix="synapolis-notify-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(spool, handle, ensure_ascii=False)
    try:
        subprocess.Popen([sys.executable, "-m", "synapolis.notify_send", path], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                         start_new_session=True)
    except OSError:
        os.unlink(path)
        return False
    return True


def send_test(ws, backoff_factor: float | None = None) -> dict:
    """`notify test`: one `io.synapolis.test` event to every target (whatever its `events`), waited for;
    {"targets": [{url, format, ok, status, tries, error, id}], "delivered", "failed"}."""
    from .notify_send import BACKOFF_FACTOR, deliver

    msg = message(ws, TEST, "notify-test", {"note": "a test from `synapolis notify test`"},
                  line=f"synapolis test notification from {source(ws)}: nothing to do", title="synapolis: test")
    import threading

    configured = targets(ws)
    results: list = [None] * len(configured)

    def run(n, target):
        results[n] = dict(deliver(target, msg, BACKOFF_FACTOR if backoff_factor is None else backoff_factor),
                          id=msg["event"]["id"])

    threads = [threading.Thread(target=run, args=(n, t)) for n, t in enumerate(configured)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    delivered = sum(1 for r in results if r["ok"])
    return {"targets": results, "delivered": delivered, "failed": len(results) - delivered}
