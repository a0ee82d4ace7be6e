"""The command line: `main`, the `synapolis` group with lazy command loading, and the one place errors become exits.

Hooks call the CLI on every tool call of every agent, so start-up cost matters twice over here:
commands live in the modules of this package and are imported only when invoked, and click itself
(most of the cost of a bare `python -c "import click"`) is imported only when a verb needs it. A
hook does not: `main` hands `[--state-dir DIR] hook HARNESS` straight to `synapolis.harness.hooks`, and the
plain forms of the hot agent verbs (beat, signal, read-signals, claim, release, ...) to `synapolis.cli.fast`.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from ..errors import SynapolisError, UsageError, internal_error

# verb -> "module:attribute" inside synapolis.cli; imported lazily
COMMANDS: dict[str, str] = {
    "init": "core_cmds:init_cmd",
    "beat": "signal_cmds:beat_cmd",
    "start": "signal_cmds:start_cmd",
    "list-agents": "signal_cmds:list_agents_cmd",
    "signal": "signal_cmds:signal_cmd",
    "read-signals": "signal_cmds:read_signals_cmd",
    "ack-signals": "signal_cmds:ack_signals_cmd",
    "signals-pending": "signal_cmds:signals_pending_cmd",
    "note": "signal_cmds:note_cmd",
    "read-notes": "signal_cmds:read_notes_cmd",
    "whiteboard-write": "signal_cmds:whiteboard_write_cmd",
    "whiteboard-read": "signal_cmds:whiteboard_read_cmd",
    "monitor": "monitor_cmds:monitor_cmd",
    "escalate": "monitor_cmds:escalate_cmd",
    "escalations": "monitor_cmds:escalations_cmd",
    "watchdog": "monitor_cmds:watchdog_cmd",
    "claim": "claim_cmds:claim_cmd",
    "release": "claim_cmds:release_cmd",
    "claims": "claim_cmds:claims_cmd",
    "claim-check": "claim_cmds:claim_check_cmd",
    "guard": "claim_cmds:guard_cmd",
    "hook": "person_cmds:hook_cmd",
    "hooks": "person_cmds:hooks_group",
    "doctor": "person_cmds:doctor_cmd",
    "status": "person_cmds:status_cmd",
    "demo": "person_cmds:demo_cmd",
    "mcp": "mcp_cmds:mcp_cmd",
    "serve": "serve_cmds:serve_cmd",
    "tokens": "token_cmds:tokens_group",
    "tired": "sleep_cmds:tired_cmd",
    "memories": "sleep_cmds:memories_cmd",
    "notify": "notify_cmds:notify_group",
}


def _wants_json(args) -> bool:
    return "--json" in args


def run_guarded(call, ctx=None, args=None):
    """Run `call`, turning every failure into a one-line error and the contract's exit code."""
    import click

    from .text import report_error

    as_json = _wants_json(sys.argv[1:] if args is None else args)
    try:
        return call()
    except (click.exceptions.Exit, click.exceptions.Abort):
        raise
    except click.ClickException as exc:
        report_error(UsageError(exc.format_message()), as_json)
        sys.exit(2)
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - the contract: no traceback reaches a user
        exit_for_error(as_json)


def exit_for_error(as_json: bool) -> None:
    """Inside an `except`: the exception being handled as the contract's one-line error and exit code."""
    from .text import report_error

    exc = sys.exc_info()[1]
    if isinstance(exc, SynapolisError):
        report_error(exc, as_json)
        sys.exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        sys.exit(130)
    if isinstance(exc, BrokenPipeError):
        sys.exit(0)
    if isinstance(exc, Exception) and (isinstance(exc, OSError) or not os.environ.get("SYNAPOLIS_DEBUG")):
        report_error(internal_error(exc), as_json)
        sys.exit(1)
    raise  # noqa: PLE0704 - SYNAPOLIS_DEBUG: the traceback, as asked


