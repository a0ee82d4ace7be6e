"""Success that lost nothing, failure that did nothing (issue 11, families 3, 5 and 8).

An append that reaches a file-size limit or a full disk leaves no torn line and fails; the last
`tired` clears staged memories only after the ledger holds them; a verb on a write-locked store is
either applied and exit 0 or not applied and exit 8; config values beyond what the code handles are
refused; reads of the notes bus cost the newest notes, not the whole file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys

import pytest

from conftest import sqlite_rows, Holder, fill_to, jsonl_is_whole, pad_jsonl, run_limited
from synapolis import actions, atomic, board, config as config_mod, schemas, sleep
from synapolis.identity import Who
from synapolis.errors import UsageError
from synapolis.timeutil import utcnow
from synapolis.workspace import Workspace

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="rlimits, flock and tmpfs are POSIX")

LIMIT = 1024 * 1024  # RLIMIT_FSIZE for the limited runs: bigger than session.db and its WAL, small to pad to


def _pair(ws):
    sid = actions.start(ws, agent_id="alice", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    return sid, ["--agent-id", "alice", "--session-id", sid]


def _notes(ws, sid):
    return [r for r in jsonl_is_whole(ws.paths.session_notes(sid)) if "text" in r]


# -- appends under a file-size limit --------------------------------------------------------------

def test_a_note_past_the_file_size_limit_fails_whole_and_leaves_no_torn_line(ws):
    # before: os.write wrote what fit, `note` exited 0 and the note was a torn line nobody could read
    sid, alice = _pair(ws)
    path = ws.paths.session_notes(sid)
    board.append_note(ws, sid, "bob", "before", utcnow())
    pad_jsonl(path, LIMIT - 3000)
    size = os.path.getsize(path)
    out = run_limited(ws.root, "note", "y" * 5000, *alice, fsize=LIMIT)
    assert out.returncode == 1, out.stderr
    assert "File too large; nothing was appended" in out.stderr and "Traceback" not in out.stderr
    assert os.path.getsize(path) == size  # truncated back: not a byte of it left
    jsonl_is_whole(path)
    out = run_limited(ws.root, "note", "fits", *alice, "--json", fsize=LIMIT)
    assert out.returncode == 0, out.stderr
    notes = _notes(ws, sid)
    assert [n["text"] for n in notes] == ["before", "fits"]
    assert notes[-1]["seq"] == notes[0]["seq"] + 1 == json.loads(out.stdout)["note"]["seq"]


def test_a_claim_or_release_whose_event_does_not_fit_changes_nothing(ws, cli):
    sid, alice = _pair(ws)
    assert cli("claim", "held", *alice).returncode == 0
    record = json.loads((ws.paths.claims / "held.json").read_text())
    pad_jsonl(ws.paths.claims_log, LIMIT - 40)
    events = jsonl_is_whole(ws.paths.claims_log)
    for args in (["claim", "fresh", *alice], ["release", "held", *alice], ["claim", "held", "--ttl", "60", *alice]):
        out = run_limited(ws.root, *args, fsize=LIMIT)
        assert out.returncode == 1 and "nothing was appended" in out.stderr, (args, out.stderr)
        assert jsonl_is_whole(ws.paths.claims_log) == events  # no event...
    assert not (ws.paths.claims / "fresh.json").exists()  # ...and no claim without its event
    assert json.loads((ws.paths.claims / "held.json").read_text()) == record  # the old file, put back
    assert [p.name for p in ws.paths.claims.iterdir()] == ["held.json"]  # no backup left behind
    assert cli("release", "held", *alice).returncode == 0  # room again: it works
    assert jsonl_is_whole(ws.paths.claims_log)[-1]["event"] == "released"


def _stage(ws, sid, agent, memories):
    out = sleep.tired(ws, Who(agent, sid), memories=memories, env={})
    assert out["outcome"] == "standby"


def test_the_last_tired_keeps_staged_memories_until_the_ledger_holds_them(ws, cli):
    # before: 9 of 10 ledger lines torn, staging cleared, "consolidated, merged 10"
    sid, alice = _pair(ws)
    memories = [f"memory number {i} " + "z" * 200 for i in range(10)]
    _stage(ws, sid, "bob", memories)
    pad_jsonl(ws.paths.memory_ledger, LIMIT - 1000, {"pad": "x" * 90})
    before = os.path.getsize(ws.paths.memory_ledger)
    out = run_limited(ws.root, "tired", *alice, "--json", fsize=LIMIT)
    assert out.returncode == 1 and "nothing was appended" in out.stderr, out.stderr
    assert os.path.getsize(ws.paths.memory_ledger) == before
    assert len(sqlite_rows(ws, sid, "SELECT id FROM staged_memories")) == 10  # nothing staged was lost
    assert json.loads(ws.paths.session_json(sid).read_text())["status"] == "active"
    out = cli("tired", *alice, "--json")  # room again: the same merge goes through
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["merged"] == 10
    texts = [line["text"] for line in jsonl_is_whole(ws.paths.memory_ledger) if "text" in line]
    assert texts == memories and sqlite_rows(ws, sid, "SELECT id FROM staged_memories") == []


def test_the_ledger_append_is_read_back_before_staging_is_cleared(ws, monkeypatch):
    # a disk that acknowledges a write it did not keep: the read-back catches it, nothing is cleared
    sid, _alice = _pair(ws)
    _stage(ws, sid, "bob", ["kept"])
    real_pread = os.pread
    monkeypatch.setattr(atomic.os, "pread", lambda fd, n, at: b"?" * n if n > 1 else real_pread(fd, n, at))
    with pytest.raises(OSError, match="read back differs"):
        sleep.tired(ws, Who("alice", sid), env={})
    monkeypatch.undo()
    assert len(sqlite_rows(ws, sid, "SELECT id FROM staged_memories")) == 1
    assert jsonl_is_whole(ws.paths.memory_ledger) == []


def test_an_escalation_whose_event_does_not_fit_opens_nothing(ws, cli, put_heartbeat):
    put_heartbeat("carol", "2020-01-01T00:00:00Z")
    assert cli("monitor").returncode == 0
    pad_jsonl(ws.paths.escalations_log, LIMIT - 40)
    out = run_limited(ws.root, "escalate", fsize=LIMIT)
    assert out.returncode == 1 and "nothing was appended" in out.stderr, out.stderr
    assert not (ws.paths.escalations / "carol.json").exists()  # no incident without its `opened` event
    assert cli("escalate").returncode == 0
    assert json.loads((ws.paths.escalations / "carol.json").read_text())["status"] == "open"
    assert jsonl_is_whole(ws.paths.escalations_log)[-1]["event"] == "opened"


# -- a full disk ----------------------------------------------------------------------------------

@pytest.mark.parametrize("free", [0, 4096, 8192, 12288, 16384, 24576, 40960])
def test_verbs_on_a_full_disk_are_all_or_nothing(small_fs, free):
    """At each fill level a different step runs out of room (heartbeat, WAL, log, claim file): whatever
    the step, a verb that exits 0 did it all and one that fails did nothing a reader can see torn."""
    ws = Workspace.open(small_fs / "state").ensure()
    sid, alice = _pair(ws)
    _stage(ws, sid, "bob", ["a memory " + "m" * 3000])
    fill_to(small_fs, free)
    note = run_limited(ws.root, "note", "n" * 6000, *alice)
    claim = run_limited(ws.root, "claim", "job", *alice)
    tired = run_limited(ws.root, "tired", *alice)
    for out in (note, claim, tired):
        assert out.returncode in (0, 1, 8) and "Traceback" not in out.stderr, out.stderr
    os.unlink(small_fs / "filler")
    assert [n["text"][:1] for n in _notes(ws, sid)] == (["n"] if note.returncode == 0 else [])
    held = ws.paths.claims / "job.json"
    events = jsonl_is_whole(ws.paths.claims_log)
    assert held.exists() == (claim.returncode == 0) == any(e["item"] == "job" for e in events)
    ledger = [line for line in jsonl_is_whole(ws.paths.memory_ledger) if "text" in line]
    staged = sqlite_rows(ws, sid, "SELECT id FROM staged_memories")
    if tired.returncode == 0:
        assert len(ledger) == 1 and staged == []
    else:
        assert len(staged) == 1  # never cleared without the ledger holding it
    # with room again every verb works and the memory ends up in the ledger exactly once
    cli = lambda *a: run_limited(ws.root, *a)  # noqa: E731
    assert cli("note", "again", *alice).returncode == 0
    assert cli("tired", *alice).returncode == 0
    assert len([line for line in jsonl_is_whole(ws.paths.memory_ledger) if "text" in line]) == 1


# -- a write-locked store -------------------------------------------------------------------------

@pytest.fixture
def quick(ws):
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 300}))
    return Workspace.open(ws.root)


def test_a_locked_store_either_applies_a_verb_with_exit_0_or_nothing_with_exit_8(quick, cli):
    # before: note, claim and release exited 8 after they were applied, so a retry duplicated the note
    ws = quick
    sid, alice = _pair(ws)
    assert cli("claim", "mine", *alice).returncode == 0
    events = len(jsonl_is_whole(ws.paths.claims_log))
    with Holder.store(ws.paths.session_db(sid)):
        out = cli("note", "during", *alice, "--json")
        assert out.returncode == 8 and json.loads(out.stdout)["error"]["type"] == "BusyError", out.stderr
        assert _notes(ws, sid) == []  # exit 8: nothing happened, a retry is safe
        out = cli("signal", "bob", "during", *alice)
        assert out.returncode == 8
        out = cli("whiteboard-write", "k", "during", *alice)
        assert out.returncode == 8
        out = cli("claim", "other", *alice, "--json")
        assert out.returncode == 0, out.stderr  # done outside the store: applied, and says so
        answer = json.loads(out.stdout)
        assert answer["claim"]["claimed_by"] == "alice" and answer["pending_signals"] == []
        assert "locked" in answer["piggyback_skipped"]
        out = cli("release", "mine", *alice, "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["claim"]["released_at"], out.stderr
    assert [e["event"] for e in jsonl_is_whole(ws.paths.claims_log)[events:]] == ["claimed", "released"]
    assert sqlite_rows(ws, sid, "SELECT content FROM signals WHERE content = 'during'") == []
    assert sqlite_rows(ws, sid, "SELECT key FROM session_state") == []
    assert cli("note", "after", *alice).returncode == 0
    assert [n["text"] for n in _notes(ws, sid)] == ["after"]


def test_a_busy_claim_log_leaves_no_claim_without_its_event(quick, cli):
    # before: the claim file was written, the event append timed out: held for an hour, no event, exit 8
    ws = quick
    _sid, alice = _pair(ws)
    assert cli("claim", "mine", *alice).returncode == 0
    ws.paths.claims_log.touch()
    with Holder.flock(ws.paths.claims_log):
        out = cli("claim", "other", *alice, "--json")
        assert out.returncode == 8 and "claims.jsonl" in out.stderr, out.stderr
        assert not (ws.paths.claims / "other.json").exists()
        out = cli("release", "mine", *alice)
        assert out.returncode == 8
        assert json.loads((ws.paths.claims / "mine.json").read_text())["released_at"] is None
    assert [e["event"] for e in jsonl_is_whole(ws.paths.claims_log)] == ["claimed"]


def test_a_note_whose_commit_fails_is_taken_back(ws, monkeypatch):
    # the append happened, then the store's commit failed: the verb fails and the note is gone again
    sid, _alice = _pair(ws)
    from synapolis import signals

    def broken_drain(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(signals, "drain_page", broken_drain)  # what AgentCall.finish calls
    with pytest.raises(Exception):
        actions.note(ws, Who("alice", sid), "taken back", env={})
    monkeypatch.undo()
    assert _notes(ws, sid) == []
    assert actions.note(ws, Who("alice", sid), "kept", env={})["note"]["seq"] == 1


# -- values that pass validation, then crash or mislead ---------------------------------------------

BAD_VALUES = [
    ("max_content_bytes", 10 ** 12), ("max_content_bytes", 10 ** 20), ("rate_limit_per_min", 10 ** 20),
    ("busy_timeout_ms", 10 ** 20), ("monitor_keep", 10 ** 9), ("stale_after_s", 1e300),
]


@pytest.mark.parametrize("key,value", BAD_VALUES)
def test_config_values_beyond_what_the_code_handles_are_refused(state_dir, cli, key, value):
    # before: MemoryError, OverflowError or an immediate BusyError, after the config passed every check
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text(json.dumps({key: value}))
    assert config_mod.check_config({key: value})  # our checks and the schema agree
    assert schemas.validation_errors("config", {key: value})
    for args in (["start", "--agent-id", "a"], ["signal", "*", "hi", "--agent-id", "a"], ["status"]):
        out = cli(*args, "--json")
        assert out.returncode == 2 and key in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    doctor = cli("doctor", "--json")
    found = {f["check"]: f for f in json.loads(doctor.stdout)["findings"]}
    assert found["config"]["status"] == "fail" and key in found["config"]["message"]


def test_the_largest_config_values_work(state_dir, cli):
    maxima = dict(config_mod.MAX_INTS)
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text(json.dumps(maxima))
    assert config_mod.check_config(maxima) == [] and schemas.validation_errors("config", maxima) == []
    assert cli("start", "--agent-id", "a").returncode == 0
    out = cli("signal", "*", "s" * 70000, "--agent-id", "a", "--json")  # past the default 65536
    assert out.returncode == 0, out.stderr
    assert cli("monitor").returncode == 0


def test_a_ttl_beyond_a_day_is_refused_and_a_planted_one_reads_invalid(ws, cli, put_heartbeat):
    # before: `beat --ttl 1e308` kept a silent agent active, and its claims held, forever
    out = cli("beat", "--agent-id", "a", "--ttl", "1e308")
    assert out.returncode == 2 and "at most 86400" in out.stderr
    put_heartbeat("holder", "2020-01-01T00:00:00Z", ttl_s=1e308)
    (ws.paths.claims / "job.json").write_text("{}")
    monitor = json.loads(cli("monitor", "--json").stdout)
    assert [a["effective_status"] for a in monitor["agents"] if a["agent_id"] == "holder"] == ["invalid"]
    assert schemas.validation_errors("heartbeat", json.loads(ws.paths.heartbeat("holder").read_text()))


def test_a_notifier_that_cannot_be_split_is_reported_and_never_stops_an_incident(ws, cli, put_heartbeat):
    # before: doctor passed it, then the escalation step died and the dead agent never got an incident
    ws.paths.config.write_text(json.dumps({"escalation": {"notify_cmd": "notify-send 'unclosed"}}))
    doctor = json.loads(cli("doctor", "--json").stdout)
    config = [f for f in doctor["findings"] if f["check"] == "config"][0]
    assert config["status"] == "fail" and "cannot be split" in config["message"]
    put_heartbeat("carol", "2020-01-01T00:00:00Z")
    out = cli("watchdog", "--json")
    assert out.returncode == 0, out.stderr
    incident = json.loads((ws.paths.escalations / "carol.json").read_text())
    assert incident["status"] == "open" and incident["condition"] == "dead"
    assert "cannot be split" in incident["notifications"][0]["error"]
    assert jsonl_is_whole(ws.paths.escalations_log)[0]["event"] == "opened"
    with pytest.raises(UsageError):
        config_mod.split_notify_cmd("   ")


# -- scale of reads and names ------------------------------------------------------------------------

def test_read_notes_reads_the_newest_from_the_end(ws, monkeypatch):
    # before: `read-notes --limit 5` parsed the whole bus (845 MiB of memory for a 200 MB file)
    sid, _alice = _pair(ws)
    path = ws.paths.session_notes(sid)
    line = {"seq": 0, "at": "2030-01-01T00:00:00.000000Z", "agent_id": "bob", "text": "old " + "o" * 1000}
    pad_jsonl(path, 8 * 1024 * 1024, line)
    for i in range(7):
        board.append_note(ws, sid, "alice", f"new {i}", utcnow())
    read = []
    real_pread = os.pread
    monkeypatch.setattr(atomic.os, "pread", lambda fd, n, at: read.append(n) or real_pread(fd, n, at))
    notes = board.read_notes(ws, sid, limit=5)
    assert [n["text"] for n in notes] == [f"new {i}" for i in range(2, 7)]
    assert sum(read) <= 2 * atomic.TAIL_BLOCK  # a block or two of 8 MiB, not the file
    assert [n["text"][:3] for n in board.read_notes(ws, sid, limit=9)] == ["old", "old"] + ["new"] * 7


def test_a_session_whose_id_starts_with_a_dot_is_a_session(ws, cli):
    # before: invisible to `start` (which made a second session) and to `status`
    assert cli("start", "--agent-id", "a", "--session-id", ".hidden").returncode == 0
    out = cli("start", "--agent-id", "b", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["session_id"] == ".hidden", out.stderr
    status = json.loads(cli("status", "--json").stdout)
    assert ".hidden" in json.dumps(status)
    assert sorted(a["id"] for a in json.loads(cli("list-agents", "--json").stdout)["agents"]) == ["a", "b"]


MALFORMED = [
    ["start", "--agent-id", "bad/name"], ["start", "--session-id", "../x"], ["beat", "--agent-id", "../x"],
    ["beat", "--agent-id", "a", "--ttl", "1e308"], ["note", "hi", "--agent-id", "a b"],
    ["signal", "*", "hi", "--agent-id", ""], ["ack-signals", "x", "--agent-id", "a/b"],
    ["signals-pending", "--agent-id", "."], ["whiteboard-write", "k", "v", "--agent-id", "a/b"],
    ["tired", "--agent-id", "a/b"], ["claim", "../x", "--agent-id", "a"], ["release", "x", "--agent-id", "a/b"],
]


@pytest.mark.parametrize("args", MALFORMED, ids=lambda a: " ".join(a))
def test_a_malformed_name_is_refused_before_the_state_directory_exists(state_dir, cli, args):
    out = cli(*args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert not state_dir.exists()


def test_a_claim_whose_event_was_lost_in_a_crash_is_logged_by_the_next_change(ws):
    # a writer killed after replacing the claim file, before appending its event (tests/test_faults.py
    # finds that step by counting): the file's transition knows where its line belongs
    from synapolis import claims

    claims.claim(ws, "job", "alice")
    claims.claim(ws, "other", "alice")
    log = ws.paths.claims_log
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0])  # the second claim's line never made it
    claims.release(ws, "other", "alice")
    events = jsonl_is_whole(log)
    assert [(e["item"], e["event"], e.get("recovered")) for e in events] == [
        ("job", "claimed", None), ("other", "claimed", True), ("other", "released", None)]
    claims.release(ws, "other", "alice")  # nothing to change, nothing missing: nothing logged
    assert len(jsonl_is_whole(log)) == 3
