"""The `tired` verb: the consensus sleep protocol from the command line (contract §8)."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from .common import agent_options, emit, json_option, one_line, pass_workspace, with_pending


def read_memories_input(source: str | None) -> bytes | None:
    """The bytes of `--memories FILE|-`, bounded, before anything is written."""
    from ..sleep import MAX_INPUT_BYTES

    if source is None:
        return None
    try:
        if source == "-":
            # no stdin at all (closed by the caller) reads as empty: zero memories
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1) if sys.stdin is not None else b""
        else:
            with open(source, "rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except IsADirectoryError:
        raise UsageError(f"--memories {source}: is a directory") from None
    except OSError as exc:
        raise UsageError(f"--memories {source}: cannot read it ({exc.strerror or exc})") from None
    return data


def tired_text(d: dict) -> list[str]:
    others = d["active_others"]
    if d["outcome"] == "standby":
        lines = [f"standby: {others} other agent(s) still active in session {d['session_id']}; "
                 f"{d['staged']} new memory(ies) staged for the last one to merge. You may stop now."]
    else:
        why = ("the session had ended already" if d.get("ended_before")
               else f"{d['agent_id']} was the last active agent ({others} others active)")
        lines = [f"consolidated: {why}; merged {d['consolidated']} staged memory(ies) into {d['memories']} "
                 f"distinct one(s): {d['merged']} new ledger line(s), {d['already_held']} already in the ledger; "
                 f"session {d['session_id']} {d['session_status']}."]
        for line in d.get("ledger_lines", []):
            key = f"[{line['key']}] " if line.get("key") else ""
            lines.append(f"  + {key}{one_line(line['text'])}  (from {', '.join(line['sources'])})")
        if d.get("unreadable"):
            lines.append(f"  ! {d['unreadable']} staged row(s) unreadable, left staged")
    if d.get("flagged_stale"):
        lines.append(f"flagged stale: {', '.join(d['flagged_stale'])}")
    return with_pending(lines, d)


@click.command("tired")
@click.option("--memories", "memories_source", metavar="FILE|-", default=None,
              help="What you learned: a JSON array of strings or {text, key, tags} objects, or JSON lines; '-' reads stdin.")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def tired_cmd(ws, memories_source, who, piggyback, as_json):
    """Go idle, stage your memories, and, if you are the last active agent, merge them all.

    Standby (others still active) returns at once; the last agent merges every staged memory into
    state/memory/ledger.jsonl and ends the session.

    Example: echo '["tests run with uv run pytest"]' | synapolis tired --memories -
    """
    from ..sleep import tired

    # tired() checks every memory before it writes anything: bad input stages nothing (exit 2)
    result = tired(ws, who, memories=read_memories_input(memories_source), piggyback=piggyback)
    emit(as_json, result, tired_text)


def memories_text(d: dict) -> list[str]:
    if not d["memories"]:
        return [f"no memories yet ({d['ledger']})"]
    lines = []
    for m in d["memories"]:
        key = f"[{m['key']}] " if m.get("key") else ""
        lines.append(f"{m['merged_at'] or '-':<27} {key}{one_line(m['text'])}  (from {', '.join(m['sources'])})")
    if d["total"] > len(d["memories"]):
        lines.append(f"({len(d['memories'])} newest of {d['total']}; --limit shows more)")
    return lines


@click.command("memories")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the newest N memories.")
@json_option
@pass_workspace(create=False)
def memories_cmd(ws, limit, as_json):
    """The consolidated memory ledger, oldest first (from the store: the ledger file, or the shared database).

    Example: synapolis memories --limit 20
    """
    from ..sleep import memories

    emit(as_json, memories(ws, limit=limit), memories_text)
