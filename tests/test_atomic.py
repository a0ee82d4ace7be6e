"""atomic.py: whole-file replacement, locked appends from many processes, locks, temp-file hygiene."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from synapolis import atomic


def test_atomic_write_json_creates_and_replaces_leaving_no_temp(tmp_path):
    target = tmp_path / "deep" / "doc.json"
    atomic.atomic_write_json(target, {"a": 1})
    atomic.atomic_write_json(target, {"a": 2, "text": "ünïcode"})
    assert atomic.read_json(target) == {"a": 2, "text": "ünïcode"}
    assert os.listdir(target.parent) == ["doc.json"]


def _rewrite_failing_in(step: str, target, monkeypatch) -> OSError:
    """Write {"v": "old"} to `target`, then try {"v": "new"} with `atomic.os.<step>` failing as a full disk
    does; the OSError the write raised."""
    atomic.atomic_write_json(target, {"v": "old"})

    def full_disk(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(atomic.os, step, full_disk)
    with pytest.raises(OSError) as raised:
        atomic.atomic_write_json(target, {"v": "new"})
    monkeypatch.undo()
    return raised.value


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    _rewrite_failing_in("replace", target, monkeypatch)
    assert atomic.read_json(target) == {"v": "old"}
    assert os.listdir(tmp_path) == ["doc.json"]


def test_a_failed_write_keeps_the_old_file_and_names_the_target(tmp_path, monkeypatch):
    target = tmp_path / "doc.json"
    raised = _rewrite_failing_in("write", target, monkeypatch)
    assert raised.errno == 28 and raised.filename == str(target)
    assert atomic.read_json(target) == {"v": "old"}
    assert os.listdir(tmp_path) == ["doc.json"]


def test_folders_are_made_when_missing_and_a_file_in_their_place_is_refused(tmp_path):
    # the folder is made only when opening in it fails (no makedirs on every write or lock)
    with atomic.locked(tmp_path / "locks" / "a.lock"):
        assert (tmp_path / "locks" / "a.lock").is_file()
    (tmp_path / "taken").write_text("a file where a folder belongs")
    with pytest.raises(FileExistsError):
        atomic.atomic_write_json(tmp_path / "taken" / "doc.json", {"a": 1})
    with pytest.raises(FileExistsError):
        with atomic.locked(tmp_path / "taken" / "a.lock"):
            pass
    assert (tmp_path / "taken").read_text() == "a file where a folder belongs"
    assert sorted(os.listdir(tmp_path)) == ["locks", "taken"]


def test_unserializable_documents_write_nothing(tmp_path):
    target = tmp_path / "doc.json"
    with pytest.raises(TypeError):
        atomic.atomic_write_json(target, {"x": object()})
    assert not target.exists() and os.listdir(tmp_path) == []


def test_read_json_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic.read_json(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError):
        atomic.read_json(tmp_path / "broken.json")
    (tmp_path / "latin1.json").write_bytes(b'"\xff"')
    with pytest.raises(ValueError):
        atomic.read_json(tmp_path / "latin1.json")
    assert atomic.read_json_or(tmp_path / "broken.json", "fallback") == "fallback"
    assert atomic.read_json_or(tmp_path / "missing.json") is None


def _appender(path, worker, count):
    for i in range(count):
        atomic.append_jsonl(path, {"worker": worker, "i": i, "pad": "x" * 3000})


def test_appends_from_many_processes_stay_whole_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(path, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]  # every line parses
    assert len(records) == 240
    for w in range(4):
        assert [r["i"] for r in records if r["worker"] == w] == list(range(60))


def test_a_torn_last_line_is_skipped_and_the_next_append_starts_fresh(tmp_path):
    path = tmp_path / "log.jsonl"
    atomic.append_jsonl(path, {"n": 1})
    with open(path, "ab") as handle:
        handle.write(b'{"n": 2, "tor')  # a writer killed mid-line
    atomic.append_jsonl(path, {"n": 3}, {"n": 4})
    assert atomic.read_jsonl(path) == [{"n": 1}, {"n": 3}, {"n": 4}]
    with open(path, "ab") as handle:
        handle.write(b"[1, 2]\nnot json\n\xff\xfe\n")
    assert atomic.read_jsonl(path) == [{"n": 1}, {"n": 3}, {"n": 4}]
    assert atomic.read_jsonl(tmp_path / "missing.jsonl") == []


HOLDER = """
import sys, time
from synapolis.atomic import locked
with locked(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_lock_nonblocking_sees_another_process(tmp_path):
    lock = tmp_path / ".locks" / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with atomic.locked(lock, blocking=False) as got:
            assert got is False
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
        with atomic.locked(lock, blocking=False) as got:
            assert got is True
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_lock_dies_with_its_holder(tmp_path):
    lock = tmp_path / "y.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=30)
    with atomic.locked(lock, blocking=False) as got:
        assert got is True


@pytest.mark.parametrize("name,temp", [(".tmp-a.json.1.ab.tmp", True), ("a.json.tmp", True), (".tmp-x", True),
                                       ("a.json", False), ("tmp.json", False), ("a.tmp.json", False)])
def test_temp_names(name, temp):
    assert atomic.is_temp_name(name) is temp


def test_sweep_removes_only_old_temp_files(tmp_path):
    sub = tmp_path / "heartbeats"
    sub.mkdir()
    old = sub / ".tmp-a.json.1.ab.tmp"
    fresh = sub / ".tmp-b.json.2.cd.tmp"
    keep = sub / "a.json"
    for path in (old, fresh, keep):
        path.write_text("x")
    hour_ago = time.time() - 3601
    os.utime(old, (hour_ago, hour_ago))
    os.utime(keep, (hour_ago, hour_ago))
    removed = atomic.sweep_temp_files(tmp_path, older_than_s=3600)
    assert removed == [old]
    assert sorted(os.listdir(sub)) == sorted([fresh.name, keep.name])
    assert atomic.sweep_temp_files(tmp_path / "missing") == []
