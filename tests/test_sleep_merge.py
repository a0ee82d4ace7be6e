"""The pure parts of consensus sleep: memory parsing, the merge, the ledger's skip rules, its schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pytest

from synapolis import sleep
from synapolis.atomic import read_jsonl
from synapolis.errors import UsageError
from synapolis.paths import StatePaths
from synapolis.schemas import validation_errors

T0 = datetime(2026, 6, 2, 10, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry(text, agent, seconds=0, key=None, tags=()):
    e = {"text": text, "agent_id": agent, "created_at": at(seconds), "tags": list(tags)}
    if key is not None:
        e["key"] = key
    return e


# --- parse_memories --------------------------------------------------------------------------------

def test_parse_array_of_strings_and_objects():
    got = sleep.parse_memories(json.dumps(["use uv", {"text": " DB is postgres ", "key": "db", "tags": ["infra", "db", "db"]}]))
    assert got == [{"text": "use uv", "tags": []}, {"text": "DB is postgres", "key": "db", "tags": ["db", "infra"]}]


def test_parse_json_lines():
    text = '"first"\n\n{"text": "second", "tags": ["x"]}\r\n{"text": "third", "key": "k"}\n'
    assert [m["text"] for m in sleep.parse_memories(text)] == ["first", "second", "third"]


def test_parse_single_object_and_bom_and_bytes():
    assert sleep.parse_memories('{"text": "one"}') == [{"text": "one", "tags": []}]
    assert sleep.parse_memories("\ufeff[\"x\"]") == [{"text": "x", "tags": []}]
    assert sleep.parse_memories(b"\xef\xbb\xbf[\"y\"]") == [{"text": "y", "tags": []}]


def test_parse_empty_is_zero_memories():
    assert sleep.parse_memories("") == []
    assert sleep.parse_memories("  \n\n") == []
    assert sleep.parse_memories("[]") == []


@pytest.mark.parametrize("bad", [
    "not json at all",
    "{broken",
    '[1, 2]',
    '42',
    'null',
    'true',
    '[["nested"]]',
    '{"text": ""}',
    '{"text": "   "}',
    '{"text": 5}',
    '{"note": "no text"}',
    '{"text": "x", "extra": 1}',
    '{"text": "x", "key": ""}',
    '{"text": "x", "key": 7}',
    '{"text": "x", "tags": "one"}',
    '{"text": "x", "tags": [""]}',
    '{"text": "x", "tags": [1]}',
    '"ok"\n{broken line',
    '"ok"\n[1]',
    '["\\ud800 lone surrogate"]',
    '[' * 100000 + ']' * 100000,
])
def test_parse_refuses_everything_else(bad):
    with pytest.raises(UsageError) as info:
        sleep.parse_memories(bad)
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message


def test_parse_names_the_bad_line():
    with pytest.raises(UsageError, match="line 3"):
        sleep.parse_memories('"a"\n"b"\n{"text": 1}\n')


def test_parse_limits():
    with pytest.raises(UsageError, match="longer than"):
        sleep.parse_memories(json.dumps(["x" * (sleep.MAX_TEXT_BYTES + 1)]))
    with pytest.raises(UsageError, match="more than"):
        sleep.parse_memories(json.dumps(["m"] * (sleep.MAX_MEMORIES + 1)))
    with pytest.raises(UsageError, match="larger than"):
        sleep.parse_memories(b" " * (sleep.MAX_INPUT_BYTES + 1))
    with pytest.raises(UsageError, match="at most"):
        sleep.parse_memories(json.dumps([{"text": "x", "key": "k" * 201}]))
    with pytest.raises(UsageError, match="tags"):
        sleep.parse_memories(json.dumps([{"text": "x", "tags": [f"t{i}" for i in range(33)]}]))
    with pytest.raises(UsageError):
        sleep.parse_memories(b"\xff\xfe not utf-8")


def test_check_memories_for_library_callers():
    assert sleep.check_memories(["a", {"text": "b", "key": None}]) == [
        {"text": "a", "tags": []}, {"text": "b", "tags": []}]
    with pytest.raises(UsageError):
        sleep.check_memories("a")


# --- merge_memories --------------------------------------------------------------------------------

def test_normalise_case_space_and_unicode():
    assert sleep.normalise("  Use   UV\tfor\nPython ") == "use uv for python"
    assert sleep.normalise("STRASSE") == sleep.normalise("straße")
    assert sleep.normalise("caf\u00e9") == sleep.normalise("cafe\u0301")


def test_case_and_space_variants_collapse_with_sources_and_tags():
    merged = sleep.merge_memories([
        entry("Use uv for Python", "bob", 1, tags=["tooling"]),
        entry("use  UV for python ", "alice", 2, tags=["python", "tooling"]),
        entry("USE UV FOR PYTHON", "bob", 3),
    ], T0)
    assert len(merged) == 1
    line = merged[0]
    assert line["sources"] == ["alice", "bob"]
    assert line["tags"] == ["python", "tooling"]
    assert line["norm"] == "use uv for python"
    assert line["text"] == "USE UV FOR PYTHON"          # the newest spelling
    assert line["created_at"] == at(3)
    assert "key" not in line and "superseded" not in line


def test_different_texts_stay_apart_in_time_order():
    merged = sleep.merge_memories([entry("b later", "x", 5), entry("a earlier", "y", 1), entry("a earlier!", "y", 2)], T0)
    assert [m["text"] for m in merged] == ["a earlier", "a earlier!", "b later"]


def test_key_keeps_newest_value_whatever_the_input_order():
    entries = [
        entry("db is mysql", "carol", 30, key="db", tags=["old"]),
        entry("db is postgres", "alice", 50, key="db", tags=["infra"]),
        entry("DB is MySQL", "bob", 10, key="db"),
    ]
    for order in (entries, entries[::-1]):
        (line,) = sleep.merge_memories(order, T0)
        assert line["key"] == "db"
        assert line["text"] == "db is postgres"
        assert line["sources"] == ["alice", "bob", "carol"]
        assert line["tags"] == ["infra", "old"]
        assert line["superseded"] == [{"text": "db is mysql", "sources": ["bob", "carol"], "created_at": at(30)}]


def test_key_tie_goes_to_the_later_entry():
    (line,) = sleep.merge_memories([entry("v1", "a", 0, key="k"), entry("v2", "a", 0, key="k")], T0)
    assert line["text"] == "v2"


def test_keyed_and_unkeyed_same_text_are_different_memories():
    merged = sleep.merge_memories([entry("port is 8080", "a", 0, key="port"), entry("port is 8080", "b", 1)], T0)
    assert len(merged) == 2
    assert merged[0]["id"] != merged[1]["id"]


def test_merge_is_pure_and_deterministic():
    entries = [entry("x", "a", 1, tags=["t"]), entry("X", "b", 2)]
    snapshot = json.dumps(entries, sort_keys=True)
    first = sleep.merge_memories(entries, T0)
    assert sleep.merge_memories(entries, T0) == first
    assert json.dumps(entries, sort_keys=True) == snapshot
    assert first[0]["merged_at"] == "2026-06-02T10:00:00.000000Z"


def test_merge_of_nothing_is_nothing():
    assert sleep.merge_memories([], T0) == []


def test_merged_lines_satisfy_the_ledger_schema():
    merged = sleep.merge_memories([
        entry("a", "alice", 0, key="k", tags=["t"]), entry("b", "bob.sub", 1, key="k"), entry("free text", "bob", 2)], T0)
    for line in merged:
        line = {**line, "session_id": "20260602_100000_abcdef01", "merged_by": "bob"}
        assert validation_errors("ledger", line) == []
    assert validation_errors("ledger", {**merged[0], "surprise": 1}) != []


# --- the ledger ------------------------------------------------------------------------------------

def test_append_skips_what_the_ledger_holds(tmp_path):
    paths = StatePaths(tmp_path)
    first = sleep.merge_memories([entry("Use uv", "a", 0), entry("db is pg", "a", 1, key="db")], T0)
    written, held = sleep.append_to_ledger(paths, first, session_id="s1", merged_by="a")
    assert (len(written), len(held)) == (2, 0)
    # the same memories again, spelled differently: nothing new
    again = sleep.merge_memories([entry("USE  UV", "b", 5), entry("DB is PG", "b", 6, key="db")], T0)
    written, held = sleep.append_to_ledger(paths, again, session_id="s2", merged_by="b")
    assert (len(written), len(held)) == (0, 2)
    lines = read_jsonl(paths.memory_ledger)
    assert len(lines) == 2
    assert all(validation_errors("ledger", line) == [] for line in lines)
    assert {line["session_id"] for line in lines} == {"s1"}


def test_keyed_value_change_appends_and_older_value_does_not(tmp_path):
    paths = StatePaths(tmp_path)
    sleep.append_to_ledger(paths, sleep.merge_memories([entry("db is pg", "a", 10, key="db")], T0),
                           session_id="s1", merged_by="a")
    newer = sleep.merge_memories([entry("db is sqlite", "b", 20, key="db")], T0)
    assert len(sleep.append_to_ledger(paths, newer, session_id="s2", merged_by="b")[0]) == 1
    older = sleep.merge_memories([entry("db is mysql", "c", 5, key="db")], T0)
    written, held = sleep.append_to_ledger(paths, older, session_id="s3", merged_by="c")
    assert (written, len(held)) == ([], 1)
    current = {}
    for line in read_jsonl(paths.memory_ledger):
        current[line["key"]] = line["text"]
    assert current == {"db": "db is sqlite"}


def test_ledger_survives_a_torn_last_line(tmp_path):
    paths = StatePaths(tmp_path)
    sleep.append_to_ledger(paths, sleep.merge_memories([entry("one", "a", 0)], T0), session_id="s", merged_by="a")
    with open(paths.memory_ledger, "ab") as handle:   # a writer killed mid-line
        handle.write(b'{"schema_version": 1, "text": "tw')
    written, _ = sleep.append_to_ledger(paths, sleep.merge_memories([entry("one", "b", 1), entry("two", "b", 2)], T0),
                                        session_id="s", merged_by="b")
    assert [w["text"] for w in written] == ["two"]
    assert [line["text"] for line in read_jsonl(paths.memory_ledger)] == ["one", "two"]


def test_ledger_appends_from_many_processes_never_double(tmp_path):
    """Four processes append the same memories at once: each memory lands exactly once."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_append_worker, args=(str(tmp_path), i, start)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    norms = sorted(line["norm"] for line in read_jsonl(StatePaths(tmp_path).memory_ledger))
    assert norms == sorted(f"memory {n}" for n in range(20))


