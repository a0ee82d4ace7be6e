"""Commands of the signal protocol: start, beat, list-agents, signals, acks, notes and the whiteboard."""

from __future__ import annotations

import sys

import click

from .. import actions
from ..heartbeat import DECLARED_STATUSES
from ..signals import TYPES
from .common import (agent_options, ago, emit, identity_options, one_line, pass_workspace, signal_line, table,
                     with_pending)


def _content(value: str, ws) -> str:
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


@click.command("start")
@click.option("--harness", default=None, help="The harness running this agent (else $SYNAPOLIS_HARNESS, 'cli').")
@click.option("--substrate", default=None, help="The model behind it, e.g. 'Claude Sonnet 4.6' (names generated ids).")
@click.option("--conversation-id", default=None, help="The harness's conversation id (seeds a generated agent id).")
@click.option("--new-session", is_flag=True, help="Always create a new session.")
@click.option("--export", "export", is_flag=True, help="Print `export SYNAPOLIS_...=...;` lines for eval.")
@identity_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def start_cmd(ws, harness, substrate, conversation_id, new_session, export, agent_id, session_id, run_token,
              no_piggyback, as_json):
    """Register this agent in a session (joining the only active one, or creating one) and write identity.json.

    Example: eval "$(synapolis start --substrate 'Claude Sonnet 4.6' --export)"
    """
    data = actions.start(ws, agent_id=agent_id, session_id=session_id, harness=harness, substrate=substrate,
                         conversation_id=conversation_id, run_token=run_token, new_session=new_session,
                         piggyback=not no_piggyback)
    if export:
        pairs = [("SYNAPOLIS_AGENT_ID", data["agent_id"]), ("SYNAPOLIS_SESSION_ID", data["session_id"]),
                 ("SYNAPOLIS_RUN_TOKEN", data["run_token"]), ("SYNAPOLIS_STATE_DIR", str(ws.root))]
        import shlex  # here, not at the top: beat and signal load this module too

        click.echo("\n".join(f"export {k}={shlex.quote(v)};" for k, v in pairs))
        # stdout is for eval; delivered signals go where a person still sees them
        for line in with_pending([], data):
            click.echo(line, err=True)
        return
    emit(as_json, data, lambda d: with_pending([
        f"agent {d['agent_id']} {d['registration']} session {d['session_id']}"
        + (" (new)" if d["created_session"] else ""),
        f"run token {d['run_token']}  (identity.json written; keep the token to reclaim this id)"], d))


@click.command("beat")
@click.option("--status", type=click.Choice(DECLARED_STATUSES), default=None, help="Declared status (default active).")
@click.option("--task", default=None, help="What the agent is working on.")
@click.option("--ttl", type=float, default=None, help="Seconds until this heartbeat counts as stale.")
@click.option("--note", default=None, help="A note for this beat only.")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def beat_cmd(ws, status, task, ttl, note, who, piggyback, as_json):
    """Write this agent's heartbeat atomically and refresh its registry row in the session.

    Example: synapolis beat --agent-id alice --status active --task "fix #12"
    """
    data = actions.beat(ws, who, status=status, task=task, ttl_s=ttl, note=note, piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(
        f"beat {d['heartbeat']['agent_id']} seq={d['heartbeat']['seq']} status={d['heartbeat']['status']}"
        + (f" session={d['session_id']}" if d["registered"] else " (in no session)"), d))


@click.command("list-agents")
@agent_options
@pass_workspace(create=False)
def list_agents_cmd(ws, who, piggyback, as_json):
    """The session's agents: registry status and the effective status of their heartbeats.

    Example: synapolis list-agents --session-id 20260602_100924_841444cd --json
    """
    data = actions.list_agents(ws, who, session_id=who.session_id, piggyback=piggyback)

    def text(d):
        if not d["agents"]:
            return with_pending("no agents", d)
        rows = [[a["id"], a["session_id"], a["harness"], a["substrate"] or "-", a["status"], a["effective_status"],
                 ago(a["last_heartbeat"]), ago(a["joined_at"])] for a in d["agents"]]
        return with_pending(table(rows, ["AGENT", "SESSION", "HARNESS", "SUBSTRATE", "REGISTRY", "EFFECTIVE",
                                         "LAST BEAT", "JOINED"]), d)

    emit(as_json, data, text)


@click.command("signal")
@click.argument("to")
@click.argument("content")
@click.option("--type", "type_", type=click.Choice(TYPES), default="inform", show_default=True, help="Signal type.")
@click.option("--sender-id", default=None, help="Send as a sub-agent of the caller (caller.sub).")
@click.option("--reply-to", default=None, help="The signal this answers (full id or unique 8+ prefix).")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def signal_cmd(ws, to, content, type_, sender_id, reply_to, who, piggyback, as_json):
    """Send a signal to an agent, a sub-agent (a.b) or everyone (*); CONTENT '-' reads stdin.

    Example: synapolis signal bob "tests are green, merge when ready" --type inform
    """
    data = actions.signal(ws, who, to, _content(content, ws), type=type_, sender_id=sender_id, reply_to=reply_to,
                          piggyback=piggyback)

    def text(d):
        s, aud = d["signal"], d["audience"]
        waiting = ", ".join(f"{a} ({d['audience']['waiting_status'].get(a, 'waiting')})" for a in aud["waiting"])
        lines = [f"sent {s['id'][:12]} (#{s['sequence']}, lamport {s['lamport']}) {s['sender']} -> {s['recipient']}",
                 f"live: {', '.join(aud['live']) or 'nobody'}" + (f"; waiting for: {waiting}" if waiting else "")]
        if not aud["live"]:
            lines.append("note: no live recipient; the signal waits until one starts, beats or polls")
        return with_pending(lines, d)

    emit(as_json, data, text)


