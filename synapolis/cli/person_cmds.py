"""Commands for harness integration and for people: hook, hooks install|uninstall, doctor, status, demo."""

from __future__ import annotations

import shutil
import sys

import click

from ..harness.hooks import HARNESS_NAMES
from .common import CommandGroup, emit, json_option, workspace


def _tty() -> bool:
    # stdout may be closed altogether (`synapolis status >&-`): then it is no terminal
    return sys.stdout is not None and sys.stdout.isatty()


def _state_dir(ctx: click.Context):
    return (ctx.find_root().obj or {}).get("state_dir")


@click.command("hook")
@click.argument("harness")
@click.pass_context
def hook_cmd(ctx, harness):
    """Handle one harness hook event (JSON on stdin); answer in HARNESS's shape, always exit 0.

    HARNESS is claude-code, gemini-cli, codex, copilot or opencode. Problems go to stderr; the harness is never
    blocked.

    Example: echo '{"session_id":"s1","hook_event_name":"SessionStart"}' | synapolis hook claude-code
    """
    # `main` answers `[--state-dir DIR] hook HARNESS` without click; this is the same call for the
    # other spellings click parses (and for callers of the group itself)
    from . import run_hook

    run_hook(harness, _state_dir(ctx))


@click.group("hooks", cls=CommandGroup)
def hooks_group():
    """Wire a harness up: add or remove synapolis's hook entries in its project settings file.

    Example: synapolis hooks install claude-code --project-dir .
    """


def _project_option(func):
    return click.option("--project-dir", type=click.Path(file_okay=False), default=".",
                        help="The project whose settings file to change (default: the working directory).")(func)


def _scope_option(func):
    return click.option("--scope", type=click.Choice(["project", "local", "user"]), default="project",
                        show_default=True,
                        help="project: the committed file, running `synapolis` from PATH (portable); local: this "
                             "machine's file for the project (Claude Code .claude/settings.local.json; Gemini CLI and "
                             "Codex: their user file), running this synapolis by its absolute path; user: the "
                             "harness's user file, the same way.")(func)


@hooks_group.command("install")
@click.argument("harness", type=click.Choice((*HARNESS_NAMES, "git")))
@_project_option
@_scope_option
@click.option("--trust", is_flag=True,
              help="Codex only: also record these hooks as trusted in Codex's user config ($CODEX_HOME/config.toml), "
                   "as its own review would. Only when you have read them.")
@json_option
@click.pass_context
def hooks_install_cmd(ctx, harness, project_dir, scope, trust, as_json):
    """Merge synapolis's hooks into HARNESS's settings file, keeping everything else (idempotent).

    --scope project (the default) writes the committed project file with the portable command `synapolis hook
    HARNESS`; --scope local or user write this machine's file with this synapolis's absolute path. Notes say
    what is left before the harness runs them (Codex: trust the project and the hooks; Gemini CLI: a trusted
    folder, hooks switched on).

    `git` installs a pre-commit hook instead (where git runs hooks: core.hooksPath, else the repository's
    common git dir, serving every worktree) that refuses a commit touching a file another live agent has
    claimed; a pre-commit hook already there is kept and runs first (--scope does not apply).

    Example: synapolis hooks install claude-code --scope local --project-dir ~/src/app
    """
    if harness == "git":
        from ..errors import UsageError
        from ..harness import githook
        from ..paths import find_state_dir

        if trust:
            raise UsageError("--trust is for codex: git hooks need no trust step")

        def git_text(d):
            what = "installed" if d["changed"] else "already installed, nothing changed"
            lines = [f"git: pre-commit guard {what} in {d['hook']}", f"state directory: {d['state_dir']}"]
            if d["chained"]:
                lines.append(f"the pre-commit hook that was there runs first: {d['chained']}")
            return lines

        emit(as_json, githook.install(project_dir, find_state_dir(_state_dir(ctx))), git_text)
        return
    from ..harness.install import install

    def text(d):
        done = [f"added hooks for {', '.join(d['added'])}"] if d["added"] else []
        done += [f"updated the command of {', '.join(d['updated'])}"] if d["updated"] else []
        what = "; ".join(done) or "already installed, nothing changed"
        lines = [f"{d['harness']}: {what} in {d['settings_file']}", f"command: {d['command']}"]
        if d["trusted"]:
            lines.append(f"trusted in Codex's config: {len(d['trusted'])} hook(s)")
        return lines + [f"note: {n}" for n in d["notes"]]

    emit(as_json, install(harness, project_dir, trust=trust, scope=scope), text)


