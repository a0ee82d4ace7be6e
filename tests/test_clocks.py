"""Clocks (issue 11, family 6): one liveness rule, used by every caller, with the same skew handling.

A heartbeat stamped far in the future, or a registry `last_heartbeat` from the future, must not keep an
agent alive forever: not in the monitor, not for claims (take-over and the watchdog's reaping), not in
list-agents or status, not in tired's consensus or start's conflict check, not past the watchdog's stale
flag. Time is a parameter here: files and rows carry written timestamps; nobody sleeps.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from conftest import NOW, ago, set_written_at
from synapolis import actions, claims, overview, sessions, sleep
from synapolis import monitor as mon
from synapolis.errors import ConflictError
from synapolis.identity import Who
from synapolis.status import effective_status, registry_live, status_of_agent, status_of_doc
from synapolis.store import open_session
from synapolis.timeutil import format_ts

DAY = 86400
HOURS_2 = timedelta(hours=2)


def micro(moment) -> str:
    return format_ts(moment, micro=True)


def everyone_says(ws, agent_id: str, now) -> dict:
    """What each caller that judges liveness from a heartbeat file says of `agent_id` at `now`."""
    document = mon.derive_monitor(mon.read_all_heartbeats(ws.paths), None, now, ws.config)
    listed = {e["item"]: e for e in claims.list_claims(ws, now)}
    return {
        "status_of_agent (claims, list-agents)": status_of_agent(ws.paths, agent_id, now, ws.config),
        "monitor": {a["agent_id"]: a for a in document["agents"]}[agent_id]["effective_status"],
        "status screen": {a["agent_id"]: a for a in overview.collect(ws, now=now)["agents"]}[agent_id][
            "effective_status"],
        "claims listing": listed["src/a.py"]["holder_status"] if "src/a.py" in listed else None,
    }


# -- heartbeat files whose clock runs ahead ---------------------------------------------------------------

def test_a_holder_whose_clock_runs_ahead_and_stopped_is_dead_to_every_caller(ws, put_heartbeat):
    claims.claim(ws, "src/a.py", "fast", ttl_s=DAY, now=NOW - HOURS_2)  # a long lease, taken 2 h ago
    put_heartbeat("fast", ago(-DAY), written_at=NOW - HOURS_2)  # stamped a day ahead, written 2 h ago
    said = everyone_says(ws, "fast", NOW)
    assert set(said.values()) == {"dead"}, said
    taken = claims.claim(ws, "src/a.py", "bob", now=NOW)  # take-over ...
    assert taken["claimed_by"] == "bob" and taken.event == "taken_over"
    assert taken["taken_over_from"]["agent_id"] == "fast"


def test_the_watchdog_reaps_the_claim_of_a_dead_holder_whose_clock_runs_ahead(ws, put_heartbeat):
    claims.claim(ws, "src/a.py", "fast", ttl_s=DAY, now=NOW - HOURS_2)
    put_heartbeat("fast", ago(-DAY), written_at=NOW - HOURS_2)
    reaped = claims.reap(ws, now=NOW)
    assert [r["item"] for r in reaped] == ["src/a.py"]
    assert claims.list_claims(ws, NOW)[0]["state"] == "released"


def test_a_holder_whose_clock_runs_ahead_and_still_writes_is_live_to_every_caller(ws, put_heartbeat):
    claims.claim(ws, "src/a.py", "fast", ttl_s=DAY, now=NOW - HOURS_2)
    put_heartbeat("fast", ago(-DAY), written_at=NOW - timedelta(seconds=5))
    said = everyone_says(ws, "fast", NOW)
    assert set(said.values()) == {"active"}, said
    with pytest.raises(ConflictError, match="fast"):
        claims.claim(ws, "src/a.py", "bob", now=NOW)


def test_a_planted_file_with_a_future_stamp_and_mtime_ages_from_the_monitors_first_sighting(ws, put_heartbeat):
    """Its modification time is set ahead too, so it says nothing; the monitor's memory (first sighting of
    the seq) is what every caller then judges by, the memoryless ones included."""
    claims.claim(ws, "src/a.py", "planted", ttl_s=DAY, now=NOW)
    put_heartbeat("planted", ago(-DAY), written_at=NOW + timedelta(days=1), seq=7)
    first = mon.run_monitor(ws, now=NOW)
    assert {a["agent_id"]: a["effective_status"] for a in first["agents"]} == {"planted": "active"}
    later = NOW + HOURS_2
    assert status_of_agent(ws.paths, "planted", later, ws.config) == "dead"
    assert claims.claim(ws, "src/a.py", "bob", now=later).event == "taken_over"
    second = mon.run_monitor(ws, now=later)
    assert second["agents"][0]["effective_status"] == "dead" and second["agents"][0]["anomalies"] == ["clock_skew"]


def test_seq_going_backwards_is_an_anomaly_and_does_not_revive_a_silent_writer(ws, put_heartbeat):
    put_heartbeat("odd", ago(-DAY), seq=9, written_at=NOW - HOURS_2)
    first = mon.run_monitor(ws, now=NOW)
    assert first["agents"][0]["effective_status"] == "dead"
    # the file goes back to an older seq, and its modification time with it (a restored copy)
    path = put_heartbeat("odd", ago(-DAY), seq=3, written_at=NOW - HOURS_2)
    second = mon.run_monitor(ws, now=NOW + timedelta(seconds=1))
    entry = second["agents"][0]
    assert entry["anomalies"] == ["clock_skew", "seq_backwards"] and entry["effective_status"] == "dead"
    # a real new write is a new beat: alive again, the anomaly said once
    set_written_at(path, NOW + timedelta(seconds=2))
    put_heartbeat("odd", ago(-DAY), seq=4, written_at=NOW + timedelta(seconds=2))
    third = mon.run_monitor(ws, now=NOW + timedelta(seconds=3))
    assert third["agents"][0]["effective_status"] == "active" and third["agents"][0]["anomalies"] == ["clock_skew"]


def test_within_the_allowed_skew_a_stamp_is_taken_at_its_word(ws):
    doc = {"schema_version": 1, "agent_id": "a", "harness": "t", "status": "active", "seq": 1,
           "beat_at": ago(-60)}  # a minute ahead, under clock_skew_s (120)
    verdict = effective_status(doc, NOW, written_at=NOW - timedelta(days=9), **ws.config.thresholds)
    assert verdict.effective_status == "active" and verdict.anomalies == [] and verdict.age_s == -60


def test_a_shared_stores_copy_ahead_of_time_ages_from_when_the_store_received_it(ws):
    """Agents on another machine are judged by their heartbeat copy in the store (§12): `received_at`,
    the store's own moment, is what a clock running ahead is judged by."""
    doc = {"schema_version": 1, "agent_id": "far", "harness": "t", "status": "active", "seq": 3,
           "beat_at": ago(-DAY)}
    assert status_of_doc({**doc, "received_at": micro(NOW - HOURS_2)}, NOW, ws.config) == "dead"
    assert status_of_doc({**doc, "received_at": micro(NOW - timedelta(seconds=5))}, NOW, ws.config) == "active"


