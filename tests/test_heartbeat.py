"""heartbeat.py and `synapolis beat`: seq grows by one, fields are kept, bad input is refused before writing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from synapolis import heartbeat as hb
from synapolis.errors import UsageError
from synapolis.schemas import validation_errors


def test_seq_grows_by_one_and_the_document_is_schema_valid(ws):
    docs = [hb.write_heartbeat(ws.paths, "alice") for _ in range(5)]
    assert [d["seq"] for d in docs] == [1, 2, 3, 4, 5]
    on_disk = json.loads(ws.paths.heartbeat("alice").read_text())
    assert on_disk == docs[-1]
    assert validation_errors("heartbeat", on_disk) == []
    assert hb.quick_check(on_disk)
    assert on_disk["started_at"] == docs[0]["beat_at"]
    assert on_disk["pid"] == os.getpid() and on_disk["host"]


def test_fields_are_kept_unless_given_and_note_is_for_one_beat(ws):
    hb.write_heartbeat(ws.paths, "a", harness="claude-code", status="idle", task="review", ttl_s=90,
                       substrate="Claude", session_id="s1", note="hello", x={"k": 1})
    kept = hb.write_heartbeat(ws.paths, "a")
    assert (kept["harness"], kept["status"], kept["task"], kept["ttl_s"], kept["substrate"], kept["session_id"],
            kept["x"]) == ("claude-code", "idle", "review", 90, "Claude", "s1", {"k": 1})
    assert "note" not in kept
    changed = hb.write_heartbeat(ws.paths, "a", status="sleeping", task=None, ttl_s=None)
    assert changed["status"] == "sleeping" and "task" not in changed and "ttl_s" not in changed
    assert changed["seq"] == 3


def test_a_broken_previous_file_never_sends_seq_back(ws):
    """The broken file's seq is lost; the next one is above any it can have held (heartbeat.recovered_seq)."""
    import time

    floor = int(time.time() * 1000)
    ws.paths.heartbeat("a").write_text("{garbage")
    first = hb.write_heartbeat(ws.paths, "a")["seq"]
    assert first >= floor
    ws.paths.heartbeat("a").write_text(json.dumps({"seq": "7", "status": "weird"}))
    doc = hb.write_heartbeat(ws.paths, "a")
    assert doc["seq"] >= first and doc["status"] == "active"
    assert hb.write_heartbeat(ws.paths, "a")["seq"] == doc["seq"] + 1


@pytest.mark.parametrize("kwargs", [{"status": "busy"}, {"ttl_s": 0}, {"ttl_s": -5}, {"ttl_s": "10"},
                                    {"task": "t" * 4097}, {"note": "n" * 4097}])
def test_bad_input_is_refused_before_writing(ws, kwargs):
    with pytest.raises(UsageError):
        hb.write_heartbeat(ws.paths, "a", **kwargs)
    assert not ws.paths.heartbeat("a").exists()


@pytest.mark.parametrize("agent", ["../evil", "..", "a/b", "", ".x", "a\n"])
def test_bad_agent_ids_never_touch_the_disk(ws, agent):
    before = sorted(p.name for p in ws.root.rglob("*"))
    with pytest.raises(UsageError):
        hb.write_heartbeat(ws.paths, agent)
    assert sorted(p.name for p in ws.root.rglob("*")) == before


def test_read_heartbeat_never_raises(ws):
    missing = hb.read_heartbeat(ws.paths.heartbeats / "nobody.json")
    assert not missing.valid and missing.errors[0]["message"] == "no heartbeat file"
    (ws.paths.heartbeats / "bin.json").write_bytes(b"\x00\xff\xfe")
    assert "not valid JSON" in hb.read_heartbeat(ws.paths.heartbeats / "bin.json").errors[0]["message"]
    (ws.paths.heartbeats / "list.json").write_text("[]")
    listed = hb.read_heartbeat(ws.paths.heartbeats / "list.json")
    assert listed.doc is None and listed.errors[0]["message"] == "[] is not of type 'object'"
    hb.write_heartbeat(ws.paths, "ok")
    good = hb.read_heartbeat(ws.paths.heartbeat("ok"))
    assert good.valid and good.agent_id == "ok"


def test_iter_heartbeat_paths_skips_temp_and_other_files(ws):
    for name in ("b.json", "a.json", ".tmp-a.json.1.x.tmp", "c.json.tmp", "notes.txt", ".hidden.json"):
        (ws.paths.heartbeats / name).write_text("{}")
    assert [p.name for p in hb.iter_heartbeat_paths(ws.paths.heartbeats)] == ["a.json", "b.json"]
    assert hb.iter_heartbeat_paths(ws.root / "nothing") == []


BEATER = """
import sys
from synapolis.paths import StatePaths
from synapolis.heartbeat import write_heartbeat
paths = StatePaths(__import__("pathlib").Path(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    print(write_heartbeat(paths, "shared")["seq"], flush=True)
"""


