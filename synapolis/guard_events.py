"""The guard's refusals as events (contract §14, §15): kept in the store's bounded record for the dashboard, and told.

Three kinds: a tool call a harness's pre-tool hook denied and a commit the git pre-commit hook refused (both
`io.synapolis.guard.denied`, as contract §15 has it: "a tool call or commit refused"; `data.refused` and the
record's `kind` tell them apart) and a `claim --wait` refused because waiting would deadlock (`io.synapolis.claims.deadlock`). Each is one small record (when, what, which agent was
refused, the paths or items, who holds them, by what means, a readable line) in the store, the newest KEEP
per store: guard-events.jsonl in the state directory on SQLite, table guard_events on PostgreSQL, so a
denial on any machine sharing the database shows on the team server's page. Then the same event goes to
the notify targets (notify.emit, handed to the detached sender). Neither step may fail or slow down the
refusal itself: both are best-effort and never raise.
"""

from __future__ import annotations

from .notify import CLAIMS_DEADLOCK, GUARD_DENIED

KEEP = 200  # events kept per store: the page shows the newest; older ones are history nobody triages
LIST_MAX = 20  # paths and holders kept per event (a commit of 5,000 files says how many more)
LINE_MAX = 500

KINDS = {GUARD_DENIED: "denied", CLAIMS_DEADLOCK: "deadlock"}
COMMIT_KIND = "commit refused"  # a guard.denied whose refusal was git's, not a harness's


def _text(value: str) -> str:
    """`value` as UTF-8 takes it: a file name git gave in bytes that are not UTF-8 (decoded with surrogates,
    guard.staged_paths) shows them as U+FFFD, as the CLI prints it; kept as it was, the record's line and
    PostgreSQL refused it and the event was lost."""
    if value.isascii():
        return value
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return value.encode("utf-8", "replace").decode("utf-8")


def _unique(values) -> list[str]:
    seen: list[str] = []
    for value in values:
        if isinstance(value, str) and value:
            text = _text(value)
            if text not in seen:
                seen.append(text)
    return seen


def event_record(event_type: str, *, at: str, agent_id, paths, holders, via: str, line: str,
                 kind: str | None = None) -> dict:
    """One event as the store keeps it and the dashboard shows it (bounded whatever it is given)."""
    import os

    paths, holders = _unique(paths), _unique(holders)
    # the id from os.urandom, not uuid: importing uuid alone costs a hook about a millisecond
    return {"id": os.urandom(8).hex(), "at": at, "type": event_type, "kind": kind or KINDS.get(event_type, event_type),
            "agent_id": agent_id, "paths": paths[:LIST_MAX], "more_paths": max(0, len(paths) - LIST_MAX),
            "holders": holders[:LIST_MAX], "via": via, "line": _text(line[:LINE_MAX])}


def tell(ws, event_type: str, subject: str, data: dict, *, agent_id, paths, holders, via: str, line: str,
         kind: str | None = None, now=None) -> dict | None:
    """Record the event in the store, then hand it to the notify targets; returns the record (None when the
    store could not take it). Never raises: a refusal is never turned into a failure by telling about it."""
    from . import notify

    kept = None
    try:
        from .store import clock
        from .timeutil import format_ts

        kept = event_record(event_type, at=format_ts(clock(ws, now), micro=True), agent_id=agent_id, paths=paths,
                            holders=holders, via=via, line=line, kind=kind)
        ws.store.record_event(kept, KEEP)
    except Exception:  # noqa: BLE001 - a store away or a read-only state directory: the refusal stands untold here
        kept = None
    notify.emit(ws, event_type, subject, data, line=line, now=now)
    return kept


def recent(ws, limit: int) -> list[dict]:
    """The newest `limit` events of the store (at most KEEP), newest first, each in the record's shape: a line
    edited by hand or written by something else (a list, a number for a type, a text for its paths) is left out,
    so the page that draws them never meets one it cannot draw."""
    return [e for e in ws.store.recent_events(min(limit, KEEP)) if _well_formed(e)]


def _well_formed(event) -> bool:
    if not isinstance(event, dict):
        return False
    if not all(isinstance(event.get(key), str) for key in ("id", "at", "type", "kind")):
        return False
    if not all(isinstance(event.get(key), list) and all(isinstance(v, str) for v in event[key])
               for key in ("paths", "holders")):
        return False
    return all(event.get(key) is None or isinstance(event[key], str) for key in ("agent_id", "via", "line")) \
        and isinstance(event.get("more_paths", 0), int)


# -- the three kinds ------------------------------------------------------------------------------------

def tool_denied(ws, harness: str, agent_id, blocked: list[dict], tool, now=None):
    """A harness's pre-tool hook refused `tool` for `agent_id` because of `blocked` (guard's answer)."""
    first = blocked[0]
    path = first.get("relative_path") or first["path"]  # the project's own name for it, as the claim has it
    others = f" and {len(blocked) - 1} more" if len(blocked) > 1 else ""
    return tell(ws, GUARD_DENIED, path,
                {"refused": "tool call", "harness": harness, "tool": tool, "agent_id": agent_id, "blocked": blocked},
                agent_id=agent_id, paths=[b.get("relative_path") or b["path"] for b in blocked],
                holders=[b["claimed_by"] for b in blocked], via=f"{harness} {tool or 'tool call'}",
                line=f"{harness} refused {tool or 'an edit'} of {path}{others} for {agent_id}: "
                     f"{first['claimed_by']} holds {first['item']}; synapolis signal {first['claimed_by']} ...",
                now=now)


def commit_refused(ws, verdict: dict, now=None):
    """Git's pre-commit hook refused a commit: `verdict` is the guard's answer (`agent_id`, `blocked`)."""
    blocked = verdict.get("blocked") or []
    if not blocked:
        return None
    first = blocked[0]
    path = first.get("relative_path") or first["path"]
    who = verdict.get("agent_id")
    others = f" and {len(blocked) - 1} more" if len(blocked) > 1 else ""
    return tell(ws, GUARD_DENIED, path, {"refused": "commit", "agent_id": who, "blocked": blocked}, kind=COMMIT_KIND,
                agent_id=who, paths=[b.get("relative_path") or b["path"] for b in blocked],
                holders=[b["claimed_by"] for b in blocked], via="git commit",
                line=f"git commit by {who or 'a person (no agent identity)'} refused: {path}{others} is held by "
                     f"{first['claimed_by']} ({first['item']}); synapolis signal {first['claimed_by']} ...",
                now=now)


def deadlock(ws, agent_id: str, item: str, cycle: list[dict], now=None):
    """`claim --wait` of `item` by `agent_id` was refused: waiting would close `cycle`."""
    who = ", ".join(step["agent_id"] for step in cycle)
    return tell(ws, CLAIMS_DEADLOCK, item, {"agent_id": agent_id, "item": item, "cycle": cycle},
                agent_id=agent_id, paths=[item] + [step.get("holds") for step in cycle],
                holders=[step["agent_id"] for step in cycle if step["agent_id"] != agent_id],
                via="claim --wait",
                line=f"claim of {item} by {agent_id} refused: waiting would deadlock ({who}); "
                     f"one of them must release: synapolis claims --json",
                now=now)