# -- registry rows stamped in the future --------------------------------------------------------------------

@pytest.fixture
def trio(ws):
    """alice, bob and carol in one session at NOW; bob's registry row then stamped a day ahead."""
    sid = actions.start(ws, agent_id="alice", new_session=True, env={}, now=NOW)["session_id"]
    tokens = {"alice": None}
    for name in ("bob", "carol"):
        tokens[name] = actions.start(ws, agent_id=name, session_id=sid, env={}, now=NOW)["run_token"]
    conn = sqlite3.connect(ws.paths.session_db(sid))
    with conn:
        conn.execute("UPDATE agents SET last_heartbeat = ? WHERE id = 'bob'", (micro(NOW + timedelta(days=1)),))
        conn.execute("UPDATE agents SET status = 'sleeping' WHERE id = 'carol'")
    conn.close()
    return sid


def registry(ws, sid) -> dict:
    conn = sqlite3.connect(ws.paths.session_db(sid))
    try:
        return dict(conn.execute("SELECT id, status FROM agents"))
    finally:
        conn.close()


def test_a_future_registry_stamp_does_not_block_tireds_consensus(ws, trio):
    result = sleep.tired(ws, Who("alice", trio), memories=["done"], env={}, now=NOW + timedelta(seconds=1))
    assert result["outcome"] == "consolidated" and result["active_others"] == 0
    assert result["flagged_stale"] == ["bob"]
    assert registry(ws, trio)["bob"] == "stale"


def test_the_watchdogs_stale_flag_catches_a_future_registry_stamp(ws, trio):
    flagged = sessions.flag_stale(ws, now=NOW + timedelta(seconds=1))
    assert [(f["agent_id"], f["from"]) for f in flagged] == [("bob", "active")]


def test_a_future_registry_stamp_does_not_hold_an_id_against_a_restart(ws, trio):
    taken = actions.start(ws, agent_id="bob", session_id=trio, env={}, now=NOW + timedelta(seconds=1))
    assert taken["registration"] == "taken_over"


def test_list_agents_and_the_signal_audience_agree(ws, trio):
    later = NOW + timedelta(seconds=1)
    listed = {a["id"]: a for a in actions.list_agents(ws, Who("alice", trio), env={}, now=later)["agents"]}
    assert (listed["alice"]["live"], listed["bob"]["live"], listed["carol"]["live"]) == (True, False, False)
    sent = actions.signal(ws, Who("alice", trio), "*", "anyone?", env={}, now=later)
    assert sent["audience"]["live"] == [] and sorted(sent["audience"]["waiting"]) == ["bob", "carol"]


@pytest.mark.parametrize("offset_s", [-301, -300, -1, 0, 60, 120, 121, 3600, 10 * 365 * DAY])
def test_the_store_counts_live_agents_by_the_same_rule(ws, offset_s):
    """count_live_agents and flag_stale_in (SQL) against registry_live (Python), row by row."""
    sid = actions.start(ws, agent_id="alice", new_session=True, env={}, now=NOW)["session_id"]
    stamp = micro(NOW + timedelta(seconds=offset_s))
    with open_session(ws, sid) as store:
        with store.write() as tx:
            tx.execute("UPDATE agents SET last_heartbeat = ? WHERE id = 'alice'", (stamp,))
        with store.read() as tx:
            live = registry_live(tx.agent("alice"), NOW, ws.config)
            assert sessions.count_live_agents(tx, NOW, ws.config) == int(live)
        assert live == (-300 <= offset_s <= 120)
        with store.write() as tx:
            flagged = sessions.flag_stale_in(tx, NOW, ws.config)
        assert [f["agent_id"] for f in flagged] == ([] if live else ["alice"])