@hooks_group.command("uninstall")
@click.argument("harness", type=click.Choice((*HARNESS_NAMES, "git")))
@_project_option
@_scope_option
@json_option
def hooks_uninstall_cmd(harness, project_dir, scope, as_json):
    """Take synapolis's own hook entries out of HARNESS's settings file of --scope; nothing else changes.

    `git`: removes synapolis's pre-commit hook and puts back the one it had chained.

    Example: synapolis hooks uninstall codex --project-dir . --scope user
    """
    if harness == "git":
        from ..harness import githook

        def git_text(d):
            if not d["changed"]:
                return f"git: no synapolis pre-commit hook in {d['hook'] or project_dir + ' (not a git work tree)'}"
            return f"git: removed the pre-commit guard from {d['hook']}" + (
                "; the hook it chained is back in place" if d["restored"] else "")

        emit(as_json, githook.uninstall(project_dir), git_text)
        return
    from ..harness.install import uninstall

    def text(d):
        what = f"removed hooks from {', '.join(d['removed'])}" if d["removed"] else "no synapolis hooks found"
        return f"{d['harness']}: {what} in {d['settings_file']}"

    emit(as_json, uninstall(harness, project_dir, scope=scope), text)


@click.command("doctor")
@_project_option
@json_option
@click.pass_context
def doctor_cmd(ctx, project_dir, as_json):
    """Check the set-up and say how to fix each problem; exit 1 when something is wrong.

    Checks: the state directory (writable, on a local filesystem), schemas and config, stray temporary
    files, the watchdog's cron line, and each harness's hook and MCP entries in the file it reads.

    Example: synapolis doctor --project-dir .
    """
    from ..harness.doctor import run_doctor
    from ..errors import CheckFailed
    from ..paths import find_state_dir

    report = run_doctor(find_state_dir(_state_dir(ctx)), project_dir)
    colour = not as_json and _tty()
    marks = {"ok": ("ok", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}

    def text(d):
        lines = [f"state directory {d['state_dir']}, project {d['project_dir']}"]
        for f in d["findings"]:
            mark, fg = marks[f["status"]]
            shown = click.style(f"{mark:4}", fg=fg, bold=True) if colour else f"{mark:4}"
            lines.append(f"{shown}  {f['check']:<20} {f['message']}")
            if f["fix"] and f["status"] != "ok":
                lines.append(f"{'':4}  {'':<20} fix: {f['fix']}")
        c = d["counts"]
        lines.append(f"{c['fail']} problem(s), {c['warn']} warning(s), {c['ok']} ok")
        return lines

    emit(as_json, report, text)
    if not report["ok"]:
        raise click.exceptions.Exit(CheckFailed.exit_code)


@click.command("status")
@click.option("--watch", is_flag=True, help="Redraw whenever the state directory changes (Ctrl-C to stop).")
@click.option("--width", type=int, default=None, help="Columns to fit (default: the terminal's, at most 80 if unknown).")
@json_option
@click.pass_context
def status_cmd(ctx, watch, width, as_json):
    """One screen for a person: agents, effective status, age, task, claims, unread counts, open incidents.

    Example: synapolis status --watch
    """
    from .. import overview

    ws = workspace(ctx)
    colour = not as_json and _tty()
    columns = width or (shutil.get_terminal_size((80, 24)).columns if _tty() else 80)

    def draw(clear: bool):
        data = overview.collect(ws)
        if as_json:
            emit(True, data)
            return
        screen = overview.render(data, width=columns, colour=colour)
        if clear and _tty():
            click.clear()
        click.echo(screen)

    if not watch:
        draw(False)
        return
    overview.watch(ws, lambda: draw(True))


@click.command("demo")
@click.option("--keep", is_flag=True, help="Leave the demo's state directory in place and print its path.")
@click.option("--agents", type=click.IntRange(3, 8), default=3, help="How many agent processes (3-8).")
@json_option
def demo_cmd(keep, agents, as_json):
    """Watch a small swarm coordinate: start, signal, claim, one dies, the watchdog frees its claims, sleep.

    Runs real agent processes in a temporary state directory, narrating each step; takes seconds.

    Example: synapolis demo --keep
    """
    from ..demo import run_demo

    def narrate(line: str) -> None:
        if not as_json:
            click.echo(line)

    result = run_demo(keep=keep, agents=agents, narrate=narrate)
    if as_json:
        emit(True, result)