def _append_worker(root, index, start):
    start.wait(20)
    memories = [entry(f"Memory {n}" if index % 2 else f"memory  {n}", f"agent{index}", n) for n in range(20)]
    sleep.append_to_ledger(StatePaths(Path(root)), sleep.merge_memories(memories, T0), session_id="s", merged_by=f"agent{index}")
    os._exit(0)


def test_ledger_reader_reads_only_what_is_new(tmp_path):
    paths = StatePaths(tmp_path)
    reader = sleep.LedgerReader(paths.memory_ledger)
    assert reader.catch_up().norms == set()                      # no ledger yet
    sleep.append_to_ledger(paths, sleep.merge_memories([entry("one", "a", 0)], T0), session_id="s", merged_by="a")
    assert reader.catch_up().norms == {"one"}
    first_offset = reader.offset
    with open(paths.memory_ledger, "ab") as handle:              # a writer killed mid-line
        handle.write(b'{"norm": "tor')
    assert reader.catch_up().norms == {"one"} and reader.offset == first_offset
    # another process appends (append_jsonl starts a fresh line after the fragment)
    sleep.append_to_ledger(paths, sleep.merge_memories([entry("two", "b", 1)], T0), session_id="s", merged_by="b")
    assert reader.catch_up().norms == {"one", "two"}
    # a pre-read reader used for the append sees what came after it and skips it
    written, held = sleep.append_to_ledger(paths, sleep.merge_memories([entry("TWO", "c", 2), entry("three", "c", 3)], T0),
                                           session_id="s", merged_by="c", reader=reader)
    assert [w["norm"] for w in written] == ["three"] and [h["norm"] for h in held] == ["two"]
    # the ledger replaced by a shorter file (rotated by hand): read afresh
    paths.memory_ledger.write_text(json.dumps({"norm": "fresh start", "text": "Fresh start"}) + "\n")
    assert reader.catch_up().norms == {"fresh start"}


def test_new_ledger_lines_is_pure():
    held_line = {"text": "A", "norm": "a"}
    merged = sleep.merge_memories([entry("a", "x", 0), entry("b", "x", 1)], T0)
    fresh, held = sleep.new_ledger_lines(merged, [held_line, {"text": "no norm but text"}, {"junk": 1}])
    assert [f["norm"] for f in fresh] == ["b"] and [h["norm"] for h in held] == ["a"]