def _close_verbs(name: str, verbs) -> list[str]:
    """The verbs a mistyped `name` most likely meant (`statsu` -> `status`), best first; at most three."""
    import difflib

    if not name or name.startswith("-"):
        return []
    return difflib.get_close_matches(name, list(verbs), n=3, cutoff=0.6)


def _build():
    """Define the click group (`cli`, class `LazyGroup`) on first use; importing this package must not
    import click, or every hook would pay for it."""
    import importlib

    import click

    if "cli" in globals():
        return globals()["cli"]

    from .common import CommandGroup

    class LazyGroup(CommandGroup):
        """A group that imports a command's module only when that command runs (or help lists it)."""

        def list_commands(self, ctx):
            return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

        def get_command(self, ctx, name):
            if name in COMMANDS:
                module_name, attr = COMMANDS[name].split(":")
                module = importlib.import_module(f"{__name__}.{module_name}")
                return getattr(module, attr)
            return super().get_command(ctx, name)

        def resolve_command(self, ctx, args):
            try:
                return super().resolve_command(ctx, args)
            except click.UsageError:
                name = args[0] if args else ""
                close = _close_verbs(name, self.list_commands(ctx))
                if not close:
                    raise
                raise click.UsageError(f"no such command {name!r}; did you mean "
                                       f"{' or '.join(repr(c) for c in close)}? (`synapolis --help` lists them)",
                                       ctx) from None

        def invoke(self, ctx):
            return run_guarded(lambda: super(LazyGroup, self).invoke(ctx), ctx)

    @click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--state-dir", type=click.Path(file_okay=False), default=None,
                  help="The state directory (else $SYNAPOLIS_STATE_DIR, the nearest state/, ./state).")
    @click.version_option(package_name="synapolis", prog_name="synapolis")
    @click.pass_context
    def cli(ctx, state_dir):
        """synapolis: heartbeats, signals, claims and consensus sleep for AI coding agents.

        Example: synapolis --state-dir /tmp/state beat --agent-id alice --task "review PR 12"
        """
        ctx.ensure_object(dict)
        ctx.obj["state_dir"] = state_dir

    globals().update(cli=cli, LazyGroup=LazyGroup)
    return cli


def __getattr__(name):
    # `from synapolis.cli import cli` keeps working: the group is built when someone asks for it
    if name in ("cli", "LazyGroup"):
        _build()
        return globals()[name]
    if name in ("put", "report_error"):  # they live in cli/text.py; a hook never loads it
        from . import text

        return getattr(text, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the hook, without click ----------------------------------------------------------------------

def _state_dir_first(args) -> tuple[str | None, list]:
    """(the value of a leading `--state-dir DIR` / `--state-dir=DIR` or None, the arguments after it)."""
    if args[:1] == ["--state-dir"] and len(args) > 1:
        return args[1], args[2:]
    if args[:1] and args[0].startswith("--state-dir="):
        return args[0].partition("=")[2], args[1:]
    return None, args


def _hook_call(args) -> tuple[str | None, str] | None:
    """(state dir, harness) when `args` is exactly `[--state-dir DIR] hook HARNESS`; else None (click's turn:
    help, a missing or extra argument, anything unusual gets click's parsing and messages)."""
    state_dir, args = _state_dir_first(args)
    if len(args) == 2 and args[0] == "hook" and not args[1].startswith("-"):
        return state_dir, args[1]
    return None


def _mcp_call(args) -> tuple[str | None, bool] | None:
    """(state dir, --polling) when `args` is exactly `[--state-dir DIR] mcp [--polling]`; else None (click's)."""
    state_dir, args = _state_dir_first(args)
    if args[:1] != ["mcp"] or args[1:] not in ([], ["--polling"]):
        return None
    if state_dir is not None and (not state_dir or (os.path.exists(state_dir) and not os.path.isdir(state_dir))):
        return None  # click's Path check and its message
    return state_dir, bool(args[1:])


def run_mcp(state_dir, polling: bool) -> None:
    """`synapolis mcp` without click: it answers the handshake before the MCP SDK has loaded (mcp/front.py)."""
    from ..workspace import Workspace

    try:
        from ..remote import activate

        # through the team server (§16) there is no local store to serve: refused, naming the server's /mcp
        root = activate(Workspace.open(state_dir), "mcp").ensure().root
        from ..mcp.front import serve

        serve(root, polling)
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - the contract: no traceback reaches a user
        exit_for_error(False)
    sys.exit(0)


def run_hook(harness: str, state_dir=None) -> None:
    """`synapolis hook HARNESS`: one event from stdin, the harness's answer on stdout, problems on stderr."""
    from ..harness.hooks import MAX_INPUT_BYTES, run_bounded

    def read_input():
        if sys.stdin is None or sys.stdin.isatty():
            return b""
        return sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)

    def write(stream):
        # bytes, in UTF-8 whatever the locale says: the harness parses JSON, and a signal's text
        # must not make the hook fail on an ASCII-only terminal encoding
        def _write(text):
            stream.buffer.write(text.encode("utf-8", "replace"))
            stream.flush()
        return _write

    run_bounded(harness, read_input, write(sys.stdout), write(sys.stderr), state_dir=state_dir)