def _print_signals(data: dict, as_json: bool) -> None:
    emit(as_json, data, lambda d: [signal_line(s) for s in d["signals"]] or ["no signals"])


@click.command("read-signals")
@click.option("--unread-only", "mode", flag_value="unread", default=True, help="Only unread signals (default).")
@click.option("--all", "mode", flag_value="all", help="Every signal you can see, read and history included.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N (unread: oldest N; --all: newest N).")
@click.option("--follow", is_flag=True, help="Keep printing new signals until interrupted (JSON lines with --json).")
@agent_options
@pass_workspace(create=False)
def read_signals_cmd(ws, mode, limit, follow, who, piggyback, as_json):
    """Pure query: your signals, oldest first; marks nothing delivered or read.

    Example: synapolis read-signals --all --limit 20 --json
    """
    unread_only = mode != "all"
    if not follow:
        _print_signals(actions.read_signals(ws, who, unread_only=unread_only, limit=limit), as_json)
        return
    try:
        for s in actions.follow_signals(ws, who, unread_only=unread_only, limit=limit):
            emit(as_json, s, signal_line)  # one JSON object per line with --json
            sys.stdout.flush()
    except KeyboardInterrupt:
        return


@click.command("ack-signals")
@click.argument("ids", required=False, default=None)
@click.option("--all", "all_", is_flag=True, help="Ack every unread signal you can see.")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def ack_signals_cmd(ws, ids, all_, who, piggyback, as_json):
    """Mark signals read: comma-separated full ids or unique prefixes of 8+ characters.

    Example: synapolis ack-signals 1a2b3c4d,9f8e7d6c5b
    """
    data = actions.ack_signals(ws, who, ids, all=all_, piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(f"acked {len(d['acked'])} signal(s)"
                                               + (": " + ", ".join(i[:12] for i in d["acked"]) if d["acked"] else ""),
                                               d))


@click.command("signals-pending")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def signals_pending_cmd(ws, who, piggyback, as_json):
    """Deliver your undelivered signals now (method poll); they stay unread until acked.

    Example: synapolis signals-pending --json
    """
    data = actions.signals_pending(ws, who)
    emit(as_json, data, lambda d: with_pending([] if d["pending_signals"] else ["no pending signals"], d))


@click.command("note")
@click.argument("text")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def note_cmd(ws, text, who, piggyback, as_json):
    """Append a note to the session's notes bus; TEXT '-' reads stdin.

    Example: synapolis note "starting on the parser; src/parse.py is mine"
    """
    data = actions.note(ws, who, _content(text, ws), piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(f"note #{d['note']['seq']} added", d))


@click.command("read-notes")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="The newest N notes.")
@agent_options
@pass_workspace(create=False)
def read_notes_cmd(ws, limit, who, piggyback, as_json):
    """The session's notes bus: the newest notes, oldest first.

    Example: synapolis read-notes --limit 20
    """
    data = actions.read_notes(ws, who, session_id=who.session_id, limit=limit, piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(
        [f"#{n['seq']:<4} {ago(n['at']):>8}  {n['agent_id']}: {n['text']}" for n in d["notes"]] or ["no notes"], d))


@click.command("whiteboard-write")
@click.argument("key")
@click.argument("value")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def whiteboard_write_cmd(ws, key, value, who, piggyback, as_json):
    """Set a key on the session's shared whiteboard (last writer wins); VALUE '-' reads stdin.

    Example: synapolis whiteboard-write release-branch "release/2.4"
    """
    data = actions.whiteboard_write(ws, who, key, _content(value, ws), piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(f"{d['entry']['key']} = {one_line(d['entry']['value'])}", d))


@click.command("whiteboard-read")
@click.argument("key", required=False, default=None)
@agent_options
@pass_workspace(create=False)
def whiteboard_read_cmd(ws, key, who, piggyback, as_json):
    """Read one whiteboard entry, or all of them without KEY.

    Example: synapolis whiteboard-read release-branch --json
    """
    data = actions.whiteboard_read(ws, who, key, session_id=who.session_id, piggyback=piggyback)

    def text(d):
        entries = [d["entry"]] if "entry" in d else d["entries"]
        if not entries:
            return with_pending("the whiteboard is empty", d)
        rows = [[e["key"], one_line(e["value"], 60), e["updated_by"], ago(e["updated_at"])] for e in entries]
        return with_pending(table(rows, ["KEY", "VALUE", "BY", "UPDATED"]), d)

    emit(as_json, data, text)
