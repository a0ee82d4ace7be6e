"""Shared options and output helpers for the command modules."""

from __future__ import annotations

import functools
import json

import click

from ..workspace import Workspace


# Options that many commands take are built once and shared: constructing the five identity
# options for each of a dozen commands was ~2 ms of every CLI call. A click Option holds only its
# declaration; the values of one call live in that call's context.
_SHARED: dict = {}


def _shared(*decls: str, **attrs) -> click.Option:
    option = _SHARED.get(decls)
    if option is None:
        option = _SHARED[decls] = click.Option(list(decls), **attrs)
    return option


def _attach(func, *options: click.Option):
    # what click.option does, for several at once: click.command reads __click_params__ in reverse
    func.__dict__.setdefault("__click_params__", []).extend(reversed(options))
    return func


def _json_param() -> click.Option:
    return _shared("--json", "as_json", is_flag=True, help="Print one JSON object.")


def json_option(func):
    return _attach(func, _json_param())


def identity_options(func):
    """--agent-id, --session-id, --run-token, --no-piggyback and --json for verbs that act as an agent."""
    return _attach(
        func,
        _shared("--agent-id", default=None, help="Act as this agent (else $SYNAPOLIS_AGENT_ID, identity.json)."),
        _shared("--session-id", default=None, help="The session (else $SYNAPOLIS_SESSION_ID, identity.json)."),
        _shared("--run-token", default=None, help="This agent's run token (else $SYNAPOLIS_RUN_TOKEN)."),
        _shared("--no-piggyback", is_flag=True, help="Do not attach (and do not mark delivered) pending signals."),
        _json_param(),
    )


def workspace(ctx: click.Context, create: bool = False) -> Workspace:
    root = ctx.find_root().obj or {}
    ws = Workspace.open(root.get("state_dir"))
    return ws.ensure() if create else ws


def pass_workspace(create: bool):
    """Pass the opened Workspace as the first argument (created first when the verb writes)."""
    def decorate(func):
        @click.pass_context
        @functools.wraps(func)
        def wrapper(ctx, *args, **kwargs):
            return func(workspace(ctx, create=create), *args, **kwargs)
        return wrapper
    return decorate


def emit(as_json: bool, data: dict, text=None) -> None:
    """Print `data` as one JSON object, or `text(data)` (a string or lines) for people."""
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False))
        return
    if text is None:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    out = text(data)
    if isinstance(out, (list, tuple)):
        out = "\n".join(out)
    if out:
        click.echo(out)


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Aligned columns for people."""
    cells = [headers] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def agent_options(func):
    """`identity_options` for a verb that acts as an agent, handing the command `who` (an identity.Who
    of --agent-id, --session-id, --run-token) and `piggyback` (not --no-piggyback) instead of those four."""
    @functools.wraps(func)
    def wrapper(*args, agent_id, session_id, run_token, no_piggyback, **kwargs):
        from ..identity import Who

        return func(*args, who=Who(agent_id, session_id, run_token), piggyback=not no_piggyback, **kwargs)
    return identity_options(wrapper)


def ago(stamp, now=None) -> str:
    """How long ago (or until) an RFC 3339 `stamp` is, for people: "4m ago", "in 2h"; "-" when missing or unreadable."""
    from ..timeutil import humanize_age, parse_ts, utcnow

    if not stamp:
        return "-"
    try:
        return humanize_age(((now or utcnow()) - parse_ts(stamp)).total_seconds())
    except (TypeError, ValueError):
        return "-"


def one_line(text, width: int = 100) -> str:
    """`text` on one line (white space folded), cut to `width` characters with "..."."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def signal_line(s: dict) -> str:
    """One signal as one line: sequence, id, age, sender -> recipient, type, flags, content."""
    flags = []
    if s.get("read"):
        flags.append("read")
    elif "read" in s:
        flags.append("unread")
    if s.get("reply_to"):
        flags.append(f"re {s['reply_to'][:8]}")
    extra = f" ({', '.join(flags)})" if flags else ""
    return (f"#{s['sequence']:<5} {s['id'][:12]}  {ago(s['timestamp']):>8}  {s['sender']} -> {s['recipient']}  "
            f"[{s['type']}]{extra}  {one_line(s['content'])}")


def with_pending(lines, data: dict) -> list[str]:
    """The verb's own text, then the signals this response delivered (contract §7)."""
    lines = [lines] if isinstance(lines, str) else list(lines)
    pending = data.get("pending_signals") or []
    if pending:
        lines.append(f"-- {len(pending)} pending signal(s), delivered now; ack with `synapolis ack-signals ID`:")
        lines += [signal_line(s) for s in pending]
    return lines
