"""The `status` screen: the whole swarm for a person — collected as data, rendered for 80 columns, redrawn on change."""

from __future__ import annotations

import threading
from datetime import datetime

from .atomic import read_json_or
from .heartbeat import iter_heartbeat_paths, read_heartbeat
from .status import effective_status, file_written_at
from .terminal import terminal_safe
from .timeutil import format_ts, humanize_age, parse_ts, utcnow

ANSI = {"active": "32", "idle": "36", "sleeping": "34", "stopped": "2", "stale": "33", "dead": "31;1",
        "invalid": "35", "missing": "35", "held": "32", "expired": "33", "open": "31"}
ORDER = ("active", "idle", "sleeping", "stopped", "stale", "dead", "invalid", "missing")


def _age(moment: str | None, now: datetime) -> float | None:
    try:
        return round((now - parse_ts(moment)).total_seconds(), 3)
    except (TypeError, ValueError):
        return None


def _heartbeat_agents(ws, now: datetime) -> dict:
    monitor = read_json_or(ws.paths.monitor, {})
    previous = {a.get("agent_id"): a for a in (monitor.get("agents") or []) if isinstance(a, dict)} \
        if isinstance(monitor, dict) else {}
    agents = {}
    for path in iter_heartbeat_paths(ws.paths.heartbeats):
        read = read_heartbeat(path)
        doc = read.doc or {}
        entry = {"agent_id": read.agent_id, "declared_status": doc.get("status"), "beat_at": doc.get("beat_at"),
                 "age_s": None, "task": doc.get("task"), "harness": doc.get("harness"),
                 "substrate": doc.get("substrate"), "session_id": doc.get("session_id"), "host": doc.get("host"),
                 "unread": None, "claims": [], "errors": [e["message"] for e in read.errors]}
        if read.valid:
            verdict = effective_status(doc, now, previous=previous.get(read.agent_id),
                                       written_at=lambda p=path: file_written_at(p), **ws.config.thresholds)
            entry["effective_status"], entry["age_s"] = verdict.effective_status, verdict.age_s
        else:
            entry["effective_status"] = "invalid"
        agents[read.agent_id] = entry
    return agents


def _sessions(ws, agents: dict, now: datetime) -> list[dict]:
    """Active sessions with their registered agents; unread counts land on the agent entries."""
    from . import sessions, signals

    found = []
    # a session whose store is damaged or locked is left out: the rest of the screen still shows
    for session_id, conn in sessions.each_store(ws, sessions.active_sessions(ws), skip_broken=True):
        rows = conn.agents()
        unread = {r["id"]: len(signals.unread(conn, r["id"])) for r in rows}
        for row in rows:
            entry = agents.get(row["id"])
            if entry is None:  # registered, but its heartbeat file is gone
                entry = agents[row["id"]] = {
                    "agent_id": row["id"], "effective_status": "missing", "declared_status": None,
                    "beat_at": None, "age_s": _age(row["last_heartbeat"], now), "task": None,
                    "harness": row["harness"], "substrate": row["substrate"], "session_id": session_id,
                    "host": None, "unread": None, "claims": [], "errors": ["no heartbeat file"]}
            entry["unread"] = (entry["unread"] or 0) + unread[row["id"]]
        found.append({"session_id": session_id, "agents": len(rows)})
    return found


def _claims(ws, agents: dict, now: datetime) -> list[dict]:
    try:
        from .claims import list_claims
    except ImportError:  # pragma: no cover - claims are part of every install
        return []
    held = []
    for record in list_claims(ws, now=now):
        if record.get("state") not in ("held", "expired"):
            continue
        entry = {k: record.get(k) for k in ("item", "claimed_by", "token", "expires_at", "state",
                                             "holder_status", "takeable")}
        held.append(entry)
        if record.get("claimed_by") in agents and record.get("state") == "held":
            agents[record["claimed_by"]]["claims"].append(record.get("item"))
    return held


def _incidents(ws) -> list[dict]:
    try:
        from .escalation import list_incidents
    except ImportError:  # pragma: no cover
        return []
    keys = ("id", "agent_id", "level", "condition", "status", "opened_at", "updated_at", "acked_at")
    return [{k: i.get(k) for k in keys} for i in list_incidents(ws)["incidents"]]


