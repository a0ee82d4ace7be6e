"""`synapolis demo` runs its real scenario end to end and exits 0 (the README's main command)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import clean_env


def test_the_demo_runs_and_leaves_what_it_says(tmp_path):
    env = clean_env(TMPDIR=str(tmp_path))  # its temporary state directory lands here
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "synapolis", "demo", "--keep", "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)  # --json: one object, no narration mixed in
    assert took < 60
    assert facts["killed"] == "linus" and facts["agents"] == ["ada", "grace", "linus"]
    assert {"agent_id": "linus", "level": 2, "condition": "dead"} in facts["incidents"]
    assert facts["takeover_token"] == 2  # the dead holder's claim was freed and taken over with a new token
    assert facts["outcomes"] == ["standby", "consolidated"] and facts["ledger_lines"] >= 2
    state = Path(facts["state_dir"])
    assert state.is_relative_to(tmp_path)
    assert (state / "memory" / "ledger.jsonl").is_file()
    session = json.loads((state / "sessions" / facts["session_id"] / "session.json").read_text())
    assert session["status"] == "ended"
    claims = [json.loads(p.read_text()) for p in (state / "claims").glob("*.json")]
    assert claims and all(c["released_at"] for c in claims)
    # every agent process it started is gone
    for line in (state / "heartbeats").glob("*.json"):
        pid = json.loads(line.read_text()).get("pid")
        if pid and pid != os.getpid():
            assert not _alive(pid), f"demo agent {pid} still running"
    shutil.rmtree(state.parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); it has exited all the same
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False
