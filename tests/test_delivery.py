"""Honest delivery (SPEC-037): marked delivered only in the transaction that returns it, with its method;
hook redelivery; heartbeat refresh by every verb; the escalation writer's warn broadcast."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from conftest import NOW, configure
from synapolis import actions
from synapolis.identity import Who


@pytest.fixture
def pair(start_agent):
    a = start_agent("alice")
    start_agent("bob")
    return Who("alice", a["session_id"]), Who("bob", a["session_id"])


def deliveries(db_rows, who):
    return db_rows(who.session_id, "SELECT s.content, d.* FROM signal_deliveries d JOIN signals s ON s.id = d.signal_id "
                                   "WHERE d.agent_id = ? ORDER BY s.sequence", who.agent_id)


def test_nothing_is_delivered_on_send(ws, pair, db_rows):
    alice, bob = pair
    actions.signal(ws, alice, "bob", "hello", env={}, now=NOW)
    actions.signal(ws, alice, "*", "all", env={}, now=NOW)
    assert db_rows(alice.session_id, "SELECT * FROM signal_deliveries") == []


def test_piggyback_marks_in_the_same_answer(ws, pair, db_rows):
    alice, bob = pair
    sent = actions.signal(ws, alice, "bob", "hello", env={}, now=NOW)["signal"]
    later = NOW + timedelta(seconds=3)
    answer = actions.whiteboard_write(ws, bob, "k", "v", env={}, now=later)
    assert [s["id"] for s in answer["pending_signals"]] == [sent["id"]]
    got = answer["pending_signals"][0]
    assert got["delivery_method"] == "piggyback" and got["read"] is False
    rows = deliveries(db_rows, bob)
    assert len(rows) == 1 and rows[0]["delivery_method"] == "piggyback"
    assert rows[0]["delivered_at"] == got["delivered_at"] == "2030-01-01T12:00:03.000000Z"
    # delivered is not read, and it is not delivered twice
    assert actions.read_signals(ws, bob, env={}, now=later)["signals"][0]["read"] is False
    assert actions.beat(ws, bob, env={}, now=later)["pending_signals"] == []


def test_read_signals_is_a_pure_query(ws, pair, db_rows):
    alice, bob = pair
    actions.signal(ws, alice, "bob", "hello", env={}, now=NOW)
    out = actions.read_signals(ws, bob, env={}, now=NOW)
    assert "pending_signals" not in out or out.get("pending_signals") == []
    assert db_rows(bob.session_id, "SELECT * FROM signal_deliveries") == []
    assert db_rows(bob.session_id, "SELECT * FROM signal_reads") == []
    assert out["signals"][0]["delivered_at"] is None
    # so the next verb still delivers it
    assert [s["content"] for s in actions.signals_pending(ws, bob, env={}, now=NOW)["pending_signals"]] == ["hello"]
    assert deliveries(db_rows, bob)[0]["delivery_method"] == "poll"


def test_no_piggyback_marks_nothing(ws, pair, db_rows):
    alice, bob = pair
    actions.signal(ws, alice, "bob", "hello", env={}, now=NOW)
    assert actions.beat(ws, bob, env={}, piggyback=False, now=NOW)["pending_signals"] == []
    assert actions.note(ws, bob, "n", env={}, piggyback=False, now=NOW)["pending_signals"] == []
    assert deliveries(db_rows, bob) == []


def test_startup_drain(ws, start_agent, pair, db_rows):
    alice, bob = pair
    actions.signal(ws, alice, "bob", "while you were away", env={}, now=NOW)
    again = start_agent("bob", run_token=None, now=NOW + timedelta(seconds=ws.config.stale_after_s + 1))
    assert [s["content"] for s in again["pending_signals"]] == ["while you were away"]
    assert deliveries(db_rows, bob)[0]["delivery_method"] == "startup_drain"


def test_acked_before_delivery_is_never_delivered(ws, pair, db_rows):
    alice, bob = pair
    s = actions.signal(ws, alice, "bob", "seen via read-signals", env={}, now=NOW)["signal"]
    actions.ack_signals(ws, bob, s["id"], env={}, piggyback=False, now=NOW)
    assert actions.signals_pending(ws, bob, env={}, now=NOW)["pending_signals"] == []
    assert deliveries(db_rows, bob) == []


def test_inbox_push(ws, pair, db_rows):
    alice, bob = pair
    actions.signal(ws, alice, "bob", "one", env={}, now=NOW)
    actions.beat(ws, bob, env={}, now=NOW)  # delivers "one" by piggyback
    actions.signal(ws, alice, "bob", "two", env={}, now=NOW)
    box = actions.inbox(ws, bob, bob.session_id, "bob", env={}, now=NOW)
    assert [s["content"] for s in box["signals"]] == ["one", "two"]
    methods = {r["content"]: r["delivery_method"] for r in deliveries(db_rows, bob)}
    assert methods == {"one": "piggyback", "two": "push"}


def test_inbox_of_another_agent_is_refused_and_marks_nothing(ws, pair, db_rows):
    from synapolis.errors import AmbiguousIdentityError, ForbiddenError, NoIdentityError

    alice, bob = pair
    actions.signal(ws, alice, "bob", "for bob only", env={}, now=NOW)
    with pytest.raises(ForbiddenError):  # alice names herself, but asks for bob's inbox
        actions.inbox(ws, alice, bob.session_id, "bob", env={}, now=NOW)
    with pytest.raises(ForbiddenError):  # someone claims to be bob: a wrong run token proves they are not
        actions.inbox(ws, Who("bob", bob.session_id, "0" * 32), bob.session_id, "bob", env={}, now=NOW)
    with pytest.raises(NoIdentityError):  # a remote caller that named nobody
        actions.inbox(ws, Who(named_only=True), bob.session_id, "bob", env={}, now=NOW)
    with pytest.raises(AmbiguousIdentityError):  # nobody named, and identity.json cannot say who of two
        actions.inbox(ws, None, bob.session_id, "bob", env={}, now=NOW)
    assert deliveries(db_rows, bob) == []
    assert [s["content"] for s in actions.signals_pending(ws, bob, env={}, now=NOW)["pending_signals"]] \
        == ["for bob only"]


def test_drain_limit_and_budget_mark_only_what_they_return(ws, pair, db_rows):
    alice, bob = pair
    for i in range(5):
        actions.signal(ws, alice, "bob", f"m{i}" + "x" * 100, env={}, now=NOW)
    first = actions.signals_pending(ws, bob, env={}, limit=2, now=NOW)["pending_signals"]
    assert [s["content"][:2] for s in first] == ["m0", "m1"]
    assert len(deliveries(db_rows, bob)) == 2
    tight = actions.signals_pending(ws, bob, env={}, budget_chars=350, now=NOW)["pending_signals"]
    assert [s["content"][:2] for s in tight] == ["m2"]
    rest = actions.signals_pending(ws, bob, env={}, now=NOW)["pending_signals"]
    assert [s["content"][:2] for s in rest] == ["m3", "m4"]
    assert len(deliveries(db_rows, bob)) == 5


def test_hook_redelivery(ws, pair, db_rows):
    alice, bob = pair
    wait = ws.config.redeliver_after_s
    s = actions.signal(ws, alice, "bob", "please handle", env={}, now=NOW)["signal"]
    other = actions.signal(ws, alice, "bob", "also this", env={}, now=NOW)["signal"]

    def hook(at):
        return [x["content"] for x in actions.signals_pending(ws, bob, env={}, method="hook", now=at)["pending_signals"]]

    assert hook(NOW) == ["please handle", "also this"]
    assert hook(NOW + timedelta(seconds=wait - 1)) == []              # not before redeliver_after_s
    actions.ack_signals(ws, bob, other["id"], env={}, piggyback=False, now=NOW)
    assert hook(NOW + timedelta(seconds=wait)) == ["please handle"]  # second offer; the acked one never again
    assert hook(NOW + timedelta(seconds=2 * wait)) == ["please handle"]  # third offer
    assert hook(NOW + timedelta(seconds=10 * wait)) == []            # three offers in all
    row = [r for r in deliveries(db_rows, bob) if r["signal_id"] == s["id"]][0]
    assert row["offers"] == 3 and row["delivery_method"] == "hook"
    # a piggyback never re-offers what a hook delivered
    assert actions.beat(ws, bob, env={}, now=NOW + timedelta(seconds=20 * wait))["pending_signals"] == []


def test_a_hooks_drain_takes_what_fits_marks_only_that_and_names_the_rest(ws, pair, db_rows):
    """signals_pending as a hook calls it: `fits` decides signal by signal, `withheld` lists the undelivered
    rest from the same transaction, `status` goes into the heartbeat and the registry."""
    alice, bob = pair
    actions.beat(ws, bob, status="idle", env={}, now=NOW)
    sent = [actions.signal(ws, alice, "bob", f"m{i}", env={}, now=NOW)["signal"]["id"] for i in range(3)]
    later = NOW + timedelta(seconds=5)
    out = actions.signals_pending(ws, bob, env={}, method="hook", status="active", withheld=True,
                                  fits=lambda taken, candidate: not taken, now=later)
    assert [s["id"] for s in out["pending_signals"]] == sent[:1]
    assert [s["id"] for s in out["withheld"]] == sent[1:]
    rows = deliveries(db_rows, bob)
    assert [(r["signal_id"], r["delivery_method"]) for r in rows] == [(sent[0], "hook")]
    assert json.loads(ws.paths.heartbeat("bob").read_text())["status"] == "active"
    assert db_rows(bob.session_id, "SELECT status FROM agents WHERE id='bob'")[0]["status"] == "active"
    # without `withheld` the answer is the plain one; the poll takes the rest
    rest = actions.signals_pending(ws, bob, env={}, now=later)
    assert "withheld" not in rest and [s["id"] for s in rest["pending_signals"]] == sent[1:]


def test_every_verb_refreshes_the_heartbeat_keeping_status_and_task(ws, pair, db_rows):
    alice, bob = pair
    actions.beat(ws, bob, status="idle", task="reviewing", env={}, now=NOW)
    hb = ws.paths.heartbeat("bob")
    seq = json.loads(hb.read_text())["seq"]
    calls = [
        lambda t: actions.signal(ws, bob, "alice", "x", env={}, now=t),
        lambda t: actions.read_signals(ws, bob, env={}, now=t),
        lambda t: actions.signals_pending(ws, bob, env={}, now=t),
        lambda t: actions.note(ws, bob, "n", env={}, now=t),
        lambda t: actions.whiteboard_write(ws, bob, "k", "v", env={}, now=t),
        lambda t: actions.ack_signals(ws, bob, None, all=True, env={}, now=t),
    ]
    for i, call in enumerate(calls, start=1):
        moment = NOW + timedelta(seconds=i * 10)
        call(moment)
        doc = json.loads(hb.read_text())
        assert doc["seq"] == seq + i and doc["status"] == "idle" and doc["task"] == "reviewing"
        assert doc["beat_at"] == f"2030-01-01T12:{i * 10 // 60:02d}:{i * 10 % 60:02d}Z"
        row = db_rows(bob.session_id, "SELECT status, last_heartbeat FROM agents WHERE id='bob'")[0]
        assert row["status"] == "idle" and row["last_heartbeat"].startswith(doc["beat_at"][:-1])


def test_beat_status_sets_the_registry(ws, pair, db_rows):
    alice, bob = pair
    for declared, registry in (("idle", "idle"), ("sleeping", "sleeping"), ("stopped", "sleeping"),
                               ("active", "active")):
        out = actions.beat(ws, bob, status=declared, env={}, now=NOW)
        assert out["heartbeat"]["status"] == declared
        assert db_rows(bob.session_id, "SELECT status FROM agents WHERE id='bob'")[0]["status"] == registry


def test_warn_broadcast_into_the_agents_active_sessions(ws, start_agent, pair, db_rows):
    alice, bob = pair
    elsewhere = start_agent("carol", new_session=True)
    sent = actions.warn_sessions(ws, {"id": "inc-1", "agent_id": "bob", "condition": "stale", "level": 1}, now=NOW)
    assert [x["session_id"] for x in sent] == [bob.session_id]
    got = actions.signals_pending(ws, alice, env={}, now=NOW)["pending_signals"]
    assert [(s["sender"], s["type"], s["recipient"]) for s in got] == [("synapolis.watchdog", "warn", "*")]
    assert "bob" in got[0]["content"] and "stale" in got[0]["content"]
    assert db_rows(elsewhere["session_id"], "SELECT * FROM signals") == []
    everywhere = actions.warn_sessions(ws, {"id": "g", "agent_id": "@global", "condition": "global"}, now=NOW)
    assert len(everywhere) == 2


def test_cli_text_output_shows_pending_after_its_own(cli):
    assert cli("start", "--agent-id", "alice").returncode == 0
    assert cli("start", "--agent-id", "bob").returncode == 0
    assert cli("signal", "bob", "ping", "--agent-id", "alice").returncode == 0
    out = cli("note", "working", "--agent-id", "bob")
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("note #1") and "pending signal" in lines[1] and "ping" in lines[2]
    data = json.loads(cli("signals-pending", "--agent-id", "bob", "--json").stdout)
    assert data == {"pending_signals": [], "pending_remaining": 0}


@pytest.mark.parametrize("others", [3, 40], ids=["a few", "more than a quick look"])
def test_a_signal_among_many_the_reader_cannot_see_is_delivered(ws, start_agent, db_rows, others):
    """A drain first looks at the few newest signals above the reader's watermark (signals.QUICK_LOOK) and
    skips its inbox query when it can see none of them; the one signal it can see, among `others` it cannot
    (to someone else, its own sub-agent's broadcast), is still delivered, once, and so is the next one."""
    ws = configure(ws, rate_limit_per_min=10 ** 6)
    sid = start_agent("alice")["session_id"]
    start_agent("bob")
    start_agent("carol")
    alice, bob, carol = (Who(name, sid) for name in ("alice", "bob", "carol"))
    for i in range(others):  # bob's verbs move his watermark past signals he cannot see
        actions.signal(ws, alice, "carol", f"to carol {i}", env={}, now=NOW)
        assert actions.signal(ws, bob, "carol", f"bob's own {i}", env={}, now=NOW)["pending_signals"] == []
    later = NOW + timedelta(seconds=1)
    for i in range(others):
        actions.signal(ws, alice, "carol", f"before {i}", env={}, now=later)
    actions.signal(ws, bob, "*", "from bob's sub-agent", sender_id="bob.y", env={}, now=later)
    sent = actions.signal(ws, carol, "bob.x", "for bob's sub-agent", env={}, now=later)["signal"]
    actions.signal(ws, alice, "*", "for everyone", env={}, now=later)
    for i in range(others):
        actions.signal(ws, alice, "carol", f"after {i}", env={}, now=later)
    got = actions.beat(ws, bob, env={}, now=later)["pending_signals"]
    assert [s["content"] for s in got] == ["for bob's sub-agent", "for everyone"]
    assert got[0]["id"] == sent["id"] and got[0]["delivery_method"] == "piggyback"
    assert actions.beat(ws, bob, env={}, now=later)["pending_signals"] == []
    rows = db_rows(sid, "SELECT s.content FROM signal_deliveries d JOIN signals s ON s.id = d.signal_id "
                        "WHERE d.agent_id = ? ORDER BY s.sequence", "bob")
    assert [r["content"] for r in rows] == ["for bob's sub-agent", "for everyone"]
    actions.signal(ws, carol, "bob", "next", env={}, now=later)
    assert [s["content"] for s in actions.signals_pending(ws, bob, env={}, now=later)["pending_signals"]] == ["next"]