def collect(ws, now: datetime | None = None) -> dict:
    """Everything the screen shows, as one JSON object (`status --json`)."""
    now = now or utcnow()
    agents = _heartbeat_agents(ws, now)
    problems = []
    sessions, claims, incidents = [], [], []
    # each part is read on its own so one damaged file cannot blank the whole screen
    for name, read in (("sessions", lambda: _sessions(ws, agents, now)), ("claims", lambda: _claims(ws, agents, now)),
                       ("incidents", lambda: _incidents(ws))):
        try:
            value = read()
        except Exception as exc:  # noqa: BLE001 - shown on the screen instead
            problems.append(f"{name}: {getattr(exc, 'message', None) or exc}")
            value = []
        if name == "sessions":
            sessions = value
        elif name == "claims":
            claims = value
        else:
            incidents = value
    listed = sorted(agents.values(), key=lambda a: a["agent_id"])
    counts = {s: sum(1 for a in listed if a["effective_status"] == s) for s in ORDER}
    return {"generated_at": format_ts(now), "state_dir": str(ws.root),
            "counts": {k: v for k, v in counts.items() if v}, "agents": listed, "sessions": sessions,
            "claims": claims, "incidents": incidents, "problems": problems}


# -- the screen ----------------------------------------------------------------------------------

def _fit(text, width: int) -> str:
    text = "" if text is None else " ".join(str(text).split())
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def _paint(text: str, key: str | None, colour: bool) -> str:
    code = ANSI.get(key or "")
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def _table(headers, rows, widths, colour, paint_col=None) -> list[str]:
    """Rows of (cell, colour key) fitted to `widths`; the last column takes what is left."""
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in rows:
        cells = []
        for i, (w, value) in enumerate(zip(widths, row)):
            cell = _fit(value, w)
            cell = cell.rjust(w) if isinstance(value, int) else cell.ljust(w)
            if i == paint_col:
                cell = _paint(cell, row[i], colour)
            cells.append(cell)
        lines.append("  ".join(cells).rstrip())
    return lines


def _wrap(tokens, width: int, colour: bool) -> list[str]:
    """(text, colour key) tokens joined by " · ", wrapped so no line passes `width` visible columns."""
    lines, line, used = [], [], 0
    for text, key in tokens:
        cost = len(text) + (3 if line else 0)
        if line and used + cost > width:
            lines.append(" · ".join(line))
            line, used, cost = [], 0, len(text)
        line.append(_paint(text, key, colour))
        used += cost
    if line:
        lines.append(" · ".join(line))
    return lines


