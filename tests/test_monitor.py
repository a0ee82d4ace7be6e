"""The monitor (contract §6): derive_monitor, since/transitions, clock skew across passes, rotation, CLI."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from conftest import ago, heartbeat_doc, NOW, synapolis_cmd
from synapolis import atomic, monitor as mon
from synapolis.heartbeat import read_heartbeat
from synapolis.schemas import validation_errors
from synapolis.timeutil import format_ts, now_ts


def later(seconds):
    return NOW + timedelta(seconds=seconds)


def agents_by_id(doc):
    return {a["agent_id"]: a for a in doc["agents"]}


def test_a_repeated_pass_sees_every_change_to_a_file(ws, put_heartbeat):
    """A monitor pass reuses what this process read at its last pass only for a file with the same signature
    (inode, size, mtime, ctime): a rewrite in place of the same size with its mtime set back, a replace, a
    removal and a new file are all seen at the next pass."""
    path = put_heartbeat("amy", ago(10), task="aaaa")
    put_heartbeat("bob", ago(10))
    first = agents_by_id(mon.run_monitor(ws, now=NOW))
    assert first["amy"]["task"] == "aaaa"
    stat = os.stat(path)
    put_heartbeat("amy", ago(10), task="bbbb")  # in place: the same inode and size, the same mtime (utime)
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    assert agents_by_id(mon.run_monitor(ws, now=NOW))["amy"]["task"] == "bbbb"
    atomic.atomic_write_json(path, heartbeat_doc("amy", ago(5), task="cccc"))  # a new file renamed over it
    (ws.paths.heartbeats / "bob.json").unlink()
    (ws.paths.heartbeats / "cat.json").write_text("{broken")
    third = agents_by_id(mon.run_monitor(ws, now=NOW))
    assert third["amy"]["task"] == "cccc" and "bob" not in third and third["cat"]["effective_status"] == "invalid"
    assert agents_by_id(mon.run_monitor(ws, now=NOW)) == {k: dict(v, since=v["since"]) for k, v in third.items()}


def test_document_shape_counts_and_order(ws, put_heartbeat):
    put_heartbeat("zed", ago(10), status="idle", task="t", substrate="s", session_id="sess1")
    put_heartbeat("amy", ago(400))
    put_heartbeat("kim", ago(5000), status="sleeping")
    (ws.paths.heartbeats / "bad.json").write_text("{broken")
    doc = mon.run_monitor(ws, now=NOW)
    assert validation_errors("monitor", doc) == []
    assert doc["schema_version"] == 1 and doc["generated_at"] == format_ts(NOW)
    assert doc["thresholds"] == {"stale_after_s": 300, "dead_after_s": 3600, "clock_skew_s": 120}
    assert [a["agent_id"] for a in doc["agents"]] == ["amy", "bad", "kim", "zed"]
    assert doc["counts"] == {"active": 0, "idle": 1, "sleeping": 1, "stopped": 0, "stale": 1, "dead": 0, "invalid": 1}
    zed = agents_by_id(doc)["zed"]
    assert zed == {"agent_id": "zed", "effective_status": "idle", "declared_status": "idle", "beat_at": ago(10),
                   "seq": 1, "seq_first_seen_at": format_ts(NOW), "age_s": 10.0, "since": format_ts(NOW),
                   "harness": "test", "substrate": "s", "session_id": "sess1", "task": "t", "errors": [],
                   "anomalies": [], "claims": []}
    bad = agents_by_id(doc)["bad"]
    assert bad["effective_status"] == "invalid" and bad["declared_status"] is None and bad["age_s"] is None
    assert bad["errors"] and "not valid JSON" in bad["errors"][0]["message"]
    # the file on disk is the same document
    assert json.loads(ws.paths.monitor.read_text()) == doc


def test_since_is_carried_while_the_status_holds_and_transitions_are_listed(ws, put_heartbeat):
    put_heartbeat("a", ago(0))
    put_heartbeat("b", ago(0))
    first = mon.run_monitor(ws, now=NOW)
    assert sorted(first["transitions"], key=lambda t: t["agent_id"]) == [
        {"agent_id": "a", "from": None, "to": "active"}, {"agent_id": "b", "from": None, "to": "active"}]
    put_heartbeat("b", ago(-100, NOW), seq=2)  # b keeps beating, a stops
    second = mon.run_monitor(ws, now=later(100))
    assert second["transitions"] == []
    assert agents_by_id(second)["a"]["since"] == format_ts(NOW)
    third = mon.run_monitor(ws, now=later(301))
    assert third["transitions"] == [{"agent_id": "a", "from": "active", "to": "stale"}]
    assert agents_by_id(third)["a"]["since"] == format_ts(later(301))
    assert agents_by_id(third)["b"]["since"] == format_ts(NOW)
    fourth = mon.run_monitor(ws, now=later(3601))
    assert {"agent_id": "a", "from": "stale", "to": "dead"} in fourth["transitions"]
    os.unlink(ws.paths.heartbeats / "a.json")
    fifth = mon.run_monitor(ws, now=later(3602))
    assert {"agent_id": "a", "from": "dead", "to": None} in fifth["transitions"]
    assert "a" not in agents_by_id(fifth)


def test_a_pass_carries_over_the_monitor_file_as_it_is_now(ws, put_heartbeat):
    """A pass remembers what it wrote instead of parsing it again, but only while the file is that file:
    a document the caller changed, or a file another writer replaced, is never taken for it."""
    put_heartbeat("a", ago(0))
    first = mon.run_monitor(ws, now=NOW)
    agents_by_id(first)["a"]["since"] = format_ts(later(-999))  # the caller's copy, not the pass's memory
    second = mon.run_monitor(ws, now=later(10))
    assert agents_by_id(second)["a"]["since"] == format_ts(NOW)
    # another monitor (another process) replaced the file: its `since` is the one carried over
    other = json.loads(ws.paths.monitor.read_text())
    agents_by_id(other)["a"]["since"] = format_ts(later(-500))
    atomic.atomic_write_json(ws.paths.monitor, other)
    third = mon.run_monitor(ws, now=later(20))
    assert agents_by_id(third)["a"]["since"] == format_ts(later(-500))
    # rewritten in place (same file, another size): read again too
    doc = json.loads(ws.paths.monitor.read_text())
    agents_by_id(doc)["a"]["since"] = format_ts(later(-400))
    ws.paths.monitor.write_text(json.dumps(doc, indent=4))
    fourth = mon.run_monitor(ws, now=later(30))
    assert agents_by_id(fourth)["a"]["since"] == format_ts(later(-400))
    assert json.loads(ws.paths.monitor.read_text()) == fourth


def test_an_agent_whose_clock_runs_ahead_still_goes_stale(ws, put_heartbeat):
    put_heartbeat("fast", ago(-7200), seq=5)  # two hours in the future
    first = mon.run_monitor(ws, now=NOW)
    entry = agents_by_id(first)["fast"]
    assert entry["effective_status"] == "active" and entry["anomalies"] == ["clock_skew"]
    assert entry["seq_first_seen_at"] == format_ts(NOW)
    second = mon.run_monitor(ws, now=later(300))
    assert agents_by_id(second)["fast"]["effective_status"] == "active"
    third = mon.run_monitor(ws, now=later(301))
    assert agents_by_id(third)["fast"]["effective_status"] == "stale"
    assert agents_by_id(third)["fast"]["age_s"] == 301
    # it beats again: a new seq (and a new write) restarts the clock
    put_heartbeat("fast", ago(-7000, later(301)), seq=6, written_at=later(301))
    fourth = mon.run_monitor(ws, now=later(302))
    assert agents_by_id(fourth)["fast"]["effective_status"] == "active"


def test_derive_is_pure_and_ignores_a_broken_previous(ws, put_heartbeat):
    reads = [read_heartbeat(put_heartbeat("a", ago(1)))]
    one = mon.derive_monitor(reads, {"agents": "nonsense"}, NOW, ws.config)
    two = mon.derive_monitor(reads, None, NOW, ws.config)
    assert one == two
    assert not ws.paths.monitor.exists()


def test_temp_files_of_crashed_writers_are_not_heartbeats(ws, put_heartbeat):
    put_heartbeat("a", ago(1))
    (ws.paths.heartbeats / ".tmp-a.json.123.abcd.tmp").write_text('{"half":')
    (ws.paths.heartbeats / "b.json.tmp").write_text("")
    doc = mon.run_monitor(ws, now=NOW)
    assert [a["agent_id"] for a in doc["agents"]] == ["a"]


def test_agent_id_must_match_file_name(ws):
    (ws.paths.heartbeats / "x.json").write_text(json.dumps(heartbeat_doc("y", ago(1))))
    entry = agents_by_id(mon.run_monitor(ws, now=NOW))["x"]
    assert entry["effective_status"] == "invalid"
    assert entry["errors"][0]["pointer"] == "/agent_id"


def history_stamps(ws):
    return [json.loads(p.read_text())["generated_at"] for p in mon.history_files(ws.paths.monitor_history)]


def test_rotation_keeps_exactly_the_newest_n(ws, put_heartbeat):
    put_heartbeat("a", ago(1))
    stamps = []
    for i in range(8):
        stamps.append(mon.run_monitor(ws, now=later(i), keep=3)["generated_at"])
    # the current monitor is the 8th; history holds the 3 before it, oldest first
    assert history_stamps(ws) == stamps[4:7]
    assert len(os.listdir(ws.paths.monitor_history)) == 3
    mon.run_monitor(ws, now=later(10), keep=1)
    assert history_stamps(ws) == stamps[7:8]


def test_monitor_keep_from_config_is_the_default(ws, put_heartbeat, state_dir):
    cfg = json.loads(ws.paths.config.read_text())
    cfg["monitor_keep"] = 2
    ws.paths.config.write_text(json.dumps(cfg))
    from synapolis.workspace import Workspace
    ws2 = Workspace.open(state_dir)
    for i in range(5):
        mon.run_monitor(ws2, now=later(i))
    assert len(mon.history_files(ws.paths.monitor_history)) == 2


def test_two_passes_in_one_second_keep_both(ws, put_heartbeat):
    put_heartbeat("a", ago(1))
    for _ in range(4):
        mon.run_monitor(ws, now=NOW)  # the very same generated_at every time
    files = mon.history_files(ws.paths.monitor_history)
    assert len(files) == 3
    assert [p.name.rsplit(".", 2)[-2] for p in files] == ["000", "001", "002"]
    # and with sub-second stamps inside one second: the names still sort by time
    mon.run_monitor(ws, now=NOW + timedelta(microseconds=500))
    mon.run_monitor(ws, now=NOW + timedelta(microseconds=900))
    assert history_stamps(ws)[-2:] == [format_ts(NOW), format_ts(NOW + timedelta(microseconds=500))]


def test_no_rotate_keeps_no_history(ws, put_heartbeat):
    put_heartbeat("a", ago(1))
    mon.run_monitor(ws, now=NOW, rotate=False)
    mon.run_monitor(ws, now=later(1), rotate=False)
    assert mon.history_files(ws.paths.monitor_history) == []


def test_a_broken_monitor_file_is_rotated_by_its_mtime_and_replaced(ws, put_heartbeat):
    put_heartbeat("a", ago(1))
    ws.paths.monitor.write_text("{not json")
    doc = mon.run_monitor(ws, now=NOW)
    files = mon.history_files(ws.paths.monitor_history)
    assert len(files) == 1 and files[0].read_text() == "{not json"
    assert json.loads(ws.paths.monitor.read_text()) == doc


def test_concurrent_monitor_processes_never_lose_a_snapshot(ws, put_heartbeat, state_dir):
    put_heartbeat("a", ago(1))
    code = ("import sys; from synapolis.workspace import Workspace; from synapolis.monitor import run_monitor\n"
            "ws = Workspace.open(sys.argv[1])\n"
            "for _ in range(10): run_monitor(ws, keep=1000)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(state_dir)]) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    # 30 passes: 29 snapshots in the history, one current; every one parses
    files = mon.history_files(ws.paths.monitor_history)
    assert len(files) == 29
    assert all(json.loads(p.read_text())["schema_version"] == 1 for p in files)


# ---- the CLI

def test_cli_monitor_json_and_text(cli, put_heartbeat):
    put_heartbeat("a", now_ts())
    result = cli("monitor", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["agents"][0]["agent_id"] == "a" and doc["agents"][0]["effective_status"] == "active"
    text = cli("monitor")
    assert text.returncode == 0 and "AGENT" in text.stdout and "1 agent(s): 1 active" in text.stdout


def test_cli_monitor_on_an_empty_state_dir(cli, state_dir):
    result = cli("monitor", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["agents"] == []
    assert (state_dir / "heartbeat-monitor.json").is_file()


@pytest.mark.parametrize("args", [["--keep", "0"], ["--keep", "x"], ["--bogus"]])
def test_cli_monitor_usage_errors(cli, args):
    result = cli("monitor", *args, "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["type"] == "UsageError"
    assert "Traceback" not in result.stderr


def test_cli_monitor_keep_and_no_rotate(cli, state_dir):
    for _ in range(4):
        assert cli("monitor", "--keep", "2").returncode == 0
    assert len(os.listdir(state_dir / "monitor-history")) == 2
    assert cli("monitor", "--no-rotate", "--keep", "1").returncode == 0
    assert len(os.listdir(state_dir / "monitor-history")) == 2


def test_watch_monitor_reacts_to_a_beat(ws, put_heartbeat):
    passes: queue.Queue = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(target=mon.watch_monitor, args=(ws, passes.put, stop), kwargs={"interval": 60})
    worker.start()
    try:
        first = passes.get(timeout=10)
        assert first["agents"] == []
        put_heartbeat("late", now_ts())
        second = passes.get(timeout=10)  # a file event, not the 60 s timer
        assert [a["agent_id"] for a in second["agents"]] == ["late"]
    finally:
        stop.set()
        worker.join(timeout=10)
    assert not worker.is_alive()



def test_watch_monitor_is_not_woken_by_its_own_reads(ws, put_heartbeat):
    """A pass reads every heartbeat; those reads (inotify "opened" events) must not start the next pass."""
    for name in ("a", "b", "c"):
        put_heartbeat(name, now_ts())
    passes: queue.Queue = queue.Queue()
    stop = threading.Event()
    worker = threading.Thread(target=mon.watch_monitor, args=(ws, passes.put, stop), kwargs={"interval": 60})
    worker.start()
    try:
        assert len(passes.get(timeout=10)["agents"]) == 3
        with pytest.raises(queue.Empty):  # reads woke it 5 times a second before writes_only()
            extra = passes.get(timeout=1.5)
            pytest.fail(f"a pass with nothing written: {len(extra['agents'])} agents")
        put_heartbeat("d", now_ts())
        assert len(passes.get(timeout=10)["agents"]) == 4  # a write still wakes it
    finally:
        stop.set()
        worker.join(timeout=10)
    assert not worker.is_alive()

def test_cli_watch_until_interrupted(state_dir, put_heartbeat, spawn):
    proc = spawn(synapolis_cmd(state_dir, "monitor", "--watch", "--json"), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    assert json.loads(lines.get(timeout=15))["agents"] == []
    put_heartbeat("w", now_ts())
    deadline = time.monotonic() + 15
    while True:
        doc = json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        if doc["agents"]:
            break
    assert doc["agents"][0]["agent_id"] == "w"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert "Traceback" not in proc.stderr.read()
