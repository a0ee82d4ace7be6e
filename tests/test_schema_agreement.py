"""heartbeat.quick_check (the hand mirror used on hot paths) agrees with jsonschema on many documents."""

from __future__ import annotations

import json
import random

import pytest

from synapolis.heartbeat import OPTIONAL, REQUIRED, quick_check, read_heartbeat
from synapolis.schemas import load_schema, validation_errors

SEED = 20300101
ROUNDS = 3000

GOOD_VALUES = {
    "schema_version": [1],
    "agent_id": ["a", "ariel_1a2b3c4d_4f9a.popper.critic", "A-1_b", "x" * 128],
    "harness": ["claude-code", "h", "x" * 128, "with space", "ü"],
    "status": ["active", "idle", "sleeping", "stopped"],
    "beat_at": ["2030-01-01T00:00:00Z", "2030-12-31T23:59:59.123456Z", "2024-02-29T12:00:00.1Z",
                "1999-01-01T00:00:00.123456789Z"],
    "seq": [1, 2, 10 ** 12],
    "substrate": ["", "Claude Sonnet 4.6", "x" * 128],
    "session_id": ["20250101_120000_deadbeef", "s", ".hidden", "a..b", "x" * 128],
    "started_at": ["2030-01-01T00:00:00Z"],
    "ttl_s": [1, 0.5, 86400, 1e-9],
    "task": ["", "fix #12", "t" * 4096],
    "note": ["", "n" * 4096],
    "host": ["", "h" * 255],
    "pid": [0, 1, 2 ** 31],
    "x": [{}, {"k": [1, None]}],
}

# values of every JSON type plus near misses of each field's rules
JUNK = [None, True, False, 0, -1, 1, 2, 1.0, 1.5, -0.5, 0.0, "", " ", "x", "ACTIVE", "active ", "\n", [], [1], {},
        {"a": 1}, "x" * 129, "x" * 256, "x" * 4097, ".", "..", "a/b", "a..b", ".a", "a.", "a b", "é",
        "2030-01-01T00:00:00", "2030-01-01T00:00:00+00:00", "2030-01-01 00:00:00Z", "2030-02-30T00:00:00Z",
        "2030-13-01T00:00:00Z", "2030-01-01T24:00:00Z", "2030-01-01T23:60:00Z", "2030-01-01T23:59:60Z",
        "2030-01-01T00:00:00.Z", "2030-01-01T00:00:00.1234567890Z", "2030-1-01T00:00:00Z", "0000-01-01T00:00:00Z",
        "2030-01-01t00:00:00z", "yesterday", 10 ** 20, -(10 ** 20), 2.0, 3.0,
        # near misses of the agent id's pattern (quick_check tests it without a regular expression)
        "a\n", "a.b.", "a-.b", "_.-", "a.b..c", "\u0661\u0662", "A" * 128 + "\n"]


def random_valid(rng: random.Random) -> dict:
    doc = {key: rng.choice(GOOD_VALUES[key]) for key in REQUIRED}
    for key in OPTIONAL:
        if rng.random() < 0.5:
            doc[key] = rng.choice(GOOD_VALUES[key])
    return doc


def mutate(doc: dict, rng: random.Random) -> dict:
    doc = dict(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        move = rng.random()
        keys = list(doc)
        if move < 0.15 and keys:
            doc.pop(rng.choice(keys))
        elif move < 0.25:
            doc[rng.choice(["extra", "Status", "seq ", "x_", "$schema", ""])] = rng.choice(JUNK)
        elif move < 0.9:
            doc[rng.choice(list(REQUIRED) + list(OPTIONAL))] = rng.choice(JUNK)
        else:
            key = rng.choice(list(REQUIRED) + list(OPTIONAL))
            doc[key] = rng.choice(GOOD_VALUES[key])
    return doc


def agree(doc) -> None:
    schema_ok = validation_errors("heartbeat", doc) == []
    assert quick_check(doc) is schema_ok, f"quick_check={not schema_ok} but jsonschema={schema_ok}: {doc!r:.400}"


def test_the_mirror_knows_every_schema_key():
    schema = load_schema("heartbeat")
    assert set(schema["required"]) == set(REQUIRED)
    assert set(schema["properties"]) == set(REQUIRED) | set(OPTIONAL)


def test_agreement_on_generated_valid_documents():
    rng = random.Random(SEED)
    for _ in range(ROUNDS // 3):
        doc = random_valid(rng)
        assert quick_check(doc), doc
        agree(doc)


def test_agreement_on_mutated_documents():
    rng = random.Random(SEED + 1)
    invalid = 0
    for _ in range(ROUNDS):
        doc = mutate(random_valid(rng), rng)
        agree(doc)
        invalid += not quick_check(doc)
    assert invalid > ROUNDS // 2  # the mutations really do break documents


@pytest.mark.parametrize("junk", JUNK, ids=range(len(JUNK)))
@pytest.mark.parametrize("key", list(REQUIRED) + list(OPTIONAL))
def test_agreement_on_every_field_and_every_junk_value(key, junk):
    doc = {"schema_version": 1, "agent_id": "a", "harness": "h", "status": "active",
           "beat_at": "2030-01-01T00:00:00Z", "seq": 1}
    doc[key] = junk
    agree(doc)


@pytest.mark.parametrize("document", [None, [], "text", 1, True, [{"schema_version": 1}]])
def test_agreement_on_non_objects(document):
    agree(document)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_refused_by_the_reader(tmp_path, constant):
    # Python's json module would read these; they are not JSON, and an infinite ttl would never go stale
    path = tmp_path / "a.json"
    path.write_text('{"schema_version": 1, "agent_id": "a", "harness": "h", "status": "active", '
                    f'"beat_at": "2030-01-01T00:00:00Z", "seq": 1, "ttl_s": {constant}}}')
    read = read_heartbeat(path)
    assert not read.valid and read.errors[0]["pointer"] == ""
    assert json.loads(path.read_text())  # (the stdlib alone would have accepted it)
