"""Escalation (contract §6): every incident transition, global incidents, the notifier, ack, idempotence, CLI."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from datetime import timedelta

import pytest

from conftest import NOW, wait_until
from synapolis import escalation as esc
from synapolis.atomic import atomic_write_json, read_jsonl
from synapolis.config import Config, merge_defaults
from synapolis.errors import NotFoundError, UsageError
from synapolis.schemas import validation_errors
from synapolis.timeutil import format_ts
from synapolis.workspace import Workspace

REPEAT = 86400


def later(seconds):
    return NOW + timedelta(seconds=seconds)


def monitor(**statuses):
    return {"generated_at": format_ts(NOW),
            "agents": [{"agent_id": a, "effective_status": s} for a, s in sorted(statuses.items())]}


def put_monitor(ws, **statuses):
    atomic_write_json(ws.paths.monitor, monitor(**statuses))


def events(ws):
    return [r["event"] for r in read_jsonl(ws.paths.escalations_log)]


def incident(ws, name):
    path = ws.paths.escalation(name)
    return json.loads(path.read_text()) if path.exists() else None


def with_config(ws, **escalation):
    cfg = json.loads(ws.paths.config.read_text())
    cfg["escalation"].update(escalation)
    ws.paths.config.write_text(json.dumps(cfg))
    return Workspace.open(ws.root)


NOTIFIER = r"""
import json, os, sys
data = json.load(sys.stdin)
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"event": os.environ["SYNAPOLIS_EVENT"], "incident": data, "argv": sys.argv[2:]}) + "\n")
sys.exit(int(os.environ.get("NOTIFIER_EXIT", "0")))
"""


@pytest.fixture
def notifier(tmp_path):
    script = tmp_path / "notifier.py"
    script.write_text(NOTIFIER)
    out = tmp_path / "notified.jsonl"

    def calls():
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return [sys.executable, str(script), str(out)], calls


# ---- the pure policy

def test_reconcile_is_pure():
    current = {}
    doc = monitor(a="stale")
    frozen = copy.deepcopy(doc)
    incidents, evs = esc.reconcile(doc, current, NOW, Config())
    assert current == {} and doc == frozen
    assert [e["event"] for e in evs] == ["opened"] and incidents["a"]["status"] == "open"
    again, evs2 = esc.reconcile(doc, incidents, NOW, Config())
    assert evs2 == [] and again == incidents


@pytest.mark.parametrize("status,level", [("stale", 1), ("invalid", 1), ("dead", 2)])
def test_a_failing_agent_opens_an_incident(ws, status, level):
    put_monitor(ws, a=status, b="active")
    result = esc.run_escalation(ws, now=NOW)
    inc = incident(ws, "a")
    assert validation_errors("escalation", inc) == []
    assert (inc["key"], inc["agent_id"], inc["level"], inc["condition"], inc["status"]) == \
        ("heartbeat:a", "a", level, status, "open")
    assert inc["opened_at"] == inc["updated_at"] == format_ts(NOW)
    assert inc["resolved_at"] is None and inc["acked_at"] is None and inc["notifications"] == []
    assert incident(ws, "b") is None
    assert [e["event"] for e in result["events"]] == ["opened"] and result["incidents"] == [inc]
    assert events(ws) == ["opened"]


def test_running_twice_changes_nothing(ws):
    put_monitor(ws, a="stale", b="dead", c="active")
    esc.run_escalation(ws, now=NOW)
    files = {p.name: p.read_bytes() for p in ws.paths.escalations.iterdir()}
    log = ws.paths.escalations_log.read_bytes()
    result = esc.run_escalation(ws, now=later(60))
    assert result["events"] == []
    assert {p.name: p.read_bytes() for p in ws.paths.escalations.iterdir()} == files
    assert ws.paths.escalations_log.read_bytes() == log


def test_dead_raises_to_level_two_keeping_the_id(ws):
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    first = incident(ws, "a")
    put_monitor(ws, a="dead")
    esc.run_escalation(ws, now=later(3600))
    raised = incident(ws, "a")
    assert raised["id"] == first["id"] and raised["level"] == 2 and raised["condition"] == "dead"
    assert raised["opened_at"] == format_ts(NOW) and raised["updated_at"] == format_ts(later(3600))
    assert events(ws) == ["opened", "raised"]
    # back to stale (say its ttl grew) keeps level 2: no news, no event
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=later(3700))
    assert incident(ws, "a")["level"] == 2 and incident(ws, "a")["condition"] == "stale"
    assert events(ws) == ["opened", "raised"]


def test_stale_to_invalid_is_no_new_incident(ws):
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    put_monitor(ws, a="invalid")
    esc.run_escalation(ws, now=later(1))
    assert incident(ws, "a")["condition"] == "invalid" and events(ws) == ["opened"]


@pytest.mark.parametrize("recovered", ["active", "idle", "stopped", "sleeping"])
def test_recovery_resolves(ws, recovered):
    put_monitor(ws, a="dead")
    esc.run_escalation(ws, now=NOW)
    put_monitor(ws, a=recovered)
    result = esc.run_escalation(ws, now=later(10))
    inc = incident(ws, "a")
    assert inc["status"] == "resolved" and inc["resolved_at"] == format_ts(later(10))
    assert inc["resolution"] == f"recovered: {recovered}"
    assert result["incidents"] == [] and events(ws) == ["opened", "resolved"]
    assert validation_errors("escalation", inc) == []


def test_removed_heartbeat_resolves(ws):
    put_monitor(ws, a="stale", b="active")
    esc.run_escalation(ws, now=NOW)
    put_monitor(ws, b="active")
    esc.run_escalation(ws, now=later(1))
    assert incident(ws, "a")["status"] == "resolved"
    assert incident(ws, "a")["resolution"] == "heartbeat file removed"


def test_a_later_failure_opens_a_new_incident_with_a_new_id(ws):
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    first = incident(ws, "a")["id"]
    put_monitor(ws, a="active")
    esc.run_escalation(ws, now=later(10))
    put_monitor(ws, a="invalid")
    esc.run_escalation(ws, now=later(20))
    second = incident(ws, "a")
    assert second["id"] != first and second["status"] == "open" and second["condition"] == "invalid"
    assert events(ws) == ["opened", "resolved", "opened"]
    everything = esc.list_incidents(ws, include_resolved=True)["incidents"]
    assert [(i["id"], i["status"]) for i in everything] == [(first, "resolved"), (second["id"], "open")]
    assert esc.list_incidents(ws)["incidents"] == [second]


def test_renotify_after_repeat_after_s_unless_acked(ws):
    put_monitor(ws, a="stale", b="stale")
    esc.run_escalation(ws, now=NOW)
    assert esc.run_escalation(ws, now=later(REPEAT - 1))["events"] == []
    result = esc.run_escalation(ws, now=later(REPEAT))
    assert sorted((e["event"], e["agent_id"]) for e in result["events"]) == [("renotified", "a"), ("renotified", "b")]
    assert incident(ws, "a")["notified_at"] == format_ts(later(REPEAT))
    # the next one counts from the last notification
    assert esc.run_escalation(ws, now=later(2 * REPEAT - 1))["events"] == []
    acked = esc.ack(ws, incident(ws, "a")["id"], now=later(2 * REPEAT - 1))
    assert acked["acked"] is True and acked["incident"]["acked_at"] == format_ts(later(2 * REPEAT - 1))
    result = esc.run_escalation(ws, now=later(2 * REPEAT))
    assert [(e["event"], e["agent_id"]) for e in result["events"]] == [("renotified", "b")]
    assert esc.run_escalation(ws, now=later(10 * REPEAT))["events"][0]["agent_id"] == "b"
    assert events(ws).count("acked") == 1


def test_raise_counts_as_a_notification(ws):
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    put_monitor(ws, a="dead")
    esc.run_escalation(ws, now=later(REPEAT - 10))
    assert esc.run_escalation(ws, now=later(REPEAT))["events"] == []


def test_ack_details(ws):
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    inc_id = incident(ws, "a")["id"]
    assert esc.ack(ws, inc_id[:6], now=later(5))["acked"] is True
    again = esc.ack(ws, inc_id, now=later(6))
    assert again["acked"] is False and again["incident"]["acked_at"] == format_ts(later(5))
    assert events(ws) == ["opened", "acked"]
    with pytest.raises(NotFoundError):
        esc.ack(ws, "0" * 16)
    with pytest.raises(NotFoundError):
        esc.ack(ws, inc_id[:5])  # too short to be a prefix
    # an acked incident still raises, and still resolves
    put_monitor(ws, a="dead")
    esc.run_escalation(ws, now=later(7))
    assert incident(ws, "a")["level"] == 2 and incident(ws, "a")["acked_at"] == format_ts(later(5))


def test_ambiguous_ack_prefix_is_a_usage_error(ws):
    for name, suffix in (("a", "01"), ("b", "02")):
        atomic_write_json(ws.paths.escalation(name), {**esc._new_incident(name, 1, "stale", format_ts(NOW)),
                                                      "id": "abcdef00000000" + suffix})
    with pytest.raises(UsageError):
        esc.ack(ws, "abcdef")
    assert esc.ack(ws, "abcdef0000000002")["incident"]["agent_id"] == "b"


# ---- the global incident

def test_more_than_half_of_four_opens_one_global_incident(ws):
    put_monitor(ws, a="stale", b="stale", c="invalid", d="active")
    result = esc.run_escalation(ws, now=NOW)
    assert [(e["event"], e["key"]) for e in result["events"]] == [("opened", "heartbeat:@global")]
    glob = incident(ws, "@global")
    assert (glob["key"], glob["condition"], glob["level"]) == ("heartbeat:@global", "global", 1)
    assert glob["agents"] == ["a", "b", "c"] and glob["total_agents"] == 4
    assert validation_errors("escalation", glob) == []
    assert sorted(os.listdir(ws.paths.escalations)) == ["@global.json"]
    # one of them dies: the global incident is raised, still no per-agent incident
    put_monitor(ws, a="dead", b="stale", c="invalid", d="active")
    result = esc.run_escalation(ws, now=later(1))
    assert [(e["event"], e["key"]) for e in result["events"]] == [("raised", "heartbeat:@global")]
    assert incident(ws, "@global")["level"] == 2
    # most recover: the global incident resolves, the one still failing gets its own, in the same pass
    put_monitor(ws, a="dead", b="active", c="active", d="active")
    result = esc.run_escalation(ws, now=later(2))
    assert sorted((e["event"], e["key"]) for e in result["events"]) == [
        ("opened", "heartbeat:a"), ("resolved", "heartbeat:@global")]
    assert incident(ws, "a")["level"] == 2


@pytest.mark.parametrize("statuses", [
    {"a": "stale", "b": "stale", "c": "active", "d": "active"},  # exactly half of four
    {"a": "stale", "b": "stale", "c": "active"},  # more than half, but of fewer than four
])
def test_no_global_incident_below_the_threshold(ws, statuses):
    put_monitor(ws, **statuses)
    esc.run_escalation(ws, now=NOW)
    assert incident(ws, "@global") is None
    assert incident(ws, "a")["status"] == "open" and incident(ws, "b")["status"] == "open"


def test_incidents_open_before_a_global_one_stay_and_resolve(ws):
    put_monitor(ws, a="stale", b="active", c="active", d="active")
    esc.run_escalation(ws, now=NOW)
    put_monitor(ws, a="dead", b="stale", c="stale", d="active")
    esc.run_escalation(ws, now=later(1))
    assert incident(ws, "a")["level"] == 1  # the global incident speaks for it now
    assert incident(ws, "@global")["status"] == "open" and incident(ws, "b") is None
    put_monitor(ws, a="active", b="stale", c="stale", d="active")
    esc.run_escalation(ws, now=later(2))
    assert incident(ws, "a")["status"] == "resolved"
    assert incident(ws, "@global")["status"] == "resolved"
    assert incident(ws, "b")["status"] == "open" and incident(ws, "c")["status"] == "open"


# ---- the notifier and the alert hook

def test_notifier_gets_the_incident_on_stdin_for_every_event(ws, notifier):
    cmd, calls = notifier
    ws = with_config(ws, notify_cmd=cmd)
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    inc_id = incident(ws, "a")["id"]
    put_monitor(ws, a="dead")
    esc.run_escalation(ws, now=later(1))
    esc.run_escalation(ws, now=later(1 + REPEAT))
    esc.ack(ws, inc_id, now=later(2 + REPEAT))
    put_monitor(ws, a="active")
    esc.run_escalation(ws, now=later(3 + REPEAT))
    seen = calls()
    assert [c["event"] for c in seen] == ["opened", "raised", "renotified", "acked", "resolved"]
    assert all(c["incident"]["id"] == inc_id for c in seen)
    assert seen[1]["incident"]["level"] == 2 and seen[-1]["incident"]["status"] == "resolved"
    inc = incident(ws, "a")
    assert [n["event"] for n in inc["notifications"]] == ["opened", "raised", "renotified", "acked", "resolved"]
    assert all(n["ok"] and n["exit_code"] == 0 for n in inc["notifications"])
    assert all(r["notify"]["ok"] for r in read_jsonl(ws.paths.escalations_log))


def test_notify_cmd_string_is_split_never_given_to_a_shell(ws, notifier, tmp_path):
    cmd, calls = notifier
    marker = tmp_path / "pwned"
    ws = with_config(ws, notify_cmd=" ".join(cmd) + f" ; touch {marker}")
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    assert not marker.exists()
    assert calls()[0]["argv"] == [";", "touch", str(marker)]


def test_a_failing_notifier_is_logged_and_the_pass_goes_on(ws, notifier, monkeypatch):
    cmd, calls = notifier
    monkeypatch.setenv("NOTIFIER_EXIT", "3")
    ws = with_config(ws, notify_cmd=cmd)
    put_monitor(ws, a="stale", b="dead")
    result = esc.run_escalation(ws, now=NOW)
    assert len(calls()) == 2
    assert len(result["notify_failures"]) == 2
    assert all(e["notify"]["exit_code"] == 3 and not e["notify"]["ok"] for e in result["events"])
    assert incident(ws, "a")["status"] == "open" and incident(ws, "b")["status"] == "open"
    assert incident(ws, "a")["notifications"][0]["error"].startswith("exit 3")
    assert [r["notify"]["ok"] for r in read_jsonl(ws.paths.escalations_log)] == [False, False]


def test_a_missing_notifier_is_logged(ws, tmp_path):
    ws = with_config(ws, notify_cmd=[str(tmp_path / "no-such-notifier")])
    put_monitor(ws, a="stale")
    result = esc.run_escalation(ws, now=NOW)
    assert "cannot run" in result["events"][0]["notify"]["error"]
    assert incident(ws, "a")["status"] == "open"


def test_a_hanging_notifier_and_its_children_are_killed_at_the_time_limit(ws, tmp_path):
    pidfile = tmp_path / "child.pid"
    # the notifier forks a child that would hold the stderr pipe open, then hangs
    cmd = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; sleep 60"]
    ws = with_config(ws, notify_cmd=cmd, notify_timeout_s=0.5)
    put_monitor(ws, a="stale")
    started = time.monotonic()
    result = esc.run_escalation(ws, now=NOW)
    assert time.monotonic() - started < 20  # a bound against hanging, not a benchmark
    assert "timed out" in result["events"][0]["notify"]["error"]
    assert incident(ws, "a")["status"] == "open"
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:  # reap it if it became ours (it has not: it belongs to init once sh is gone)
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, 5, "the notifier's child to be killed with it")


def test_on_alert_for_opened_and_raised_and_its_failure_is_recorded(ws):
    seen = []

    def on_alert(inc):
        seen.append((inc["agent_id"], inc["last_event"]))
        if inc["agent_id"] == "b":
            raise RuntimeError("session store locked")

    put_monitor(ws, a="stale", b="stale")
    result = esc.run_escalation(ws, now=NOW, on_alert=on_alert)
    assert seen == [("a", "opened"), ("b", "opened")]
    assert [e["alert"]["ok"] for e in result["events"]] == [True, False]
    assert "session store locked" in result["alert_failures"][0]["alert"]["error"]
    assert incident(ws, "b")["status"] == "open"
    put_monitor(ws, a="dead", b="active")
    esc.run_escalation(ws, now=later(1), on_alert=on_alert)
    assert seen[2:] == [("a", "raised")]  # resolving is no alert


def test_no_monitor_yet(ws):
    result = esc.run_escalation(ws, now=NOW)
    assert result["events"] == [] and "monitor" in result["message"]


def test_a_broken_incident_file_does_not_stop_the_pass(ws):
    ws.paths.escalation("a").write_text("{torn")
    put_monitor(ws, a="stale")
    esc.run_escalation(ws, now=NOW)
    assert incident(ws, "a")["status"] == "open"


def test_a_monitor_entry_with_an_impossible_name_is_skipped(ws):
    put_monitor(ws, **{"a b": "stale", "../x": "stale", "ok": "stale"})
    result = esc.run_escalation(ws, now=NOW)
    assert [e["agent_id"] for e in result["events"]] == ["ok"]
    assert sorted(os.listdir(ws.paths.escalations)) == ["ok.json"]


def test_config_merge_keeps_escalation_defaults():
    cfg = Config(merge_defaults({"escalation": {"repeat_after_s": 5}}))
    assert cfg.repeat_after_s == 5 and cfg.notify_cmd is None and cfg.notify_timeout_s == 10


# ---- the CLI

def test_cli_escalate_escalations_and_ack(cli, state_dir):
    assert cli("init").returncode == 0
    ws = Workspace.open(state_dir)
    put_monitor(ws, a="stale", b="active")
    result = cli("escalate", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [e["event"] for e in data["events"]] == ["opened"]
    inc_id = data["events"][0]["incident_id"]
    listing = json.loads(cli("escalations", "--json").stdout)
    assert [i["id"] for i in listing["incidents"]] == [inc_id]
    assert set(listing["incidents"][0]) >= {"id", "key", "agent_id", "level", "condition", "status", "opened_at",
                                             "updated_at", "resolved_at", "acked_at", "notifications"}
    text = cli("escalations")
    assert text.returncode == 0 and inc_id in text.stdout and "LEVEL" in text.stdout
    acked = cli("escalations", "ack", inc_id, "--json")
    assert acked.returncode == 0 and json.loads(acked.stdout)["incident"]["acked_at"]
    missing = cli("escalations", "ack", "ffffffffffff", "--json")
    assert missing.returncode == 6
    assert json.loads(missing.stdout)["error"]["type"] == "NotFoundError"
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    put_monitor(ws, a="active", b="active")
    assert cli("escalate").returncode == 0
    assert json.loads(cli("escalations", "--json").stdout)["incidents"] == []
    everything = json.loads(cli("escalations", "--all", "--json").stdout)["incidents"]
    assert [(i["id"], i["status"]) for i in everything] == [(inc_id, "resolved")]


def test_cli_escalations_reads_an_empty_state_dir_without_creating_it(cli, state_dir):
    result = cli("escalations", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == {"incidents": []}
    assert not state_dir.exists()


def test_cli_escalate_with_a_broken_monitor_is_one_line_exit_1(cli, state_dir):
    assert cli("init").returncode == 0
    (state_dir / "heartbeat-monitor.json").write_text("{nope")
    result = cli("escalate", "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["type"] == "InternalError"
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_cli_ack_without_id_is_usage(cli):
    result = cli("escalations", "ack")
    assert result.returncode == 2 and "Traceback" not in result.stderr
