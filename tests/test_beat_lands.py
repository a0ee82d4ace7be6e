"""A beat lands on its own machine whatever the store does (§12: the heartbeat file is written first), and a
heartbeat's `seq` only grows, even past a file that cannot be read (issue 30, items 5 and 8)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from synapolis.workspace import Workspace

from conftest import clean_env, configure, synapolis_cmd, use_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """A socket that accepts every connection and never answers (a server that hangs, a black-holed proxy)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent_port():
    server = SilentServer()
    try:
        yield server.port
    finally:
        server.close()


@pytest.fixture(params=["unreachable", "silent"])
def store_away(request, tmp_path):
    """A state directory whose PostgreSQL store cannot be reached: nothing listens on its port, or a server
    accepts and never answers."""
    if request.param == "unreachable":
        port = _free_port()
    else:
        port = request.getfixturevalue("silent_port")
    ws = use_store(tmp_path / "state", f"postgresql://u:pw-never-shown@127.0.0.1:{port}/db?connect_timeout=2")
    configure(ws, busy_timeout_ms=500)
    return Workspace.open(ws.root), port


def _beat(ws, *args):
    began = time.monotonic()
    out = subprocess.run(synapolis_cmd(ws.root, "beat", *args), capture_output=True, text=True, timeout=60,
                         env=clean_env())
    return out, time.monotonic() - began


def test_a_beat_lands_in_its_file_when_the_store_is_away(store_away):
    ws, port = store_away
    path = ws.paths.heartbeat("alice")
    # a new agent: exit 8 naming the host, and still its file
    out, took = _beat(ws, "--agent-id", "alice", "--task", "first")
    assert out.returncode == 8, out.stderr
    assert f"127.0.0.1:{port}" in out.stderr and "pw-never-shown" not in out.stderr + out.stdout
    assert took < 15
    doc = json.loads(path.read_text())
    assert doc["seq"] == 1 and doc["task"] == "first" and doc["status"] == "active"
    # an agent that beat before: the next seq, the new fields
    out, _ = _beat(ws, "--agent-id", "alice", "--status", "idle", "--task", "second")
    assert out.returncode == 8, out.stderr
    doc = json.loads(path.read_text())
    assert doc["seq"] == 2 and doc["task"] == "second" and doc["status"] == "idle"
    valid = subprocess.run(synapolis_cmd(ws.root, "monitor", "--json"), capture_output=True, text=True, timeout=60,
                           env=clean_env(SYNAPOLIS_STORE_URL="sqlite"))
    assert [a["agent_id"] for a in json.loads(valid.stdout)["agents"]] == ["alice"], valid.stderr


def test_a_beat_as_a_named_agent_in_a_session_lands_too(store_away):
    """Named by the environment with a session: the session's registry is away as well; the file is not."""
    ws, _port = store_away
    out = subprocess.run(synapolis_cmd(ws.root, "beat"), capture_output=True, text=True, timeout=60,
                         env=clean_env(SYNAPOLIS_AGENT_ID="bob", SYNAPOLIS_SESSION_ID="s1"))
    assert out.returncode == 8, out.stderr
    doc = json.loads(ws.paths.heartbeat("bob").read_text())
    assert doc["seq"] == 1 and doc["session_id"] == "s1"


# -- seq only grows (item 8) -------------------------------------------------------------------------------

def _local(tmp_path) -> Workspace:
    return Workspace.open(tmp_path / "state").ensure()


def _run_beat(ws, agent="alice"):
    out = subprocess.run(synapolis_cmd(ws.root, "beat", "--agent-id", agent, "--json"), capture_output=True,
                         text=True, timeout=60, env=clean_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["heartbeat"]


def test_a_float_seq_is_continued_not_restarted(tmp_path):
    ws = _local(tmp_path)
    _run_beat(ws)
    path = ws.paths.heartbeat("alice")
    doc = json.loads(path.read_text())
    doc["seq"] = 12.0  # JSON Schema's integer: valid, and another writer may well have written it so
    path.write_text(json.dumps(doc))
    assert _run_beat(ws)["seq"] == 13


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_heartbeat_never_sends_seq_back(tmp_path):
    ws = _local(tmp_path)
    for _ in range(5):
        seq = _run_beat(ws)["seq"]
    assert seq == 5
    path = ws.paths.heartbeat("alice")
    path.chmod(0)
    after = _run_beat(ws)["seq"]
    assert after > 5
    assert json.loads(path.read_text())["seq"] == after
    assert _run_beat(ws)["seq"] == after + 1


def test_a_heartbeat_that_cannot_be_read_never_sends_seq_back(tmp_path):
    """A FIFO in its place (refused by every reader, root included): the next beat replaces it, seq above."""
    ws = _local(tmp_path)
    for _ in range(4):
        _run_beat(ws)
    path = ws.paths.heartbeat("alice")
    path.unlink()
    os.mkfifo(path)
    after = _run_beat(ws)["seq"]
    assert after > 4 and json.loads(path.read_text())["seq"] == after


def test_a_heartbeat_that_is_not_json_never_sends_seq_back(tmp_path):
    ws = _local(tmp_path)
    for _ in range(3):
        _run_beat(ws)
    path = ws.paths.heartbeat("alice")
    path.write_text('{"seq": 3, "torn')
    assert _run_beat(ws)["seq"] > 3


def test_an_unreadable_heartbeat_continues_from_the_monitor_it_was_seen_in(tmp_path):
    """The monitor saw seq 40: a beat after the file went unreadable is above it, and exactly the next one when
    the file is newer than the monitor's sighting is unknown."""
    ws = _local(tmp_path)
    for _ in range(3):
        _run_beat(ws)
    path = ws.paths.heartbeat("alice")
    doc = json.loads(path.read_text())
    doc["seq"] = 40
    path.write_text(json.dumps(doc))
    subprocess.run(synapolis_cmd(ws.root, "monitor"), capture_output=True, timeout=60, env=clean_env(), check=True)
    path.write_text("not json")
    assert _run_beat(ws)["seq"] > 40


# -- monitor_keep: bounded, the bound written down ---------------------------------------------------------

def test_monitor_keep_has_one_bound_in_the_config_the_cli_and_the_readme(tmp_path):
    from pathlib import Path

    from synapolis.config import MAX_INTS

    ws = _local(tmp_path)
    bound = MAX_INTS["monitor_keep"]
    ok = subprocess.run(synapolis_cmd(ws.root, "monitor", "--keep", bound), capture_output=True, text=True,
                        timeout=60, env=clean_env())
    assert ok.returncode == 0, ok.stderr
    over = subprocess.run(synapolis_cmd(ws.root, "monitor", "--keep", bound + 1), capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert over.returncode == 2 and "100000" in over.stderr.replace(",", "")
    document = json.loads(ws.paths.config.read_text())
    ws.paths.config.write_text(json.dumps({**document, "monitor_keep": bound + 1}))
    refused = subprocess.run(synapolis_cmd(ws.root, "monitor"), capture_output=True, text=True, timeout=60,
                             env=clean_env())
    assert refused.returncode == 2 and "monitor_keep" in refused.stderr
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for key, most in MAX_INTS.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"  | `{key}`")), "")
        assert f"{most:,}" in row, f"README's config bounds table lacks {key} at most {most:,}"
