"""Commands of §6: monitor, escalate, escalations (list and ack), watchdog."""

from __future__ import annotations

import click

from ..config import MAX_INTS
from ..timeutil import humanize_age, parse_ts, utcnow
from .common import ago, emit, json_option, pass_workspace, table, workspace


def _monitor_text(doc) -> list[str]:
    now = parse_ts(doc["generated_at"])
    rows = [[a["agent_id"], a["effective_status"], a["declared_status"] or "-",
             humanize_age(a["age_s"]), ago(a["since"], now), ",".join(a["anomalies"]),
             (a["errors"][0]["message"][:60] if a["errors"] else (a["task"] or ""))] for a in doc["agents"]]
    lines = [table(rows, ["AGENT", "STATUS", "DECLARED", "AGE", "SINCE", "ANOMALIES", "TASK / ERROR"])] if rows else []
    counted = ", ".join(f"{n} {s}" for s, n in doc["counts"].items() if n)
    lines.append(f"{len(doc['agents'])} agent(s){': ' + counted if counted else ''}")
    for t in doc["transitions"]:
        lines.append(f"  {t['agent_id']}: {t['from'] or '(new)'} -> {t['to'] or '(gone)'}")
    return lines


@click.command("monitor")
@click.option("--keep", type=click.IntRange(min=1, max=MAX_INTS["monitor_keep"]), default=None,
              help="Keep this many snapshots in monitor-history/ (default: monitor_keep; at most "
                   f"{MAX_INTS['monitor_keep']:,}, as the key).")
@click.option("--no-rotate", is_flag=True, help="Overwrite heartbeat-monitor.json without keeping the previous one.")
@click.option("--watch", is_flag=True, help="Re-derive whenever a heartbeat changes, until interrupted.")
@json_option
@pass_workspace(create=True)
def monitor_cmd(ws, keep, no_rotate, watch, as_json):
    """Derive every agent's effective status into heartbeat-monitor.json (it does not escalate).

    Example: synapolis --state-dir ./state monitor --keep 48 --json
    """
    from ..monitor import run_monitor, watch_monitor

    if not watch:
        emit(as_json, run_monitor(ws, keep=keep, rotate=not no_rotate), _monitor_text)
        return

    def show(doc):
        # one JSON document per line, like read-signals --follow
        emit(as_json, doc, lambda d: [f"--- {d['generated_at']}"] + _monitor_text(d))

    try:
        watch_monitor(ws, show, keep=keep, rotate=not no_rotate)
    except KeyboardInterrupt:
        pass


def _event_text(result) -> list[str]:
    lines = []
    for e in result["events"]:
        note = ""
        if e.get("notify") and not e["notify"]["ok"]:
            note = f"  (notifier failed: {e['notify']['error']})"
        lines.append(f"{e['event']:<10} {e['key']:<40} level {e['level']} {e['condition']:<8} {e['incident_id']}{note}")
    if result.get("message"):
        lines.append(result["message"])
    lines.append(f"{len(result['events'])} event(s); {len(result['incidents'])} open incident(s)")
    return lines


@click.command("escalate")
@json_option
@pass_workspace(create=True)
def escalate_cmd(ws, as_json):
    """Open, raise, re-notify and resolve incidents from the current heartbeat-monitor.json.

    Example: synapolis --state-dir ./state escalate --json
    """
    from ..escalation import run_escalation

    emit(as_json, run_escalation(ws), _event_text)


def _incidents_text(data) -> list[str]:
    now = utcnow()
    rows = [[i["id"], i["agent_id"], i["level"], i["condition"], i["status"], ago(i["opened_at"], now),
             ago(i.get("acked_at"), now)] for i in data["incidents"]]
    if not rows:
        return ["no incidents"]
    return [table(rows, ["ID", "AGENT", "LEVEL", "CONDITION", "STATUS", "OPENED", "ACKED"])]


@click.group("escalations", invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Resolved incidents too, from escalations.jsonl.")
@json_option
@click.pass_context
def escalations_cmd(ctx, show_all, as_json):
    """List open escalation incidents (`--all`: every incident); `escalations ack ID` acknowledges one.

    Example: synapolis escalations --all --json
    """
    if ctx.invoked_subcommand is not None:
        return
    ws = workspace(ctx)  # first: through the team server, it is the server's list_incidents that is imported (§16)
    from ..escalation import list_incidents

    emit(as_json, list_incidents(ws, include_resolved=show_all), _incidents_text)


@escalations_cmd.command("ack")
@click.argument("incident_id")
@json_option
@pass_workspace(create=True)
def escalations_ack_cmd(ws, incident_id, as_json):
    """Acknowledge an incident (full id or 6+ leading characters): it is no longer re-notified.

    Example: synapolis escalations ack 3f2a9c01d4e5b6a7
    """
    from ..escalation import ack

    result = ack(ws, incident_id)
    emit(as_json, result, lambda d: f"{'acked' if d['acked'] else 'already acked'} {d['incident']['id']} "
                                    f"({d['incident']['key']}, level {d['incident']['level']})")


def _watchdog_text(r) -> str:
    if not r["ran"]:
        return r["message"]
    parts = []
    if r["validate"]:
        parts.append(f"{r['validate']['files']} heartbeat(s), {r['validate']['invalid']} invalid")
    if r["monitor"]:
        parts.append(", ".join(f"{n} {s}" for s, n in r["monitor"]["counts"].items() if n) or "no agents")
    if r["escalation"]:
        parts.append(f"{len(r['escalation']['events'])} escalation event(s), {r['escalation']['open']} open")
    parts.append(f"{len(r['swept'])} temp file(s) swept")
    parts.append("claims: not available" if r["claims_reaped"] is None else f"{len(r['claims_reaped'])} claim(s) reaped")
    parts.append(f"{len(r['sessions_flagged'])} session agent(s) flagged")
    for e in r["errors"]:
        parts.append(f"ERROR in {e['step']}: {e['type']}: {e['message']}")
    return "watchdog: " + " · ".join(parts)


@click.command("watchdog")
@json_option
@pass_workspace(create=True)
def watchdog_cmd(ws, as_json):
    """One cron pass: validate, monitor, escalate, sweep old temp files, reap claims, flag stale agents.

    Exits 0 whenever the pass ran (or another pass is running), even when a step failed: the failure
    is listed under `errors` and in the log line; non-zero only when it could not run at all.

    Example: synapolis --state-dir ./state watchdog --json
    """
    from ..watchdog import run_watchdog

    result = run_watchdog(ws)
    emit(as_json, result, _watchdog_text)
