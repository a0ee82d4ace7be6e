"""The README works when pasted: every `sh` block, in order, into one fresh bash on a fresh clone.

The clone is `git clone` of this checkout at HEAD. The quick start's two blocks install synapolis into
`.venv` and run the demo, then the whole test suite. Installing from the package index would take
minutes, so this test builds that `.venv` itself, the way `pip install .` leaves it: a virtualenv whose
`synapolis` and `validate-heartbeat` scripts run the clone's code, with the running environment's
dependencies linked in (a .pth file). The rest of the first block (`.venv/bin/synapolis demo`) is run;
the second block's test run is this suite itself, so it is not run again from here.

A block whose first line is `# needs: postgres` runs when PostgreSQL's binaries are on this machine
(always in CI); `# needs: network` blocks reach outside and are never run here. Everything else runs
with `set -eE -o pipefail`: the first command that fails stops the paste and fails the test, naming
the block and the command.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import shutil
import signal
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, clean_env

QUICK_START = "Quick start"
INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install (\.|-e \"\.\[test\]\") && (?P<rest>.+)$")
NEEDS = re.compile(r"^# needs: (\w+)")


def sh_blocks(text: str) -> list[tuple[str, str]]:
    """(section heading, block) for every ```sh block, in order."""
    blocks, section, inside, lines = [], "", False, []
    for line in text.splitlines():
        if not inside and line.startswith("## "):
            section = line[3:].strip()
        elif not inside and line.strip() == "```sh":
            inside, lines = True, []
        elif inside and line.strip() == "```":
            inside = False
            blocks.append((section, "\n".join(lines)))
        elif inside:
            lines.append(line)
    assert not inside, "an unclosed ```sh block"
    return blocks


def postgres_binaries() -> bool:
    return any(os.access(os.path.join(d, "initdb"), os.X_OK)
               for d in [os.environ.get("PG_BIN", ""), *glob.glob("/usr/lib/postgresql/*/bin"), "/usr/local/bin",
                         "/usr/bin"] if d)


def make_venv(clone: Path) -> None:
    """What `python3 -m venv .venv && .venv/bin/pip install .` leaves, without the package index."""
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (purelib,) = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
    (Path(purelib) / "00-synapolis-clone.pth").write_text(f"{clone}\n")
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    (Path(purelib) / "zz-dependencies.pth").write_text(lines)
    # the console scripts as the package declares them (pyproject's [project.scripts], read from the installed
    # distribution), each running the clone's code
    for entry in importlib.metadata.distribution("synapolis").entry_points.select(group="console_scripts"):
        module, call = entry.value.split(":")
        script = venv / "bin" / entry.name
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import {call}\n"
                          f"sys.exit({call}())\n")
        script.chmod(0o755)


def paste_script(blocks, run_postgres: bool) -> tuple[str, list[str]]:
    """The bash script of every block to run, and the blocks left out (with why)."""
    parts = ["set -eE -o pipefail",
             "trap 'echo \"FAILED (exit $?) in $BLOCK: $BASH_COMMAND\" >&2' ERR"]
    left_out = []
    for n, (section, block) in enumerate(blocks, 1):
        where = f"block {n} ({section})"
        if section == QUICK_START and block.startswith("python3 -m venv"):
            match = INSTALL.match(block.strip())
            assert match, f"the quick start's block changed form: {block!r}"
            if "pytest" in match["rest"]:
                left_out.append(f"{where}: the test suite, which is running now")
                continue
            block = match["rest"]
        needs = NEEDS.match(block)
        if needs:
            kind = needs.group(1)
            assert kind in ("postgres", "network"), f"{where}: unknown marker # needs: {kind}"
            if kind == "network" or not run_postgres:
                left_out.append(f"{where}: needs {kind}")
                continue
        parts.append(f"BLOCK={where!r}\necho \"=== $BLOCK\"\n{block}")
    return "\n".join(parts) + "\necho '=== all pasted'\n", left_out


def test_the_readme_has_blocks_in_the_expected_places():
    blocks = sh_blocks((Path(ROOT) / "README.md").read_text("utf-8"))
    sections = [s for s, _ in blocks]
    assert sections[:3] == [QUICK_START, QUICK_START, QUICK_START], sections
    assert blocks[2][1].strip() == ". .venv/bin/activate"  # the activate step right after the quick start
    assert "A short tour" in sections
    for section, block in blocks:  # a pasted server must not hold the shell
        for line in block.splitlines():
            if re.match(r"^\s*synapolis\b.*\bserve\b", line) and not line.split("#")[0].rstrip().endswith("&"):
                pytest.fail(f"{section}: `{line}` would never return when pasted")


def test_ci_runs_the_readmes_test_command():
    """.ci/run ends in the quick start's test command: the suite CI runs (in parallel, with its worker count
    and distribution) is the one a contributor runs."""
    readme = [b for s, b in sh_blocks((Path(ROOT) / "README.md").read_text("utf-8")) if s == QUICK_START]
    (command,) = [b.strip() for b in readme if "pytest" in b]
    ci = [line.strip() for line in (Path(ROOT) / ".ci" / "run").read_text("utf-8").splitlines() if line.strip()]
    # the same install (pip only quieter in CI), then the same pytest invocation, word for word
    assert ci[-1].replace("pip install -q ", "pip install ") == command, (ci[-1], command)
    assert " -n " in f" {INSTALL.match(command)['rest']} ", "the suite runs in parallel (pytest-xdist's -n)"


def test_every_sh_block_pasted_in_order_on_a_fresh_clone(tmp_path):
    if not (Path(ROOT) / ".git").exists():
        pytest.fail("the README paste test needs this checkout's git history (git clone of it at HEAD)")
    run_postgres = postgres_binaries() or os.environ.get("CI") == "true"
    clone = tmp_path / "synapolis"
    subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True, timeout=120)
    make_venv(clone)
    blocks = sh_blocks((clone / "README.md").read_text("utf-8"))
    script, left_out = paste_script(blocks, run_postgres)
    home = tmp_path / "home"
    home.mkdir()
    running_venv = os.path.dirname(sys.executable)
    env = clean_env(HOME=str(home), PATH=os.pathsep.join(
        p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and p != running_venv))
    env.pop("VIRTUAL_ENV", None)
    # output to files and its own process group: a block that fails after starting a server in the background
    # (`serve &`) leaves it running, holding what bash's output goes to; the group is stopped at the end, and
    # files (unlike pipes) need no reader until then, so the test answers as soon as bash does
    out, err = tmp_path / "paste.out", tmp_path / "paste.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        shell = subprocess.Popen(["bash", "--noprofile", "--norc", "-s"], cwd=clone, env=env, stdin=subprocess.PIPE,
                                 stdout=stdout, stderr=stderr, text=True, start_new_session=True)
        try:
            shell.communicate(script, timeout=240)
        finally:
            try:
                os.killpg(shell.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    done = subprocess.CompletedProcess(shell.args, shell.returncode, out.read_text(), err.read_text())
    shown = f"left out: {left_out}\n--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0 and "=== all pasted" in done.stdout, shown
    assert "Traceback" not in done.stderr, shown
    # what the pasted tour did, seen from outside the shell
    state = clone / "state"
    assert (state / "heartbeats" / "bob.json").exists()
    assert (clone / "memories.json").exists()
    assert (state / "memory" / "ledger.jsonl").read_text("utf-8").count("\n") >= 2, shown
    assert (clone / ".claude" / "settings.json").exists()
    if run_postgres:
        assert "hello from the runner" in done.stdout, shown
    if shutil.which("curl"):
        assert '{"ok":true}' in done.stdout.replace(" ", ""), shown