def test_concurrent_beats_of_one_agent_never_share_a_seq(ws):
    procs = [subprocess.Popen([sys.executable, "-c", BEATER, str(ws.root), "40"], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    seqs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        seqs += [int(line) for line in out.split()]
    assert sorted(seqs) == list(range(1, 121))
    assert json.loads(ws.paths.heartbeat("shared").read_text())["seq"] == 120


# ---- `synapolis beat`

def test_cli_beat_json_and_text(cli, state_dir):
    result = cli("beat", "--agent-id", "alice", "--task", "fix #12", "--ttl", "90", "--status", "idle", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["pending_signals"] == []
    assert data["heartbeat"]["seq"] == 1 and data["heartbeat"]["task"] == "fix #12"
    assert data["heartbeat"]["ttl_s"] == 90 and data["heartbeat"]["status"] == "idle"
    assert json.loads((state_dir / "heartbeats" / "alice.json").read_text()) == data["heartbeat"]
    assert (state_dir / "synapolis.json").is_file()  # a verb that writes creates the state directory
    again = cli("beat", "--agent-id", "alice")
    assert again.returncode == 0 and "seq=2" in again.stdout


def test_cli_beat_identity_from_env(cli, state_dir):
    result = cli("beat", "--json", env={"SYNAPOLIS_AGENT_ID": "envy"})
    assert result.returncode == 0 and json.loads(result.stdout)["heartbeat"]["agent_id"] == "envy"


@pytest.mark.parametrize("args,code,error_type", [
    ([], 4, "NoIdentityError"),
    (["--agent-id", ""], 2, "UsageError"),
    (["--agent-id", "../escape"], 2, "UsageError"),
    (["--agent-id", "a", "--status", "busy"], 2, "UsageError"),
    (["--agent-id", "a", "--ttl", "0"], 2, "UsageError"),
    (["--agent-id", "a", "--ttl", "soon"], 2, "UsageError"),
    (["--agent-id", "a", "--task", "t" * 5000], 2, "UsageError"),
])
def test_cli_beat_errors(cli, state_dir, args, code, error_type):
    result = cli("beat", *args, "--json")
    assert result.returncode == code
    assert json.loads(result.stdout)["error"]["type"] == error_type
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    heartbeats = state_dir / "heartbeats"
    assert not heartbeats.exists() or os.listdir(heartbeats) == []
    assert not (state_dir.parent / "escape.json").exists()


def _stamp_variants(count: int = 30_000) -> list[str]:
    """Timestamps near the heartbeat's shape: good ones, each broken by a few random edits (other scripts'
    digits, a newline, a 24th hour, ten fraction digits...)."""
    import random

    rnd = random.Random(15)
    seeds = ["2026-12-02T03:21:00Z", "2026-12-02T23:59:59.123456789Z", "2026-12-02T24:00:00Z", "2026-12-02T19:60:00Z",
             "2026-12-02T03:21:00.Z", "2026-12-02T03:21:00.1234567890Z", "2026-12-02T03:21:00Z\n", "2024-02-29T00:00:00Z",
             "2023-02-29T00:00:00.5Z", "0000-01-01T00:00:00Z", "\u0662026-12-02T03:21:00Z", "2026-12-02T03:21:00.\u0661Z"]
    stamps = list(seeds)
    for _ in range(count):
        chars = list(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(chars))
            roll = rnd.random()
            if roll < 0.6:
                chars[at] = rnd.choice("0123456789-T:.Z z\u0662\uff12\u00b2x\n")
            elif roll < 0.8:
                del chars[at]
            else:
                chars.insert(at, rnd.choice("0123456789.Z\u0662"))
        stamps.append("".join(chars))
    return stamps


def test_a_stamp_checked_by_hand_is_checked_as_the_pattern_and_parse_ts_check_it(monkeypatch):
    """The first stamps of a process are checked without compiling the pattern (start-up), the rest with it;
    either way _ts_ok agrees with the regular expression and timeutil.parse_ts on every variant. (The hand
    check itself is held to the pattern on each ASCII variant.)"""
    import re

    from synapolis.timeutil import parse_ts

    def reference(value) -> bool:
        if not re.fullmatch(hb._UTC_TS_PATTERN, value):
            return False
        try:
            parse_ts(value)
        except ValueError:
            return False
        return True

    stamps = _stamp_variants()
    plain = [s for s in stamps if s.isascii()]
    other = [s for s in stamps if not s.isascii()]
    assert len(other) > 200  # the control: other scripts' digits were tried
    expected = {stamp: reference(stamp) for stamp in stamps}
    # by hand: every ASCII stamp, and the pattern is never compiled
    monkeypatch.setattr(hb, "_ts_shape", None)
    monkeypatch.setattr(hb, "_hand_checks_left", len(stamps))
    assert [hb._ts_ok(s) for s in plain] == [expected[s] for s in plain]
    assert hb._ts_shape is None
    # text that is not ASCII compiles it (its \d takes other scripts' digits); so does a spent budget
    assert [hb._ts_ok(s) for s in other] == [expected[s] for s in other]
    assert hb._ts_shape is not None
    monkeypatch.setattr(hb, "_ts_shape", None)
    monkeypatch.setattr(hb, "_hand_checks_left", 0)
    assert [hb._ts_ok(s) for s in stamps] == [expected[s] for s in stamps]
    assert hb._ts_shape is not None
    for stamp in plain:
        assert hb._shape_by_hand(stamp) == bool(re.fullmatch(hb._UTC_TS_PATTERN, stamp)), stamp
    answers = list(expected.values())
    assert sum(answers) > 200 and len(answers) - sum(answers) > 200  # both answers were tried
    assert hb._ts_ok(None) is False and hb._ts_ok(20261202) is False
