"""The effective-status rules of contract §6 at their boundaries (status.effective_status, pure)."""

from __future__ import annotations

import pytest

from conftest import NOW, ago, heartbeat_doc
from synapolis.status import effective_status

T = {"stale_after_s": 300, "dead_after_s": 3600, "clock_skew_s": 120}


def judge(age_s, previous=None, **fields):
    doc = heartbeat_doc("a", ago(age_s), **fields)
    return effective_status(doc, NOW, previous=previous, **T)


@pytest.mark.parametrize("declared", ["active", "idle"])
def test_age_equal_to_ttl_is_still_the_declared_status(declared):
    assert judge(300, status=declared).effective_status == declared


@pytest.mark.parametrize("declared", ["active", "idle"])
def test_just_over_ttl_is_stale(declared):
    assert judge(300.001, status=declared).effective_status == "stale"


def test_dead_boundary_is_dead_after_s_when_larger_than_twice_ttl():
    assert judge(3600).effective_status == "stale"
    assert judge(3600.001).effective_status == "dead"


def test_ttl_override_moves_both_boundaries():
    # ttl 1000: stale after 1000, dead after max(3600, 2000) = 3600
    assert judge(1000, ttl_s=1000).effective_status == "active"
    assert judge(1000.5, ttl_s=1000).effective_status == "stale"
    assert judge(3600, ttl_s=1000).effective_status == "stale"
    assert judge(3601, ttl_s=1000).effective_status == "dead"
    # ttl 3000: dead after max(3600, 6000) = 6000
    assert judge(5999, ttl_s=3000).effective_status == "stale"
    assert judge(6000, ttl_s=3000).effective_status == "stale"
    assert judge(6000.5, ttl_s=3000).effective_status == "dead"
    # a short ttl: stale early, dead still only after dead_after_s
    assert judge(11, ttl_s=10).effective_status == "stale"
    assert judge(3599, ttl_s=10).effective_status == "stale"


def test_fractional_ttl():
    assert judge(0.5, ttl_s=0.5).effective_status == "active"
    assert judge(0.6, ttl_s=0.5).effective_status == "stale"


@pytest.mark.parametrize("declared", ["stopped", "sleeping"])
@pytest.mark.parametrize("age", [0, 301, 3601, 10 ** 8])
def test_declared_stopped_or_sleeping_is_never_stale(declared, age):
    verdict = judge(age, status=declared)
    assert verdict.effective_status == declared
    assert verdict.age_s == pytest.approx(age)


def test_no_document_is_invalid():
    assert effective_status(None, NOW, **T).effective_status == "invalid"


def test_future_beat_within_skew_is_trusted():
    verdict = judge(-120)
    assert verdict.effective_status == "active"
    assert verdict.anomalies == []
    assert verdict.age_s == -120


def test_clock_skew_first_sight_counts_from_now():
    verdict = judge(-121, seq=7)
    assert verdict.anomalies == ["clock_skew"]
    assert verdict.effective_status == "active"
    assert verdict.age_s == 0
    assert verdict.seq_first_seen_at == ago(0)


def test_clock_skew_same_seq_goes_stale_by_the_monitors_clock():
    previous = {"agent_id": "a", "seq": 7, "seq_first_seen_at": ago(301)}
    verdict = judge(-3600, previous=previous, seq=7)  # its clock runs an hour ahead
    assert verdict.anomalies == ["clock_skew"]
    assert verdict.effective_status == "stale"
    assert verdict.age_s == 301
    assert verdict.seq_first_seen_at == ago(301)
    previous["seq_first_seen_at"] = ago(3601)
    assert judge(-3600, previous=previous, seq=7).effective_status == "dead"


def test_clock_skew_new_seq_restarts_the_clock():
    previous = {"agent_id": "a", "seq": 7, "seq_first_seen_at": ago(5000)}
    verdict = judge(-3600, previous=previous, seq=8)
    assert verdict.effective_status == "active"
    assert verdict.seq_first_seen_at == ago(0)


def test_first_seen_in_the_future_is_not_trusted():
    previous = {"agent_id": "a", "seq": 7, "seq_first_seen_at": ago(-9999)}
    verdict = judge(-3600, previous=previous, seq=7)
    assert verdict.seq_first_seen_at == ago(0)
    assert verdict.age_s == 0


def test_seq_first_seen_carried_without_skew_too():
    previous = {"agent_id": "a", "seq": 3, "seq_first_seen_at": ago(50)}
    assert judge(60, previous=previous, seq=3).seq_first_seen_at == ago(50)
    assert judge(60, previous=previous, seq=4).seq_first_seen_at == ago(0)