def render(data: dict, width: int = 80, colour: bool = False, now: datetime | None = None) -> str:
    """The screen as text: no line longer than `width` (colour codes aside)."""
    width = min(max(width, 60), 1000)  # a huge --width would pad every line with gigabytes of spaces
    now = now or parse_ts(data["generated_at"])
    stamp = data["generated_at"][:19] + "Z"
    head = f"synapolis · {data['state_dir']}"
    lines = [_fit(head, width - len(stamp) - 2) + "  " + stamp]
    tokens = [(f"{n} {s}", s) for s, n in data["counts"].items()] or [("no agents", None)]
    tokens += [(f"{sum(1 for c in data['claims'] if c['state'] == 'held')} claim(s) held", None),
               (f"{len(data['incidents'])} open incident(s)", "open" if data["incidents"] else None)]
    lines += _wrap(tokens, width, colour) + [""]
    if data["agents"]:
        # a wider terminal gives long ids room first: they are what a person copies into commands
        agent_w = min(26 + max(0, width - 80) // 2, max(len("AGENT"), max(len(a["agent_id"]) for a in data["agents"])))
        task_w = max(width - (agent_w + 8 + 6 + 6 + 4 * 2), 10)
        rows = []
        for a in data["agents"]:
            what = a["task"] or ""
            if a["claims"]:
                what = f"[{', '.join(a['claims'])}] {what}".strip()
            if a["errors"] and a["effective_status"] in ("invalid", "missing"):
                what = a["errors"][0]
            # a task is any agent's text (a heartbeat file anyone may write): escapes, not terminal commands
            rows.append([a["agent_id"], a["effective_status"], humanize_age(a["age_s"]).replace(" ago", ""),
                         a["unread"] if a["unread"] is not None else "-", terminal_safe(str(what))])
        lines += _table(["AGENT", "STATUS", "AGE", "UNREAD", "TASK / CLAIMS"], rows,
                        [agent_w, 8, 6, 6, task_w], colour, paint_col=1)
    else:
        lines.append("no agents yet: `synapolis start` (or a harness hook) registers one")
    if data["claims"]:
        lines.append("")
        item_w = min(34, max(4, max(len(c["item"] or "") for c in data["claims"])))
        holder_w = max(width - item_w - 6 - 10 - 8 - 2 * 4, 10)
        rows = []
        for c in data["claims"]:
            left = None
            try:
                left = (parse_ts(c["expires_at"]) - now).total_seconds()
            except (TypeError, ValueError):
                pass
            expires = "expired" if c["state"] == "expired" else humanize_age(-left if left is not None else None)
            rows.append([c["item"], c["token"], c["state"], expires,
                         f"{c['claimed_by']} ({c.get('holder_status')})"])
        lines += _table(["CLAIM", "TOKEN", "STATE", "EXPIRES", "HOLDER"], rows,
                        [item_w, 6, 10, 8, holder_w], colour, paint_col=2)
    if data["incidents"]:
        lines.append("")
        rows = [[i["id"], i["level"], i["condition"], humanize_age(_age(i["opened_at"], now)),
                 i["agent_id"] + (" (acked)" if i.get("acked_at") else "")] for i in data["incidents"]]
        id_w = min(20, max(len("INCIDENT"), max(len(str(r[0])) for r in rows)))
        lines += _table(["INCIDENT", "LEVEL", "CONDITION", "OPENED", "AGENT"], rows,
                        [id_w, 5, 9, 8, max(width - id_w - 5 - 9 - 8 - 8, 10)], colour)
    for problem in data["problems"]:
        lines.append(_fit(f"! {problem}", width))
    return "\n".join(lines)


# -- --watch -------------------------------------------------------------------------------------

_WATCHED_SUFFIXES = (".json", ".jsonl", "-wal")


def _relevant(path: str) -> bool:
    from .atomic import is_temp_name

    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    if is_temp_name(name) or "/.locks/" in path.replace("\\", "/"):
        return False
    return name.endswith(_WATCHED_SUFFIXES)


def watch(ws, redraw, stop: threading.Event | None = None, refresh_s: float = 5.0, settle_s: float = 0.2) -> None:
    """Call `redraw()` now, whenever the state directory changes, and every `refresh_s` (ages move on).

    Changes come from a watchdog observer (imported here, never at start-up); a burst of events is
    one redraw. Reading a session database may itself touch its files, so only writes that matter
    count: JSON documents and the WAL of a session (a new signal), never deletions or lock files.
    """
    from .watching import event_handler, start_observer, stop_observer, writes_only

    stop = stop or threading.Event()
    changed = threading.Event()

    def on_event(event):
        if event.is_directory or event.event_type not in ("created", "modified", "moved"):
            return
        path = getattr(event, "dest_path", None) or event.src_path
        if _relevant(str(path)):
            changed.set()

    handler = event_handler(on_event)
    root = ws.root
    watched = root if root.is_dir() else next((p for p in root.parents if p.is_dir()), root)
    observer = start_observer(handler, watched, recursive=watched == root, poll_interval_s=1.0,
                              event_filter=writes_only())  # the redraw's own reads wake no watcher thread
    try:
        redraw()
        while not stop.is_set():
            fired = changed.wait(refresh_s)
            if stop.is_set():
                break
            if fired:
                stop.wait(settle_s)  # let a burst of writes finish: one redraw for all of them
            changed.clear()
            if watched != root and root.is_dir():
                observer.unschedule_all()
                observer.schedule(handler, str(root), recursive=True, event_filter=writes_only())
                watched = root
            redraw()
    except KeyboardInterrupt:
        pass
    finally:
        stop_observer(observer, timeout=2)
