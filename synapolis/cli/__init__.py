"""The command line: the `synapolis` group, shared options, output and the one place errors become exits.

Commands live in the modules of this package and are imported only when invoked, because hooks call
the CLI on every tool call and its start-up cost matters.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import click

from ..errors import InternalError, SynapolisError, UsageError

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
    "hook": "person_cmds:hook_cmd",
    "hooks": "person_cmds:hooks_group",
    "doctor": "person_cmds:doctor_cmd",
    "status": "person_cmds:status_cmd",
    "demo": "person_cmds:demo_cmd",
    "mcp": "mcp_cmds:mcp_cmd",
    "tired": "sleep_cmds:tired_cmd",
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command runs (or help lists it)."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx, name):
        if name in COMMANDS:
            module_name, attr = COMMANDS[name].split(":")
            module = importlib.import_module(f"{__name__}.{module_name}")
            return getattr(module, attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        return run_guarded(lambda: super(LazyGroup, self).invoke(ctx), ctx)


def _wants_json(args) -> bool:
    return "--json" in args


def report_error(error: SynapolisError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(error.to_json()))
    click.echo(f"synapolis: {error.type_name}: {error.message}", err=True)


def run_guarded(call, ctx=None):
    """Run `call`, turning every failure into a one-line error and the contract's exit code."""
    as_json = _wants_json(sys.argv[1:])
    try:
        return call()
    except SynapolisError as exc:
        report_error(exc, as_json)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit:
        raise
    except click.exceptions.Abort:
        raise
    except click.ClickException as exc:
        report_error(UsageError(exc.format_message()), as_json)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:
        report_error(InternalError(f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})".strip()), as_json)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the contract: no traceback reaches a user
        if os.environ.get("SYNAPOLIS_DEBUG"):
            raise
        report_error(InternalError(f"unexpected {type(exc).__name__}: {exc}"), as_json)
        sys.exit(1)


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


def main(argv=None):
    """Console entry point for `synapolis`."""
    args = sys.argv[1:] if argv is None else argv
    try:
        # with standalone_mode=False click returns the code of a raised Exit instead of exiting
        rc = cli.main(args=args, prog_name="synapolis", standalone_mode=False)
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
    from .core_cmds import validate_heartbeat_cmd

    args = sys.argv[1:] if argv is None else argv
    try:
        rc = validate_heartbeat_cmd.main(args=args, prog_name="validate-heartbeat", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        report_error(UsageError(exc.format_message()), _wants_json(args))
        sys.exit(2)
    except SynapolisError as exc:
        report_error(exc, _wants_json(args))
        sys.exit(exc.exit_code)
    sys.exit(rc if isinstance(rc, int) else 0)
