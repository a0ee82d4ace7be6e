"""What the benchmark scripts share: the command under test and its environment, timing a run, the
machine and interpreter lines, and each script's own section of RESULTS.md."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"

# the checkout first, so a benchmark measures this tree whether or not it is installed
sys.path.insert(0, str(HERE.parent))


def synapolis_cmd() -> list[str]:
    """The console script users run (the one next to this interpreter), else `python -m synapolis`."""
    script = Path(sys.executable).parent / "synapolis"
    if script.exists():
        return [str(script)]
    found = shutil.which("synapolis")
    return [found] if found else [sys.executable, "-m", "synapolis"]


def bench_parser(doc: str) -> "argparse.ArgumentParser":
    """A benchmark's command line: its docstring's first line as the description, and `--no-write`."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser


def machine() -> str:
    return f"{platform.node()} · {platform.system()} {platform.release()} · {os.cpu_count()} CPUs · " \
           f"Python {platform.python_version()}"


def interpreter() -> str:
    """Which interpreter measured, for a section: start-up numbers mean little without it."""
    if sys.prefix != sys.base_prefix:
        where = "a virtualenv"
    else:
        where = "NOT a virtualenv: site-wide .pth start-up imports weigh on both sides and flatter the ratio"
    return (f"Interpreter `{sys.executable}` ({where}; synapolis: {install_kind()}); bytecode compiled (a warm-up "
            f"run caches it under a private PYTHONPYCACHEPREFIX, as an installed wheel ships it)")


def install_kind() -> str:
    """How synapolis is installed for this interpreter: an editable install adds a path (or a finder) that
    every import of the console script goes through; a wheel does not."""
    import json
    from importlib import metadata

    try:
        text = metadata.distribution("synapolis").read_text("direct_url.json") or "{}"
    except metadata.PackageNotFoundError:
        return "not installed, the checkout on sys.path"
    editable = json.loads(text).get("dir_info", {}).get("editable", False)
    return "an editable install" if editable else "a non-editable install"


def bench_env(tmp: Path) -> dict:
    """The environment of a measured process: no SYNAPOLIS_* leaking in, bytecode cached.

    An installed package has compiled bytecode; a checkout run with PYTHONDONTWRITEBYTECODE would
    recompile every module on every start and measure the compiler, so the caches go to `tmp`.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPOLIS_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def timed(cmd: list[str], env: dict, *, stdin: str | None = None, expect: str = "", quiet: bool = False) -> float:
    """Seconds one run of `cmd` took. A run that fails, lacks `expect` in its output or (with `quiet`)
    says anything on stderr stops the script: a number from a broken run measures nothing."""
    started = time.perf_counter()
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout or (quiet and done.stderr):
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip() or done.stdout[:200]}")
    return elapsed


def callgrind_count(cmd: list[str], env: dict | None = None, stdin: str | None = None) -> int:
    """The user-space instructions `cmd` executes under `valgrind --tool=callgrind` (SystemExit when it fails)."""
    import re

    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd], input=stdin,
                          capture_output=True, text=True, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(cmd)} under valgrind failed ({done.returncode}): {done.stderr[-300:]}")
    return int(found.group(1))


def call_ms(call) -> float:
    """Milliseconds one in-process `call()` took."""
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


def write_section(section: str, body: str, path: Path = RESULTS) -> None:
    """Replace only `section` of RESULTS.md (between its BEGIN/END markers), adding it when missing."""
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    block = f"{begin}\n{body}\n{end}"
    old = path.read_text("utf-8") if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new, "utf-8")


def publish(section: str, text: str, write: bool = True) -> None:
    """Print a benchmark's section and, unless told not to (--no-write), put it into RESULTS.md."""
    print(text)
    if write:
        write_section(section, text)


def ratio_table(rows) -> list[str]:
    """Markdown rows for (name, median seconds, ratio to the baseline), with the header."""
    return ["| what | median | vs baseline |", "|---|---|---|"] + [
        f"| {name} | {seconds * 1000:.1f} ms | {ratio:.2f}x |" for name, seconds, ratio in rows]
