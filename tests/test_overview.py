"""`synapolis status`: one screen for a person (agents, status, age, task, claims, unread, incidents)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

from conftest import ago, NOW, synapolis_cmd, wait_until

from synapolis import actions, claims, escalation, monitor, overview
from synapolis.identity import Who
from synapolis.workspace import Workspace

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
LONG_ID = "a" * 60 + ".sub-agent-with-a-rather-long-name"


def visible(line: str) -> int:
    return len(ANSI_RE.sub("", line))


def populate(ws, put_heartbeat):
    put_heartbeat("alice", ago(10), task="refactor the auth module " * 8)
    put_heartbeat("bob", ago(30), status="idle")
    put_heartbeat("carol", ago(600))             # stale (300 < age <= 3600)
    put_heartbeat("dave", ago(7200))             # dead
    put_heartbeat("erin", ago(99999), status="stopped")
    put_heartbeat(LONG_ID, ago(5), task="x")
    (ws.paths.heartbeats / "mallory.json").write_text("{not json")
    claims.claim(ws, "src/api/users.py", agent_id="alice", now=NOW)
    claims.claim(ws, "ticket:142", agent_id="dave", now=NOW)
    monitor.run_monitor(ws, now=NOW)
    escalation.run_escalation(ws, now=NOW)


def test_collect_shows_every_part(ws, put_heartbeat):
    populate(ws, put_heartbeat)
    data = overview.collect(ws, now=NOW)
    status = {a["agent_id"]: a["effective_status"] for a in data["agents"]}
    assert status == {"alice": "active", "bob": "idle", "carol": "stale", "dave": "dead", "erin": "stopped",
                      LONG_ID: "active", "mallory": "invalid"}
    assert data["counts"] == {"active": 2, "idle": 1, "stopped": 1, "stale": 1, "dead": 1, "invalid": 1}
    alice = next(a for a in data["agents"] if a["agent_id"] == "alice")
    assert alice["claims"] == ["src/api/users.py"] and alice["age_s"] == 10
    assert {c["item"]: c["claimed_by"] for c in data["claims"]} == {"src/api/users.py": "alice", "ticket:142": "dave"}
    assert {i["agent_id"] for i in data["incidents"]} == {"carol", "dave", "mallory"}
    assert all(i["status"] == "open" for i in data["incidents"]) and data["problems"] == []


def test_unread_counts_come_from_the_sessions(ws):
    actions.start(ws, agent_id="alice", env={}, write_identity=False)
    actions.start(ws, agent_id="bob", env={}, write_identity=False)
    for text in ("one", "two"):
        actions.signal(ws, Who("alice"), "bob", text, env={})
    actions.signal(ws, Who("bob"), "*", "hello all", env={})
    unread = {a["agent_id"]: a["unread"] for a in overview.collect(ws)["agents"]}
    assert unread == {"alice": 1, "bob": 2}
    actions.ack_signals(ws, Who("bob"), [], all=True, env={})
    assert {a["agent_id"]: a["unread"] for a in overview.collect(ws)["agents"]}["bob"] == 0


def test_render_fits_80_columns_and_colours_only_when_asked(ws, put_heartbeat):
    populate(ws, put_heartbeat)
    data = overview.collect(ws, now=NOW)
    plain = overview.render(data, width=80)
    assert "\x1b[" not in plain
    assert all(visible(line) <= 80 for line in plain.splitlines()), max(plain.splitlines(), key=visible)
    for word in ("alice", "stale", "dead", "src/api/users.py", "ticket:142", "INCIDENT", "10s", "not valid JSON"):
        assert word in plain
    assert "…" in plain  # the long id and the long task are cut to fit, visibly
    coloured = overview.render(data, width=80, colour=True)
    assert "\x1b[" in coloured
    assert all(visible(line) <= 80 for line in coloured.splitlines())
    assert ANSI_RE.sub("", coloured) == plain


def test_a_damaged_part_does_not_blank_the_screen(ws, put_heartbeat):
    put_heartbeat("alice", ago(1))
    ws.paths.monitor.write_text("[1, 2]")  # not a monitor document: the incidents part fails
    (ws.paths.escalations / "alice.json").write_text("{broken")
    data = overview.collect(ws, now=NOW)
    assert [a["agent_id"] for a in data["agents"]] == ["alice"]
    text = overview.render(data)
    assert "alice" in text


def test_cli_on_an_empty_state_dir_reads_without_creating_it(cli, state_dir):
    done = cli("status")
    assert done.returncode == 0 and "no agents yet" in done.stdout and not state_dir.exists()
    done = cli("status", "--json")
    data = json.loads(done.stdout)
    assert data["agents"] == [] and data["claims"] == [] and data["incidents"] == []


def test_cli_json_and_text_are_plain_on_a_pipe(cli, ws, put_heartbeat):
    populate(ws, put_heartbeat)
    done = cli("status")
    assert done.returncode == 0 and "\x1b[" not in done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    data = json.loads(cli("status", "--json").stdout)
    assert {a["agent_id"] for a in data["agents"]} >= {"alice", "bob", "mallory"}
    wide = cli("status", "--width", "120").stdout
    assert max(len(line) for line in wide.splitlines()) > 80


def test_watch_redraws_when_the_state_directory_changes(state_dir, spawn):
    ws = Workspace.open(state_dir).ensure()
    proc = spawn(synapolis_cmd(state_dir, "status", "--watch", "--json"), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: [lines.append(json.loads(line)) for line in proc.stdout], daemon=True)
    reader.start()
    wait_until(lambda: lines, 20, "the first frame")
    assert lines[0]["agents"] == []
    # a fixed sleep: a redraw that does NOT come has nothing to wait on; a window with no change, which a
    # redraw loop feeding itself would fill
    time.sleep(1.0)
    assert len(lines) == 1  # reading the state does not itself cause redraws
    actions.beat(ws, Who("zoe"), env={}, task="just arrived")
    wait_until(lambda: any(a["agent_id"] == "zoe" for frame in lines for a in frame["agents"]), 15,
               "a frame with zoe")


def test_watch_stops_on_request(ws, put_heartbeat):
    put_heartbeat("alice", ago(1))
    stop = threading.Event()
    frames = []

    def redraw():
        frames.append(overview.collect(ws))
        if len(frames) >= 2:
            stop.set()

    worker = threading.Thread(target=overview.watch, args=(ws, redraw, stop), kwargs={"refresh_s": 0.2})
    worker.start()
    worker.join(timeout=15)
    assert not worker.is_alive() and len(frames) >= 2  # the periodic refresh keeps ages moving
