"""The whiteboard (session_state) and the notes bus (notes.jsonl)."""

from __future__ import annotations

import json
import multiprocessing
from datetime import timedelta

import pytest

from conftest import NOW
from synapolis import actions, atomic, board
from synapolis.errors import NotFoundError, UsageError
from synapolis.identity import Who


@pytest.fixture
def pair(start_agent):
    a = start_agent("alice")
    start_agent("bob")
    return Who("alice", a["session_id"]), Who("bob", a["session_id"])


def test_whiteboard_last_writer_wins(ws, pair, db_rows):
    alice, bob = pair
    actions.whiteboard_write(ws, alice, "branch", "main", env={}, now=NOW)
    out = actions.whiteboard_write(ws, bob, "branch", "release/2.4", env={}, now=NOW + timedelta(seconds=1))
    assert out["entry"] == {"key": "branch", "value": "release/2.4", "updated_by": "bob",
                            "updated_at": "2030-01-01T12:00:01.000000Z"}
    assert actions.whiteboard_read(ws, alice, "branch", env={}, now=NOW)["entry"]["value"] == "release/2.4"
    actions.whiteboard_write(ws, alice, "a-first", "", env={}, now=NOW)  # an empty value is a value
    entries = actions.whiteboard_read(ws, alice, env={}, now=NOW)["entries"]
    assert [e["key"] for e in entries] == ["a-first", "branch"]
    assert db_rows(alice.session_id, "SELECT key, value, updated_by FROM session_state ORDER BY key") == [
        {"key": "a-first", "value": "", "updated_by": "alice"},
        {"key": "branch", "value": "release/2.4", "updated_by": "bob"}]


def test_whiteboard_bad_input(ws, pair):
    alice, _ = pair
    with pytest.raises(NotFoundError):
        actions.whiteboard_read(ws, alice, "missing", env={}, now=NOW)
    for key in ("", "   ", "x" * 201, "a\nb"):
        with pytest.raises(UsageError):
            actions.whiteboard_write(ws, alice, key, "v", env={}, now=NOW)
    with pytest.raises(UsageError):
        actions.whiteboard_write(ws, alice, "k", "v" * (ws.config.max_content_bytes + 1), env={}, now=NOW)
    # odd but legal keys stay keys, never paths or SQL
    for key in ("../../etc/passwd", "'; DROP TABLE signals; --", "ключ"):
        actions.whiteboard_write(ws, alice, key, "ok", env={}, now=NOW)
        assert actions.whiteboard_read(ws, alice, key, env={}, now=NOW)["entry"]["value"] == "ok"


def test_whiteboard_read_from_an_empty_state_dir(tmp_path):
    from synapolis.workspace import Workspace

    ws = Workspace.open(tmp_path / "nothing")
    assert actions.whiteboard_read(ws, env={})["entries"] == []
    assert actions.read_notes(ws, env={})["notes"] == []
    assert actions.list_agents(ws, env={})["agents"] == []
    assert not (tmp_path / "nothing").exists()


def test_notes_newest_limit_oldest_first(ws, pair):
    alice, bob = pair
    for i in range(7):
        who = alice if i % 2 == 0 else bob
        out = actions.note(ws, who, f"note {i}", env={}, now=NOW + timedelta(seconds=i))
        assert out["note"]["seq"] == i + 1 and out["note"]["agent_id"] == who.agent_id
    notes = actions.read_notes(ws, alice, limit=3, env={}, now=NOW)["notes"]
    assert [n["text"] for n in notes] == ["note 4", "note 5", "note 6"]
    assert set(notes[0]) == {"seq", "at", "agent_id", "text"}
    with pytest.raises(UsageError):
        actions.read_notes(ws, alice, limit=0, env={})
    with pytest.raises(UsageError):
        actions.note(ws, alice, "", env={})
    with pytest.raises(UsageError):
        actions.note(ws, alice, "x" * (ws.config.max_content_bytes + 1), env={})


@pytest.mark.sqlite_only
def test_notes_survive_a_torn_line(ws, pair):
    alice, _ = pair
    actions.note(ws, alice, "before", env={}, now=NOW)
    path = ws.paths.session_notes(alice.session_id)
    with open(path, "ab") as handle:
        handle.write(b'{"seq": 99, "at": "2030-01-01T12:00:00Z", "agent_id": "alice", "te')  # a writer killed mid-line
    out = actions.note(ws, alice, "after", env={}, now=NOW)
    assert out["note"]["seq"] == 2
    assert [n["text"] for n in actions.read_notes(ws, alice, env={}, now=NOW)["notes"]] == ["before", "after"]


def test_last_seq_reads_across_blocks(tmp_path):
    path = tmp_path / "notes.jsonl"
    big = "y" * (atomic.TAIL_BLOCK + 100)
    path.write_text(json.dumps({"seq": 41, "text": big}) + "\n" + json.dumps({"seq": 42, "text": big}) + "\n")
    assert board._last_seq(path) == 42
    assert board._last_seq(tmp_path / "missing.jsonl") == 0


def _write_notes(state_dir, session_id, agent_id, count, barrier):
    from synapolis.workspace import Workspace

    ws = Workspace.open(state_dir)
    barrier.wait(timeout=30)
    for i in range(count):
        actions.note(ws, Who(agent_id, session_id), f"{agent_id} {i}", env={}, piggyback=False)


def test_concurrent_note_writers_get_unique_increasing_seqs(ws, start_agent):
    sid = start_agent("w0")["session_id"]
    names = [f"w{i}" for i in range(4)]
    for name in names[1:]:
        start_agent(name)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(names))
    procs = [ctx.Process(target=_write_notes, args=(str(ws.root), sid, n, 25, barrier)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    from synapolis.store import store_for

    lines = store_for(ws).read_notes(sid, 1000)  # notes.jsonl, or the shared database's notes
    assert [n["seq"] for n in lines] == list(range(1, 101))
    assert sorted(n["text"] for n in lines) == sorted(f"{n} {i}" for n in names for i in range(25))


def test_cli_notes_and_whiteboard(cli):
    assert cli("start", "--agent-id", "alice").returncode == 0
    assert cli("note", "-", "--agent-id", "alice", input="from stdin\n").returncode == 0
    notes = json.loads(cli("read-notes", "--json").stdout)["notes"]
    assert [(n["seq"], n["agent_id"], n["text"]) for n in notes] == [(1, "alice", "from stdin")]
    assert cli("whiteboard-write", "k", "v", "--agent-id", "alice").returncode == 0
    entry = json.loads(cli("whiteboard-read", "k", "--json").stdout)["entry"]
    assert (entry["key"], entry["value"], entry["updated_by"]) == ("k", "v", "alice")
    text = cli("whiteboard-read").stdout
    assert "KEY" in text and "alice" in text
    assert cli("whiteboard-read", "nope").returncode == 6
    assert cli("read-notes", "--limit", "0").returncode == 2
