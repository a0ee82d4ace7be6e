"""Shared options and output helpers for the command modules."""

from __future__ import annotations

import functools
import json

import click

from ..workspace import Workspace
from .text import ago, more_line, one_line, render, signal_line, table, terminal_safe, with_pending  # noqa: F401


class CommandGroup(click.Group):
    """A group of commands that, run bare, says in one line where its commands are listed (exit 2): click's
    default prints the whole help, which the CLI's one-line error would fold into a single unreadable line."""

    def parse_args(self, ctx, args):
        if not args:
            raise click.UsageError(f"missing command: `{ctx.command_path} --help` lists them", ctx)
        return super().parse_args(ctx, args)


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


# the verbs that only read (contract §3, and the screens for people): on a state directory that is not there they
# answer as for an empty one, and say so; a verb that writes creates it, and doctor and init say it themselves
_READ_ONLY = {"status", "list-agents", "read-notes", "whiteboard-read", "claims", "escalations", "memories", "guard"}


def workspace(ctx: click.Context, create: bool = False) -> Workspace:
    from ..remote import activate

    root = ctx.find_root().obj or {}
    # through the team server when one is configured (§16): the verbs become its, and no store is made here
    ws = activate(Workspace.open(root.get("state_dir")), " ".join(ctx.command_path.split()[1:]) or ctx.info_name)
    if create:
        return ws.ensure()
    if ctx.info_name in _READ_ONLY and not ws.paths.root.exists():
        # a read-only verb on a directory that is not there (a mistyped --state-dir, a wrong working directory)
        # still answers (an empty swarm, exit 0), but says why it is empty: on stderr, so --json stays one object
        from .text import terminal_safe

        click.echo(terminal_safe(f"synapolis: note: state directory {ws.paths.root} does not exist (nothing "
                                 f"recorded there yet; check --state-dir or $SYNAPOLIS_STATE_DIR)"), err=True)
    return ws


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
    """Print `data` as one JSON object, or `text(data)` (a string or lines) for people, terminal-safe."""
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False))
        return
    out = render(data, text)
    if out:
        click.echo(out)


def say(text: str, err: bool = False) -> None:
    """One piece of text for people, terminal-safe (text.terminal_safe), on stdout or stderr."""
    click.echo(terminal_safe(text), err=err)


def agent_options(func):
    """`identity_options` for a verb that acts as an agent, handing the command `who` (an identity.Who
    of --agent-id, --session-id, --run-token) and `piggyback` (not --no-piggyback) instead of those four."""
    @functools.wraps(func)
    def wrapper(*args, agent_id, session_id, run_token, no_piggyback, **kwargs):
        from ..identity import Who

        return func(*args, who=Who(agent_id, session_id, run_token), piggyback=not no_piggyback, **kwargs)
    return identity_options(wrapper)