def _hook_main(state_dir, harness) -> None:
    """A hook never breaks the harness (contract §11): whatever happens, exit 0."""
    try:
        run_hook(harness, state_dir)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - run_bounded answers for everything it can; this is the rest
        try:
            sys.stderr.write(f"synapolis hook {harness}: {internal_error(exc).message}\n")
        except (OSError, ValueError, AttributeError):
            pass
    sys.exit(0)


# -- entry points ---------------------------------------------------------------------------------

def one_call() -> None:
    """This process answers one call and ends (a hook, a hot verb): no cyclic garbage collection while it runs,
    nor over the whole heap at exit (the interpreter's final collection skips frozen objects).

    About a tenth of such a call's instructions: the collections walk the modules just imported, which live
    to the end anyway. Reference counting still frees everything else, and the exit still runs every
    `atexit` handler, flushes and closes as before (gc.freeze is one such handler). Long-lived commands
    (mcp, serve, --watch, --follow) go through click and keep the collector.
    """
    gc.disable()
    atexit.register(gc.freeze)


def main(argv=None):
    """Console entry point for `synapolis`."""
    args = sys.argv[1:] if argv is None else list(argv)
    gc.disable()  # while we find out whether this is one call (one_call): parse imports the verb's modules
    hook = _hook_call(args)
    if hook is not None:
        one_call()
        _hook_main(*hook)
    mcp = _mcp_call(args)
    if mcp is not None:
        gc.enable()  # a long-lived server
        run_mcp(*mcp)
    from .fast import parse, run

    call = parse(args)
    if call is not None:
        one_call()
        run(call)  # exits
    gc.enable()  # click's commands include the long-lived ones
    _click_main(args)


def _click_main(args) -> None:
    import click

    from .text import report_error

    group = _build()
    try:
        # with standalone_mode=False click returns the code of a raised Exit instead of exiting
        rc = group.main(args=args, prog_name="synapolis", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        report_error(UsageError(exc.format_message()), _wants_json(args))
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


def validate_heartbeat_main(argv=None):
    """Console entry point for `validate-heartbeat`."""
    import click

    from .core_cmds import validate_heartbeat_cmd

    args = sys.argv[1:] if argv is None else argv
    try:
        # the guard of every synapolis verb: an OSError (a heartbeats folder that cannot be listed) or anything
        # unexpected is the one-line InternalError, never a traceback
        rc = run_guarded(lambda: validate_heartbeat_cmd.main(args=args, prog_name="validate-heartbeat",
                                                             standalone_mode=False), args=args)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(rc if isinstance(rc, int) else 0)
