"""Commands of the signal protocol: start, beat, list-agents, signals, acks, notes and the whiteboard."""

from __future__ import annotations

import sys

import click

from .. import actions
from . import hot
from .hot import content_arg
from ..heartbeat import DECLARED_STATUSES
from ..signals import TYPES
from .common import (agent_options, ago, emit, identity_options, more_line, one_line, pass_workspace, say,
                     signal_line, table, with_pending)


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
            say(line, err=True)
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
    emit(as_json, *hot.beat(ws, who, piggyback, status=status, task=task, ttl=ttl, note=note))


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
        rows = [[a["id"], a["session_id"], a["harness"], a["substrate"] or "-", a.get("host") or "-", a["status"],
                 a["effective_status"], ago(a["last_heartbeat"]), ago(a["joined_at"])] for a in d["agents"]]
        return with_pending(table(rows, ["AGENT", "SESSION", "HARNESS", "SUBSTRATE", "HOST", "REGISTRY",
                                         "EFFECTIVE", "LAST BEAT", "JOINED"]), d)

    emit(as_json, data, text)


@click.command("signal")
@click.argument("to")
@click.argument("content")
@click.option("--type", "type_", type=click.Choice(TYPES), default="inform", show_default=True, help="Signal type.")
@click.option("--sender-id", default=None, help="Send as a sub-agent of the caller (caller.sub).")
@click.option("--reply-to", default=None, help="The signal this answers (full id or unique 8+ prefix).")
@click.option("--idempotency-key", default=None,
              help="A key of your choosing (a UUID): a retry with the same key, after exit 8 say, answers as the "
                   "first call did and stores nothing twice.")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def signal_cmd(ws, to, content, type_, sender_id, reply_to, idempotency_key, who, piggyback, as_json):
    """Send a signal to an agent, a sub-agent (a.b) or everyone (*); CONTENT '-' reads stdin.

    Example: synapolis signal bob "tests are green, merge when ready" --type inform --idempotency-key 7f3c9a
    """
    emit(as_json, *hot.signal(ws, who, piggyback, to, content, type_=type_, sender_id=sender_id, reply_to=reply_to,
                              idempotency_key=idempotency_key))


@click.command("read-signals")
@click.option("--unread-only", "mode", flag_value="unread", default=True, help="Only unread signals (default).")
@click.option("--all", "mode", flag_value="all", help="Every signal you can see, read and history included.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most N (default 100; unread: oldest N; --all: newest N).")
@click.option("--after", type=click.IntRange(min=0), default=None,
              help="Only signals after this sequence, oldest first (the next page: the answer's next_after).")
@click.option("--follow", is_flag=True, help="Keep printing new signals until interrupted (JSON lines with --json).")
@agent_options
@pass_workspace(create=False)
def read_signals_cmd(ws, mode, limit, after, follow, who, piggyback, as_json):
    """Pure query: a page of your signals, oldest first; marks nothing delivered or read.

    Example: synapolis read-signals --all --limit 20 --json
    """
    if not follow:
        emit(as_json, *hot.read_signals(ws, who, piggyback, mode=mode, limit=limit, after=after))
        return
    try:
        for s in actions.follow_signals(ws, who, unread_only=mode != "all", limit=limit):
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
    emit(as_json, *hot.ack_signals(ws, who, piggyback, ids=ids, all_=all_))


@click.command("signals-pending")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N (default 100, oldest first).")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def signals_pending_cmd(ws, limit, who, piggyback, as_json):
    """Deliver a page of your undelivered signals now (method poll); they stay unread until acked.

    Example: synapolis signals-pending --json
    """
    emit(as_json, *hot.signals_pending(ws, who, piggyback, limit=limit))


@click.command("note")
@click.argument("text")
@click.option("--idempotency-key", default=None,
              help="A key of your choosing (a UUID): a retry with the same key, after exit 8 say, answers as the "
                   "first call did and stores nothing twice.")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def note_cmd(ws, text, idempotency_key, who, piggyback, as_json):
    """Append a note to the session's notes bus; TEXT '-' reads stdin.

    Example: synapolis note "starting on the parser; src/parse.py is mine" --idempotency-key 7f3c9a
    """
    emit(as_json, *hot.note(ws, who, piggyback, text, idempotency_key=idempotency_key))


@click.command("read-notes")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="The newest N notes.")
@click.option("--before", type=click.IntRange(min=1), default=None,
              help="Only notes before this seq (the next page back: the answer's next_before).")
@agent_options
@pass_workspace(create=False)
def read_notes_cmd(ws, limit, before, who, piggyback, as_json):
    """The session's notes bus: the newest notes, oldest first.

    Example: synapolis read-notes --limit 20
    """
    data = actions.read_notes(ws, who, session_id=who.session_id, limit=limit, before=before, piggyback=piggyback)

    def text(d):
        lines = [f"#{n['seq']:<4} {ago(n['at']):>8}  "
                 f"{n['person'] + ' (person)' if n.get('person') else n['agent_id']}: {n['text']}"
                 for n in d["notes"]] or ["no notes"]
        if d.get("remaining"):
            lines.insert(0, more_line(d["remaining"], "older notes",
                                      f"`synapolis read-notes --before {d['next_before']}`"))
        return with_pending(lines, d)

    emit(as_json, data, text)


@click.command("whiteboard-write")
@click.argument("key")
@click.argument("value")
@agent_options
@pass_workspace(create=False)  # the verb creates it after checking the names (§2)
def whiteboard_write_cmd(ws, key, value, who, piggyback, as_json):
    """Set a key on the session's shared whiteboard (last writer wins); VALUE '-' reads stdin.

    Example: synapolis whiteboard-write release-branch "release/2.4"
    """
    data = actions.whiteboard_write(ws, who, key, content_arg(value, ws), piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(f"{d['entry']['key']} = {one_line(d['entry']['value'])}", d))


@click.command("whiteboard-read")
@click.argument("key", required=False, default=None)
@click.option("--after", default=None, help="Without KEY: only keys after this one (the answer's next_after).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Without KEY: at most N entries (100).")
@agent_options
@pass_workspace(create=False)
def whiteboard_read_cmd(ws, key, after, limit, who, piggyback, as_json):
    """Read one whiteboard entry, or a page of them without KEY.

    Example: synapolis whiteboard-read release-branch --json
    """
    data = actions.whiteboard_read(ws, who, key, session_id=who.session_id, after=after, limit=limit,
                                   piggyback=piggyback)

    def text(d):
        entries = [d["entry"]] if "entry" in d else d["entries"]
        if not entries:
            return with_pending("the whiteboard is empty", d)
        rows = [[e["key"], one_line(e["value"], 60), e["updated_by"], ago(e["updated_at"])] for e in entries]
        lines = [table(rows, ["KEY", "VALUE", "BY", "UPDATED"])]
        if d.get("remaining"):
            import shlex

            lines.append(more_line(d["remaining"], "entries",
                                   f"`synapolis whiteboard-read --after {shlex.quote(d['next_after'])}`"))
        return with_pending(lines, d)

    emit(as_json, data, text)
