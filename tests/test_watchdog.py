"""The watchdog (one cron pass, never two at once), its cron wrapper and the crontab line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ago, clean_env
from synapolis import claims
from synapolis import watchdog as wd
from synapolis.timeutil import utcnow

REPO = Path(__file__).resolve().parent.parent
WRAPPER = REPO / "scripts" / "synapolis-watchdog"
CRONTAB = REPO / "cron" / "synapolis.crontab"

HOLD_LOCK = """
import sys
from synapolis.atomic import locked
with locked(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def fake_claims(monkeypatch):
    """synapolis.claims.reap replaced by a stand-in that records its calls."""
    calls = []

    def reap(ws, now):
        calls.append(now)
        return [{"item": "ticket:1", "reason": "expired"}]
    monkeypatch.setattr(claims, "reap", reap)
    return calls


@pytest.fixture
def lock_holder(ws):
    """Hold the watchdog lock from another process for the body of the test."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(ws.paths.lock("watchdog"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(timeout=30)


def test_one_pass_does_every_step(ws, put_heartbeat, fake_claims):
    now = utcnow()
    put_heartbeat("ok", ago(5, now))
    put_heartbeat("gone-quiet", ago(400, now))
    (ws.paths.heartbeats / "broken.json").write_text("{")
    old_temp = ws.paths.heartbeats / ".tmp-ok.json.1.ab.tmp"
    young_temp = ws.paths.heartbeats / ".tmp-ok.json.2.cd.tmp"
    old_temp.write_text("{")
    young_temp.write_text("{")
    hour_ago = time.time() - 3601
    os.utime(old_temp, (hour_ago, hour_ago))

    result = wd.run_watchdog(ws, now=now)
    assert result["ran"] is True and result["errors"] == []
    assert result["validate"]["files"] == 3 and result["validate"]["invalid"] == 1
    assert result["validate"]["invalid_files"][0]["agent_id"] == "broken"
    assert result["monitor"]["counts"]["stale"] == 1 and result["monitor"]["counts"]["invalid"] == 1
    assert json.loads(ws.paths.monitor.read_text())["counts"] == result["monitor"]["counts"]
    assert sorted(e["agent_id"] for e in result["escalation"]["events"]) == ["broken", "gone-quiet"]
    assert result["escalation"]["open"] == 2
    assert (ws.paths.escalations / "gone-quiet.json").is_file()
    assert result["swept"] == [str(old_temp)]
    assert not old_temp.exists() and young_temp.exists()
    assert result["claims_reaped"] == [{"item": "ticket:1", "reason": "expired"}] and fake_claims == [now]
    assert result["sessions_flagged"] == []

    again = wd.run_watchdog(ws, now=now)  # nothing new: no events, nothing swept
    assert again["escalation"]["events"] == [] and again["swept"] == []


def test_the_real_claims_module_is_called_when_present(ws):
    result = wd.run_watchdog(ws)
    assert result["errors"] == []
    assert isinstance(result["claims_reaped"], list)


def test_a_failing_step_does_not_stop_the_others(ws, put_heartbeat, monkeypatch):
    def reap(ws, now):
        raise RuntimeError("claims store unreadable")
    monkeypatch.setattr(claims, "reap", reap)
    put_heartbeat("quiet", ago(400, utcnow()))
    result = wd.run_watchdog(ws)
    assert result["errors"] == [{"step": "reap_claims", "type": "RuntimeError", "message": "claims store unreadable"}]
    assert result["escalation"]["open"] == 1 and result["monitor"] is not None


def test_no_escalation_without_a_fresh_monitor(ws, put_heartbeat):
    put_heartbeat("quiet", ago(400, utcnow()))
    ws.paths.monitor.mkdir()  # the monitor cannot be written
    result = wd.run_watchdog(ws)
    assert [e["step"] for e in result["errors"]] == ["monitor", "escalate"]
    assert result["escalation"] is None and not (ws.paths.escalations / "quiet.json").exists()
    assert result["validate"]["files"] == 1  # the steps before and after still ran


def test_on_alert_reaches_escalation(ws, put_heartbeat):
    put_heartbeat("quiet", ago(400, utcnow()))
    seen = []
    wd.run_watchdog(ws, on_alert=lambda inc: seen.append(inc["agent_id"]))
    assert seen == ["quiet"]


def test_a_second_pass_while_one_runs_does_nothing(ws, put_heartbeat, lock_holder):
    put_heartbeat("quiet", ago(400, utcnow()))
    result = wd.run_watchdog(ws)
    assert result["ran"] is False and "already running" in result["message"]
    assert not ws.paths.monitor.exists()


def test_cli_second_pass_says_so_and_exits_0(cli, ws, lock_holder):
    result = cli("watchdog", "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["ran"] is False
    text = cli("watchdog")
    assert text.returncode == 0 and "already running" in text.stdout


def test_cli_watchdog_json_and_text(cli, state_dir):
    result = cli("watchdog", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ran"] is True and data["validate"] == {"files": 0, "invalid": 0, "invalid_files": []}
    assert (state_dir / "heartbeat-monitor.json").is_file()
    assert cli("beat", "--agent-id", "a").returncode == 0
    text = cli("watchdog")
    assert text.returncode == 0
    assert text.stdout.count("\n") == 1 and text.stdout.startswith("watchdog: 1 heartbeat(s), 0 invalid · 1 active")


def test_cli_watchdog_exit_0_when_a_step_failed_but_the_pass_ran(cli, ws):
    # contract §5: the watchdog exits 0 unless it could not run; a failed step is reported, not fatal
    ws.paths.monitor.mkdir()
    result = cli("watchdog", "--json")
    assert result.returncode == 0
    assert [e["step"] for e in json.loads(result.stdout)["errors"]] == ["monitor", "escalate"]
    assert "Traceback" not in result.stderr


def test_cli_watchdog_state_dir_that_is_a_file(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("watchdog", "--json", state=blocker)
    assert result.returncode == 2 and json.loads(result.stdout)["error"]["type"] == "UsageError"


# ---- the cron wrapper and the crontab line

def run_wrapper(*args, env=None):
    base = clean_env()
    base["SYNAPOLIS_BIN"] = str(Path(sys.executable).parent / "synapolis")
    if not Path(base["SYNAPOLIS_BIN"]).exists():
        base.pop("SYNAPOLIS_BIN")
    base.update(env or {})
    return subprocess.run([str(WRAPPER), *map(str, args)], capture_output=True, text=True, env=base, timeout=60)


LOG_LINE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z rc=(\d+) (.*)$")


def test_wrapper_logs_one_line_per_pass(state_dir, tmp_path):
    log = tmp_path / "logs" / "watchdog.log"
    for _ in range(2):
        result = run_wrapper(state_dir, log)
        assert result.returncode == 0, result.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        match = LOG_LINE.match(line)
        assert match and match.group(1) == "0" and match.group(2).startswith("watchdog: 0 heartbeat(s)")
    assert (state_dir / "heartbeat-monitor.json").is_file()


def test_wrapper_default_log_and_env_state_dir(state_dir):
    result = run_wrapper(env={"SYNAPOLIS_STATE_DIR": str(state_dir)})
    assert result.returncode == 0, result.stderr
    assert LOG_LINE.match((state_dir / "watchdog.log").read_text().strip())


def test_wrapper_passes_a_running_pass_and_failures_through(ws, lock_holder, tmp_path):
    log = tmp_path / "w.log"
    assert run_wrapper(ws.root, log).returncode == 0
    assert "already running" in log.read_text()


def test_wrapper_passes_the_exit_code_through(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = tmp_path / "w.log"
    result = run_wrapper(blocker, log)
    assert result.returncode == 2
    match = LOG_LINE.match(log.read_text().strip())
    assert match.group(1) == "2" and "UsageError" in match.group(2)


def test_wrapper_without_a_state_dir_is_usage():
    result = run_wrapper()
    assert result.returncode == 2 and "usage" in result.stderr


def test_crontab_runs_the_wrapper_hourly():
    lines = [line for line in CRONTAB.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1
    minute, hour, dom, month, dow, command = lines[0].split(None, 5)
    assert minute.isdigit() and 0 <= int(minute) <= 59
    assert (hour, dom, month, dow) == ("*", "*", "*", "*")
    assert command.split()[0].endswith("scripts/synapolis-watchdog")
    assert os.access(WRAPPER, os.X_OK)
