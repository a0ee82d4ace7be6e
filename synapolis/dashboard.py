"""What the team server's dashboard shows (contract §13), as one JSON object, and what a person may post.

`collect` is `status --json` (every agent with its effective status, age, host, task and claims; open
incidents) plus, for each active session, its newest signals (each with who it was delivered to and who
read it), notes, whiteboard and staged memories, the memory ledger's newest lines, and the guard's newest
events (guard_events.py). `agent_view` is one
agent's page: its beat history and transitions from the monitor's snapshots, its signals with their
delivery state, its claims and notes. `Poster` sends a note or a signal as a person, or as the agent a
pinned token is. The web page (synapolis/web/) only renders these.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from . import actions, board, overview, people, signals
from .errors import NoIdentityError, SynapolisError, UsageError
from .identity import Who
from .sessions import active_sessions, each_store

from .timeutil import utcnow

SIGNALS_SHOWN = 20
NOTES_SHOWN = 20
LEDGER_SHOWN = 20
EVENTS_SHOWN = 50  # guard denials, refused commits and deadlocks, newest first (the store keeps 200)
EVENTS_RECENT_S = 3600  # the title counts the events of the last hour: what happens now, not all that is kept
RECEIPTS_SCANNED = 200  # per reader: how far back a signal's delivery state is looked up


def collect(ws, now: datetime | None = None, *, signals_shown: int = SIGNALS_SHOWN,
            notes_shown: int = NOTES_SHOWN) -> dict:
    now = now or utcnow()
    data = overview.collect(ws, now)
    shown = []
    try:
        ids = shown_sessions(ws)
    except SynapolisError as exc:
        data["problems"].append(f"sessions: {exc.message}")
        ids = []
    # a damaged or locked session store is left out: the rest of the page still shows
    for session_id, tx in each_store(ws, ids, skip_broken=True):
        recent = [people.mark(g, "sender") for g in signals.recent(tx, signals_shown)]
        with_receipts(tx, recent)
        shown.append({"session_id": session_id, "signals": recent, "whiteboard": board.read_entries(tx),
                      "staged_memories": _staged(tx)})
    for entry in shown:
        try:
            entry["notes"] = [people.mark(n, "agent_id")
                              for n in ws.store.read_notes(entry["session_id"], notes_shown)]
        except (OSError, SynapolisError) as exc:
            entry["notes"] = []
            data["problems"].append(f"notes of {entry['session_id']}: {exc}")
    data["activity"] = shown
    try:
        data["ledger"] = ws.store.read_ledger()[-LEDGER_SHOWN:]
    except (OSError, SynapolisError) as exc:
        data["ledger"] = []
        data["problems"].append(f"ledger: {getattr(exc, 'message', exc)}")
    _with_events(ws, data, now)
    return data


def _with_events(ws, data: dict, now: datetime) -> None:
    """`events`: the guard's newest refusals (denied tool calls, refused commits, refused deadlocks), and
    `events_recent`: how many of them happened in the last EVENTS_RECENT_S (the page's title counts them)."""
    from .guard_events import recent
    from .timeutil import format_ts

    try:
        data["events"] = recent(ws, EVENTS_SHOWN)
    except (OSError, SynapolisError) as exc:
        data["events"] = []
        data["problems"].append(f"events: {getattr(exc, 'message', exc)}")
    since = format_ts(now - timedelta(seconds=EVENTS_RECENT_S), micro=True)
    data["events_recent"] = sum(1 for e in data["events"] if isinstance(e.get("at"), str) and e["at"] >= since)


def _staged(tx) -> list[dict]:
    from .sleep import staged_entries

    entries, _broken = staged_entries(tx)
    return [{k: e.get(k) for k in ("agent_id", "text", "key", "tags", "created_at")} for e in entries]


def with_receipts(tx, shown: list) -> None:
    """Give each signal of `shown` its `receipts`: for every registered agent that can see it, when it was
    delivered (and how) and when read, from that reader's own view (signals.query, a pure read). A signal
    with no receipt yet has reached nobody: the honest delivery the product is built on, made visible."""
    if not shown:
        return
    by_id = {g["id"]: g for g in shown}
    for g in shown:
        g["receipts"] = []
    floor = min(g["sequence"] for g in shown) - 1
    for row in tx.agents():
        try:
            seen = signals.query(tx, row["id"], unread_only=False, after=floor, limit=RECEIPTS_SCANNED)
        except SynapolisError:
            continue
        for g in seen:
            if g["id"] in by_id:
                by_id[g["id"]]["receipts"].append({"agent_id": row["id"], "delivered_at": g.get("delivered_at"),
                                                   "delivery_method": g.get("delivery_method"),
                                                   "read_at": g.get("read_at")})


def agent_view(ws, agent_id: str, now: datetime | None = None) -> dict:
    """One agent for a person: its current entry, beat history and transitions (from monitor-history/ and
    the current monitor), its signals with delivery state, its claims and its notes."""
    from .atomic import json_files, read_json_or
    from .claims import list_claims
    from .errors import NotFoundError
    from .names import validate_agent_id

    validate_agent_id(agent_id)
    now = now or utcnow()
    data = collect(ws, now, signals_shown=0, notes_shown=0)
    entry = next((a for a in data["agents"] if a["agent_id"] == agent_id), None)
    if entry is None:
        raise NotFoundError(f"no agent {agent_id!r} here (no heartbeat, not in an active session)")
    history, transitions = [], []
    snapshots = [read_json_or(p) for p in json_files(ws.paths.monitor_history)] + [read_json_or(ws.paths.monitor)]
    for doc in sorted((d for d in snapshots if isinstance(d, dict) and isinstance(d.get("generated_at"), str)),
                      key=lambda d: d["generated_at"]):
        for a in doc.get("agents") or []:
            if isinstance(a, dict) and a.get("agent_id") == agent_id:
                history.append({k: a.get(k) for k in ("effective_status", "declared_status", "beat_at", "seq",
                                                      "age_s", "task")} | {"at": doc["generated_at"]})
        for t in doc.get("transitions") or []:
            if isinstance(t, dict) and t.get("agent_id") == agent_id:
                transitions.append({"at": doc["generated_at"], "from": t.get("from"), "to": t.get("to")})
    unique = {}
    for t in transitions:  # the current monitor and its own history file may both carry one transition
        unique[(t["at"], t["from"], t["to"])] = t
    view = {"agent": entry, "history": history, "transitions": list(unique.values()), "signals": [],
            "claims": [c for c in list_claims(ws, now=now) if c.get("claimed_by") == agent_id], "notes": [],
            "generated_at": data["generated_at"]}
    session_id = entry.get("session_id")
    if session_id:
        for _sid, tx in each_store(ws, [session_id], skip_broken=True):
            mine = []
            try:
                mine = signals.query(tx, agent_id, unread_only=False, limit=SIGNALS_SHOWN)
            except SynapolisError:
                pass  # a heartbeat's session this agent is not registered in
            sent = [g for g in signals.recent(tx, 4 * SIGNALS_SHOWN) if g["sender"] == agent_id][-SIGNALS_SHOWN:]
            with_receipts(tx, sent)
            for g in mine:
                g["direction"] = "in"
            for g in sent:
                g["direction"] = "out"
            view["signals"] = [people.mark(g, "sender") for g in sorted(mine + sent, key=lambda g: g["sequence"])]
        try:
            notes = ws.store.read_notes(session_id, 4 * NOTES_SHOWN)
            view["notes"] = [n for n in notes if n.get("agent_id") == agent_id][-NOTES_SHOWN:]
        except (OSError, SynapolisError) as exc:
            view["problems"] = [f"notes: {getattr(exc, 'message', exc)}"]
    return view


def shown_sessions(ws) -> list[str]:
    """The sessions whose activity the page shows: the active ones."""
    return active_sessions(ws)


class Poster:
    """Posts notes and signals from the page. A token pinned to an agent posts as that agent (the token vouches
    for it, require_run_token or not; it must be registered in the session). Any other token that may write
    posts as a person (people.py): the note or signal says a person wrote it, and no agent's heartbeat or
    registry entry is touched, so no dead agent comes back and no name typed becomes an agent."""

    def __init__(self, ws_of):
        self._ws_of = ws_of  # () -> the Workspace as of now (its config may change)

    def post(self, token_name: str, pinned: str | None, session_id: str, *, note: str | None = None,
             to: str | None = None, content: str | None = None, type: str = "inform",
             idempotency_key: str | None = None) -> dict:
        ws = self._ws_of()
        if (note is None) == (content is None):
            raise UsageError("post a note or a signal")
        if pinned is None:
            if note is not None:
                return people.note(ws, token_name, session_id, note, idempotency_key=idempotency_key)
            return people.signal(ws, token_name, session_id, to, content, type=type, idempotency_key=idempotency_key)
        who = Who(pinned, session_id, None, named_only=True, vouched=True)
        try:
            # the page's key for this post: a post sent again (an answer lost, a second click) stores nothing twice
            if note is not None:
                return actions.note(ws, who, note, env={}, piggyback=False, idempotency_key=idempotency_key)
            return actions.signal(ws, who, to, content, type=type, env={}, piggyback=False,
                                  idempotency_key=idempotency_key)
        except NoIdentityError:
            raise NoIdentityError(f"agent {pinned} is not in session {session_id}: this token posts as that agent, "
                                  "which must join the session first (start_session)") from None
