"""Names (contract §2): agent ids, session ids, claim items, generated ids; a bad name never becomes a path."""

from __future__ import annotations

import hashlib
import re

import pytest

from synapolis.errors import UsageError
from synapolis.names import (generate_agent_id, generate_session_id, is_subagent_of, slugify, validate_agent_id,
                             validate_claim_item, validate_session_id)
from synapolis.paths import StatePaths


@pytest.mark.parametrize("name", ["a", "alice", "A-1_b", "ariel_1a2b3c4d_4f9a.popper.critic", "x" * 128, "1.2.3"])
def test_good_agent_ids(name):
    assert validate_agent_id(name) == name


@pytest.mark.parametrize("name,rule", [
    ("", "empty"), (".", "'.' or '..'"), ("..", "'.' or '..'"), ("../etc/passwd", "breaks the rule"),
    ("a/b", "breaks the rule"), ("a\\b", "breaks the rule"), (".hidden", "empty dot-segment"),
    ("trailing.", "empty dot-segment"), ("a..b", "empty dot-segment"), ("x" * 129, "longer than 128"),
    ("a b", "breaks the rule"), ("émile", "breaks the rule"), ("a\n", "breaks the rule"), ("a\x00", "breaks the rule"),
    (None, "empty"), (42, "empty"),
])
def test_bad_agent_ids_name_the_rule(name, rule):
    with pytest.raises(UsageError) as err:
        validate_agent_id(name)
    assert rule in err.value.message
    assert err.value.exit_code == 2


def test_a_huge_name_is_shortened_in_the_message():
    with pytest.raises(UsageError) as err:
        validate_agent_id("z" * 100_000)
    assert len(err.value.message) < 200


@pytest.mark.parametrize("name", ["20250101_120000_deadbeef", "s", "a.b", ".hidden", "x" * 128])
def test_good_session_ids(name):
    assert validate_session_id(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "x" * 129, "a b"])
def test_bad_session_ids(name):
    with pytest.raises(UsageError):
        validate_session_id(name)


@pytest.mark.parametrize("item", ["src/api/users.py", "ticket:142", "a", "user@host", "v1.2+build", "a/b.c/d",
                                  "x" * 200, "a/.hidden", "a...b",
                                  # contract §2 widened (§14): path patterns and dot-files
                                  ".github/workflows/ci.yml", "src/api/**", "src/*.py", "**/*.md", "src/[ab]?.py",
                                  "src/api/", ".x", "**", "ticket:[1"])
def test_good_claim_items(item):
    assert validate_claim_item(item) == item


@pytest.mark.parametrize("item,rule", [
    ("", "empty"), ("../x", "'..' segment"), ("a/../b", "'..' segment"), ("a/..", "'..' segment"), ("a//b", "'//'"),
    ("/abs", "rule"), ("./x", "'.' or '..' segment"), ("a/./b", "'.' or '..' segment"), ("-x", "rule"),
    ("src/[ab", "never closed"), ("src/[z-a].py", "range z-a"), ("a!b", "rule"), ("a^b", "rule"), ("x" * 201, "longer than 200"), ("a b", "rule"),
    ("a\\b", "rule"), ("a\x00", "rule"),
])
def test_bad_claim_items(item, rule):
    with pytest.raises(UsageError) as err:
        validate_claim_item(item)
    assert rule in err.value.message


def test_paths_refuse_bad_names_before_they_become_paths(tmp_path):
    paths = StatePaths(tmp_path)
    for bad in ("../../etc/passwd", "..", "a/b", ""):
        with pytest.raises(UsageError):
            paths.heartbeat(bad)
        with pytest.raises(UsageError):
            paths.escalation(bad)
    with pytest.raises(UsageError):
        paths.session_dir("../up")
    assert paths.heartbeat("a.b") == tmp_path / "heartbeats" / "a.b.json"
    assert paths.escalation("@global") == tmp_path / "escalations" / "@global.json"


def test_subagents():
    assert is_subagent_of("ariel.popper.critic", "ariel.popper")
    assert is_subagent_of("ariel.popper", "ariel")
    assert not is_subagent_of("ariel", "ariel")
    assert not is_subagent_of("arielle.x", "ariel")


@pytest.mark.parametrize("text,slug", [("Claude Sonnet 4.6", "claude_sonnet_4_6"), ("  --Gemini--CLI!! ", "gemini_cli"),
                                       ("x" * 40, "x" * 24), ("ÄÖÜ", "agent"), (None, "agent"),
                                       ("a" * 23 + " b", "a" * 23)])
def test_slugify(text, slug):
    assert slugify(text) == slug


def test_generated_agent_ids():
    digest = hashlib.sha256(b"conv-1").hexdigest()
    hooked = generate_agent_id("Claude Sonnet 4.6", "claude-code", "conv-1", deterministic=True)
    assert hooked == f"claude_sonnet_4_6_{digest[:8]}_{digest[8:12]}"
    assert generate_agent_id(None, "Claude Code", "conv-1", deterministic=True) == f"claude_code_{digest[:8]}_{digest[8:12]}"
    randomized = {generate_agent_id("s", None, "conv-1") for _ in range(20)}
    assert all(r.startswith(f"s_{digest[:8]}_") for r in randomized) and len(randomized) > 1
    anonymous = generate_agent_id("s", None)
    assert re.fullmatch(r"s_[0-9a-f]{8}_[0-9a-f]{4}", anonymous)
    for made in randomized | {hooked, anonymous}:
        assert validate_agent_id(made) == made


def test_generated_session_id():
    made = generate_session_id()
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]{8}", made)
    assert validate_session_id(made) == made

