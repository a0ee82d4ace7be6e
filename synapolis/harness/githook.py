"""`synapolis hooks install git`: a pre-commit hook that refuses a commit touching a file another live agent
has claimed (contract §14), for the writes no harness hook sees (a shell command, a person's editor).

The hook goes where git runs it: `git rev-parse --git-path hooks`, which is `core.hooksPath` when set and
otherwise the repository's common git dir, so one hook serves every linked worktree. A pre-commit hook that
is already there is kept: it is renamed `pre-commit.synapolis-chained` and ours runs it first (its refusal
stands). `hooks uninstall git` removes ours and puts that one back.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from ..errors import UsageError

HOOK = "pre-commit"
CHAINED = "pre-commit.synapolis-chained"
MARK = "# synapolis pre-commit guard"
# the guard line's end: today's (`--commit`: a refusal is an event, docs/NOTIFY.md), and one an older install wrote
GUARD_TAILS = (" guard --staged --commit", " guard --staged")

SCRIPT = """#!/bin/sh
{mark}: refuses a commit that touches a file another live agent has claimed.
# Installed by `synapolis hooks install git`; `synapolis hooks uninstall git` takes it out and puts back
# the pre-commit hook that was here before (kept as {chained}, and run first).
hooks_dir=$(dirname "$0")
if [ -x "$hooks_dir/{chained}" ]; then
    "$hooks_dir/{chained}" "$@" || exit $?
fi
SYNAPOLIS_STATE_DIR="${{SYNAPOLIS_STATE_DIR:-{state_dir}}}"
export SYNAPOLIS_STATE_DIR
{program} guard --staged --commit
status=$?
if [ "$status" -eq 3 ]; then
    echo "synapolis: commit refused: the files above are claimed by other live agents; ask them (synapolis signal HOLDER ...), or commit without them" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "synapolis: the claim guard could not run (exit $status); the commit goes ahead" >&2
fi
exit 0
"""


def _git(folder, *args) -> str:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise UsageError("git is not installed (or not on PATH): no git hook to install") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {' '.join(args)} did not answer in 30 s") from None
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise UsageError(f"{folder} is not in a git work tree ({message}): --project-dir names one")
    return done.stdout.strip()


def hooks_dir(project_dir) -> str:
    """The folder git runs this repository's hooks from (core.hooksPath honoured; for a linked worktree
    the common one; a relative core.hooksPath is relative to the work tree's top, as git reads it)."""
    top = _git(project_dir, "rev-parse", "--show-toplevel")
    folder = _git(top, "rev-parse", "--git-path", "hooks")
    return os.path.normpath(folder if os.path.isabs(folder) else os.path.join(top, folder))


def is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return MARK.encode() in handle.read(4096)
    except OSError:
        return False


def script(state_dir) -> str:
    from .install import program_command

    return SCRIPT.format(mark=MARK, chained=CHAINED, state_dir=_sh_default(str(state_dir)),
                         program=shlex.join(program_command()))


def _sh_default(value: str) -> str:
    """`value` as the word after `:-` inside double quotes: $, `, \\ and " escaped."""
    return "".join("\\" + ch if ch in '$`"\\' else ch for ch in value)


def install(project_dir, state_dir) -> dict:
    """Write (or refresh) our pre-commit hook, chaining the one that was there; idempotent."""
    from ..atomic import atomic_write_bytes

    folder = hooks_dir(project_dir)
    hook, chained = os.path.join(folder, HOOK), os.path.join(folder, CHAINED)
    os.makedirs(folder, exist_ok=True)
    moved = False
    if os.path.lexists(hook) and not is_ours(hook):
        if os.path.lexists(chained):
            raise UsageError(f"{hook} is not synapolis's and {chained} exists too: move one of them away "
                             "(synapolis keeps the hook it replaces under that name)")
        os.rename(hook, chained)
        moved = True
    text = script(os.path.abspath(str(state_dir)))
    old = None
    if os.path.lexists(hook):
        with open(hook, "rb") as handle:
            old = handle.read()
    changed = old != text.encode()
    if changed:
        atomic_write_bytes(hook, text.encode(), mode=0o755)
    os.chmod(hook, 0o755)
    return {"harness": "git", "hook": hook, "changed": changed or moved,
            "chained": chained if os.path.lexists(chained) else None, "hooks_dir": folder,
            "state_dir": os.path.abspath(str(state_dir))}


def uninstall(project_dir) -> dict:
    """Remove our pre-commit hook and put back the one it chained; anything else is left as it is. Outside a
    git work tree there is nothing of ours to take out (as `rm -f`)."""
    try:
        folder = hooks_dir(project_dir)
    except UsageError:
        return {"harness": "git", "hook": None, "changed": False, "restored": None}
    hook, chained = os.path.join(folder, HOOK), os.path.join(folder, CHAINED)
    if not is_ours(hook):
        return {"harness": "git", "hook": hook, "changed": False, "restored": None}
    os.unlink(hook)
    restored = None
    if os.path.lexists(chained):
        os.rename(chained, hook)
        restored = hook
    return {"harness": "git", "hook": hook, "changed": True, "restored": restored}


def installed(project_dir) -> dict | None:
    """{hook, program} when our pre-commit hook is in place for `project_dir`'s repository, else None
    (not a git work tree, or no hook of ours); for doctor."""
    try:
        folder = hooks_dir(project_dir)
    except UsageError:
        return None
    hook = os.path.join(folder, HOOK)
    if not is_ours(hook):
        return None
    with open(hook, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.rstrip().endswith(GUARD_TAILS):
                return {"hook": hook, "command": line.strip(), "executable": os.access(hook, os.X_OK)}
    return {"hook": hook, "command": None, "executable": os.access(hook, os.X_OK)}


def program_words(command: str | None) -> list[str]:
    """The program (and its options) of the hook's guard line, without the guard's own words; [] when it
    cannot be told (ValueError from an unbalanced quote is the caller's)."""
    words = shlex.split(command or "")
    for tail in GUARD_TAILS:
        n = len(tail.split())
        if words[-n:] == tail.split():
            return words[:-n]
    return []
