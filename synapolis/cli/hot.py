"""The agent verbs a harness runs on every tool call, without click: what each calls and how it reads.

Both ways in share these: the click commands (`signal_cmds`, `claim_cmds`) for help, errors and anything
unusual, and `fast`, which parses the documented forms of these verbs itself so a plain `synapolis beat`
never imports click. One function per verb: (the library's answer, how to show it to a person).
"""

from __future__ import annotations

import sys

from .. import actions
from .text import ago, more_line, signal_line, with_pending


def content_arg(value: str, ws) -> str:
    """VALUE itself, or for '-' stdin as UTF-8 text without its final newline.

    Read as bytes and bounded by max_content_bytes: an endless pipe must not fill memory, and bytes
    that are not UTF-8 are a usage error (exit 2), not a crash.
    """
    if value != "-":
        return value
    from ..errors import UsageError

    limit = int(ws.config.max_content_bytes)
    # limit + 2: room for a final newline, then one byte too many to tell that it is too long
    data = sys.stdin.buffer.read(limit + 2) if sys.stdin is not None else b""
    if len(data) > limit + 1 or (len(data) == limit + 1 and not data.endswith(b"\n")):
        raise UsageError(f"stdin holds more than max_content_bytes={limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return text[:-1] if text.endswith("\n") else text


def beat(ws, who, piggyback: bool, status=None, task=None, ttl=None, note=None):
    data = actions.beat(ws, who, status=status, task=task, ttl_s=ttl, note=note, piggyback=piggyback)
    return data, lambda d: with_pending(
        f"beat {d['heartbeat']['agent_id']} seq={d['heartbeat']['seq']} status={d['heartbeat']['status']}"
        + (f" session={d['session_id']}" if d["registered"] else " (in no session)"), d)


def signal(ws, who, piggyback: bool, to: str, content: str, type_="inform", sender_id=None, reply_to=None):
    data = actions.signal(ws, who, to, content_arg(content, ws), type=type_, sender_id=sender_id,
                          reply_to=reply_to, piggyback=piggyback)

    def text(d):
        s, aud = d["signal"], d["audience"]
        waiting = ", ".join(f"{a} ({d['audience']['waiting_status'].get(a, 'waiting')})" for a in aud["waiting"])
        lines = [f"sent {s['id'][:12]} (#{s['sequence']}, lamport {s['lamport']}) {s['sender']} -> {s['recipient']}",
                 f"live: {', '.join(aud['live']) or 'nobody'}" + (f"; waiting for: {waiting}" if waiting else "")]
        if not aud["live"]:
            lines.append("note: no live recipient; the signal waits until one starts, beats or polls")
        return with_pending(lines, d)

    return data, text


def signals_text(d: dict) -> list[str]:
    lines = [signal_line(s) for s in d["signals"]] or ["no signals"]
    if d.get("remaining"):
        how = (f"`synapolis read-signals --after {d['next_after']}`" if d.get("next_after") is not None
               else "`--after 0` pages through them all, oldest first")
        lines.append(more_line(d["remaining"], "signals", how))
    return lines


def read_signals(ws, who, piggyback: bool, mode="unread", limit=None, after=None):
    return actions.read_signals(ws, who, unread_only=mode != "all", limit=limit, after=after), signals_text


def ack_signals(ws, who, piggyback: bool, ids=None, all_=False):
    data = actions.ack_signals(ws, who, ids, all=all_, piggyback=piggyback)
    def text(d):
        shown = ", ".join(i[:12] for i in d["acked"][:20])
        more = d["acked_count"] - min(len(d["acked"]), 20)
        return with_pending(f"acked {d['acked_count']} signal(s)" + (f": {shown}" if shown else "")
                            + (f" and {more} more" if more > 0 else ""), d)

    return data, text


def signals_pending(ws, who, piggyback: bool, limit=None):
    data = actions.signals_pending(ws, who, limit=limit)
    return data, lambda d: with_pending([] if d["pending_signals"] else ["no pending signals"], d)


def note(ws, who, piggyback: bool, text: str):
    data = actions.note(ws, who, content_arg(text, ws), piggyback=piggyback)
    return data, lambda d: with_pending(f"note #{d['note']['seq']} added", d)


# -- claims (contract §9): an agent claims, renews (claims again) and releases around its edits ---------

def claim_text(d: dict) -> str:
    record, event = d["claim"], d["event"]
    verb = {"claimed": "claimed", "renewed": "renewed", "taken_over": "took over"}.get(event, event)
    line = f"{verb} {record['item']}"
    if event == "taken_over":
        prev = record["taken_over_from"]
        line += f" from {prev['agent_id']} ({prev['reason']})"
    line = f"{line}  token {record['token']}  expires {ago(record['expires_at'])} ({record['expires_at']})"
    if record.get("overlaps"):
        line += f"\n  overlaps your own {', '.join(record['overlaps'])}"
    return line


def release_text(d: dict) -> str:
    record, event = d["claim"], d["event"]
    if event is None:
        return f"{record['item']} was already released {ago(record['released_at'])}"
    if event == "force_released":
        return (f"force-released {record['item']} from {record['claimed_by']} (token {record['token']}): "
                f"{record['release_reason']}")
    return f"released {record['item']} (token {record['token']})"


def claim(ws, who, piggyback: bool, item: str, ttl=None, wait=0.0):
    data = actions.claim(ws, who, item, ttl_s=ttl, wait_s=wait, piggyback=piggyback)
    return data, lambda d: with_pending(claim_text(d), d)


def release(ws, who, piggyback: bool, item: str, force=False, reason=None):
    data = actions.release(ws, who, item, force=force, reason=reason, piggyback=piggyback)
    return data, lambda d: with_pending(release_text(d), d)


def claim_check(ws, who, piggyback: bool, item: str, token: int):
    """Acts as nobody (actions.claim_check): `who` and `piggyback` are the fast path's, unused."""
    data = actions.claim_check(ws, None, item, token)
    record = data["claim"]
    return data, lambda d: (f"ok: token {token} is live for {item} (held by {record['claimed_by']}, "
                            f"expires {ago(record['expires_at'])})")
