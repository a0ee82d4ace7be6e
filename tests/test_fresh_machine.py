"""The fresh machine (issue 11, family 9): tests find this install's console scripts next to the interpreter,
never by a bare name on PATH, which on a fresh clone finds nothing (or someone else's install)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import ago, clean_env, console_script, heartbeat_doc, validate_heartbeat_cmd

TESTS = Path(__file__).resolve().parent
# a console script as the first word of a command list (synapolis: followed by an option, as every test
# passes --state-dir first), or looked up on PATH
BARE = re.compile(r"""\[\s*["']validate-heartbeat["']|\[\s*["']synapolis["']\s*,\s*["']-"""
                  r"""|shutil\.which\(\s*["'](?:synapolis|validate-heartbeat)["']""")


def test_no_test_runs_a_console_script_by_bare_name():
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if BARE.search(line) and "sys.argv" not in line:  # argv inside a process is not a lookup
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == [], "use conftest.console_script(NAME):\n" + "\n".join(offenders)


def test_the_console_scripts_run_with_a_bare_system_path(state_dir):
    """What a fresh machine's CI sees: PATH without the virtualenv, and the scripts still run."""
    folder = state_dir / "heartbeats"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text(json.dumps(heartbeat_doc("a", ago(5))))
    env = clean_env(PATH="/usr/bin:/bin")
    valid = subprocess.run(validate_heartbeat_cmd(state_dir, "--json"),
                           capture_output=True, text=True, timeout=60, env=env)
    assert valid.returncode == 0, valid.stderr
    assert json.loads(valid.stdout)["valid"] is True
    listed = subprocess.run([console_script("synapolis"), "--state-dir", str(state_dir), "claims", "--json"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["claims"] == []
