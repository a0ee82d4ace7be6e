"""Signals (contract §7): ids, visibility and addressing, recipients, senders, rate, size, Lamport, acks."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest

from conftest import clean_env, NOW
from synapolis import actions
from synapolis.errors import ForbiddenError, NotFoundError, RateLimitedError, UsageError
from synapolis.identity import Who
from synapolis.workspace import Workspace


@pytest.fixture
def trio(start_agent):
    """alice, bob, carol in one session; returns {name: Who}."""
    a = start_agent("alice")
    start_agent("bob")
    start_agent("carol")
    return {n: Who(n, a["session_id"]) for n in ("alice", "bob", "carol")}


def send(ws, who, to, content, **kw):
    kw.setdefault("now", NOW)
    return actions.signal(ws, who, to, content, env={}, piggyback=False, **kw)["signal"]


def unread(ws, who, **kw):
    return [s["content"] for s in actions.read_signals(ws, who, env={}, now=NOW, **kw)["signals"]]


def test_signal_id_is_sha256_of_its_fields(ws, trio):
    s = send(ws, trio["alice"], "bob", "hello")
    expected = hashlib.sha256(f"alice|bob|inform|hello|{s['timestamp']}".encode()).hexdigest()
    assert s["id"] == expected
    assert s["timestamp"].endswith("Z") and len(s["timestamp"].split(".")[1]) == 7  # microseconds + Z
    twin = send(ws, trio["alice"], "bob", "hello")  # same fields, same microsecond: still unique
    assert twin["id"] != s["id"] and twin["sequence"] == s["sequence"] + 1


def test_a_send_hashes_its_id_once_on_either_store(ws, trio, monkeypatch):
    """The row (and its SHA-256 id) is built for the store's one-call send only where the store offers it."""
    from synapolis import signals

    hashed = []
    real = signals.signal_id
    monkeypatch.setattr(signals, "signal_id", lambda *parts: hashed.append(parts) or real(*parts))
    s = send(ws, trio["alice"], "bob", "once")
    assert len(hashed) == 1 and hashed[0][:4] == ("alice", "bob", "inform", "once")
    assert s["id"] == real(*hashed[0])

def test_visibility_rules(ws, trio):
    send(ws, trio["alice"], "*", "broadcast from alice")
    send(ws, trio["alice"], "bob", "to bob")
    send(ws, trio["alice"], "bob.critic", "to bob's critic")
    send(ws, trio["alice"], "bob.critic.deep", "to bob's critic's helper")
    send(ws, trio["alice"], "carol", "to carol")
    send(ws, trio["bob"], "*", "broadcast from bob", sender_id="bob.popper")
    assert unread(ws, trio["bob"]) == ["broadcast from alice", "to bob", "to bob's critic",
                                       "to bob's critic's helper"]
    assert unread(ws, trio["carol"]) == ["broadcast from alice", "to carol", "broadcast from bob"]
    assert unread(ws, trio["alice"]) == ["broadcast from bob"]


def test_subagent_namespace_is_exact(ws, start_agent, trio):
    # 'bobby' is not under 'bob', and '_' in ids is not a wildcard
    start_agent("bobby")
    start_agent("a_b")
    start_agent("axb")
    sid = trio["alice"].session_id
    send(ws, trio["alice"], "bobby", "to bobby")
    send(ws, trio["alice"], "axb", "to axb")
    assert unread(ws, trio["bob"]) == []
    assert unread(ws, Who("a_b", sid)) == []
    assert unread(ws, Who("bobby", sid)) == ["to bobby"]


def test_registered_subagent_reads_its_own_and_parent_sees_them(ws, start_agent, trio):
    start_agent("bob.critic")
    sid = trio["bob"].session_id
    send(ws, trio["alice"], "bob.critic", "critique this")
    assert unread(ws, Who("bob.critic", sid)) == ["critique this"]
    assert unread(ws, trio["bob"]) == ["critique this"]


def test_broadcasts_before_first_join_are_history(ws, start_agent, trio):
    send(ws, trio["alice"], "*", "old news")
    send(ws, trio["alice"], "bob", "for bob")
    late = start_agent("dave")
    dave = Who("dave", late["session_id"])
    send(ws, trio["alice"], "*", "fresh news")
    assert unread(ws, dave) == ["fresh news"]
    everything = actions.read_signals(ws, dave, unread_only=False, env={}, now=NOW)["signals"]
    assert [s["content"] for s in everything] == ["old news", "fresh news"]
    assert all(s["read"] is False for s in everything)
    assert late["pending_signals"] == []  # history is not delivered either


def test_directed_signals_wait_for_a_stale_or_sleeping_agent(ws, trio):
    actions.beat(ws, trio["carol"], status="sleeping", env={}, now=NOW)
    later = NOW + timedelta(seconds=ws.config.stale_after_s + 1)
    actions.beat(ws, trio["alice"], env={}, now=later)
    out = actions.signal(ws, trio["alice"], "*", "anyone?", env={}, now=later)
    assert out["audience"]["live"] == ["alice"] or out["audience"]["live"] == []
    assert set(out["audience"]["waiting"]) == {"bob", "carol"}
    assert out["audience"]["waiting_status"] == {"bob": "stale", "carol": "sleeping"}
    direct = actions.signal(ws, trio["alice"], "carol.sub", "wake up", env={}, now=later)
    assert direct["audience"] == {"live": [], "waiting": ["carol"], "waiting_status": {"carol": "sleeping"}}
    assert unread(ws, trio["carol"]) == ["anyone?", "wake up"]


def test_audience_of_a_broadcast_excludes_the_sender_family(ws, start_agent, trio):
    helper = start_agent("alice.helper")
    out = actions.signal(ws, Who("alice.helper", helper["session_id"]), "*", "hi", env={}, now=NOW)
    assert out["audience"]["live"] == ["bob", "carol"]  # alice does not see her sub-agent's broadcast
    out = actions.signal(ws, trio["alice"], "*", "hi", env={}, now=NOW)
    assert out["audience"]["live"] == ["alice.helper", "bob", "carol"]


@pytest.mark.parametrize("to", ["mallory", "mallory.sub", "bo", "bob2"])
def test_unknown_recipients_are_not_found(ws, trio, to):
    with pytest.raises(NotFoundError, match="unknown recipient"):
        send(ws, trio["alice"], to, "hello?")


@pytest.mark.parametrize("to", ["", "../bob", "bob/..", "bob..x", "b c", "**"])
def test_malformed_recipients_are_usage_errors(ws, trio, to):
    with pytest.raises(UsageError):
        send(ws, trio["alice"], to, "x")


def test_sender_may_only_be_the_caller_or_its_subagents(ws, trio):
    assert send(ws, trio["alice"], "bob", "x", sender_id="alice.critic")["sender"] == "alice.critic"
    assert send(ws, trio["alice"], "bob", "x", sender_id="alice")["sender"] == "alice"
    for spoof in ("bob", "carol.sub", "alicex", "alic"):
        with pytest.raises(ForbiddenError):
            send(ws, trio["alice"], "bob", "x", sender_id=spoof)
    with pytest.raises(UsageError):
        send(ws, trio["alice"], "bob", "x", sender_id="alice/../bob")


def test_types_and_content_size(ws, trio):
    for t in ("inform", "query", "delegate", "ack", "warn", "sleep_event", "sleep_request"):
        assert send(ws, trio["alice"], "bob", "x", type=t)["type"] == t
    with pytest.raises(UsageError):
        send(ws, trio["alice"], "bob", "x", type="chat")
    limit = ws.config.max_content_bytes
    assert send(ws, trio["alice"], "bob", "é" * (limit // 2))["content"]
    with pytest.raises(UsageError, match="max_content_bytes"):
        send(ws, trio["alice"], "bob", "é" * (limit // 2) + "x")
    with pytest.raises(UsageError):
        send(ws, trio["alice"], "bob", "")


def test_token_bucket_per_sender(ws, trio):
    rate = ws.config.rate_limit_per_min
    for i in range(rate):
        send(ws, trio["alice"], "bob", f"m{i}")
    with pytest.raises(RateLimitedError) as caught:
        send(ws, trio["alice"], "bob", "one too many")
    assert 5.9 <= caught.value.retry_after_s <= 6.1
    assert "retry in" in caught.value.message
    # sub-agent names do not open new buckets
    with pytest.raises(RateLimitedError):
        send(ws, trio["alice"], "bob", "x", sender_id="alice.other")
    send(ws, trio["bob"], "alice", "bob has his own bucket")
    # refilled at rate/60 per second
    send(ws, trio["alice"], "bob", "later", now=NOW + timedelta(seconds=6.1))
    with pytest.raises(RateLimitedError):
        send(ws, trio["alice"], "bob", "too soon", now=NOW + timedelta(seconds=6.2))
    # the refused ones were not stored
    contents = unread(ws, trio["bob"])
    assert "one too many" not in contents and "too soon" not in contents and len(contents) == rate + 1


def test_lamport_after_delivery_and_reply(ws, trio):
    for i in range(5):
        send(ws, trio["alice"], "bob", f"warm up {i}")
    first = send(ws, trio["alice"], "bob", "question")
    assert first["lamport"] == 6
    # carol has seen nothing: her clock starts low ...
    early = send(ws, trio["carol"], "bob", "early")
    assert early["lamport"] == 1
    # ... a reply is always above what it answers
    reply = send(ws, trio["carol"], "alice", "answer", reply_to=first["id"][:10])
    assert reply["lamport"] > first["lamport"] and reply["reply_to"] == first["id"]
    # a signal sent after one was delivered to the sender is above it
    delivered = actions.beat(ws, trio["bob"], env={}, now=NOW)["pending_signals"]
    top = max(s["lamport"] for s in delivered)
    after = send(ws, trio["bob"], "carol", "after delivery")
    assert after["lamport"] > top
    with pytest.raises(NotFoundError):
        send(ws, trio["carol"], "alice", "x", reply_to="ab" * 32)


def test_read_signals_limits(ws, trio):
    for i in range(5):
        send(ws, trio["alice"], "bob", f"m{i}")
    assert unread(ws, trio["bob"], limit=2) == ["m0", "m1"]  # unread: the oldest N, a queue
    newest = actions.read_signals(ws, trio["bob"], unread_only=False, limit=2, env={}, now=NOW)["signals"]
    assert [s["content"] for s in newest] == ["m3", "m4"]  # --all: the newest N, oldest first
    with pytest.raises(UsageError):
        actions.read_signals(ws, trio["bob"], limit=0, env={})


def test_ack_by_prefix_and_all(ws, trio, db_rows):
    ids = [send(ws, trio["alice"], "bob", f"m{i}")["id"] for i in range(4)]
    out = actions.ack_signals(ws, trio["bob"], f"{ids[0][:8]},{ids[1]}", env={}, now=NOW)
    assert out["acked"] == ids[:2]
    assert unread(ws, trio["bob"]) == ["m2", "m3"]
    reads = db_rows(trio["bob"].session_id, "SELECT signal_id FROM signal_reads WHERE agent_id='bob'")
    assert {r["signal_id"] for r in reads} == set(ids[:2])
    # acking again is harmless
    assert actions.ack_signals(ws, trio["bob"], [ids[0]], env={}, now=NOW)["acked"] == [ids[0]]
    with pytest.raises(UsageError):
        actions.ack_signals(ws, trio["bob"], ids[2][:7], env={}, now=NOW)
    with pytest.raises(UsageError):
        actions.ack_signals(ws, trio["bob"], "not-hex-at-all", env={}, now=NOW)
    with pytest.raises(NotFoundError):
        actions.ack_signals(ws, trio["bob"], "0" * 64, env={}, now=NOW)
    # another agent's signal is not the caller's to ack
    other = send(ws, trio["alice"], "carol", "private")
    with pytest.raises(NotFoundError):
        actions.ack_signals(ws, trio["bob"], other["id"], env={}, now=NOW)
    rest = actions.ack_signals(ws, trio["bob"], None, all=True, env={}, now=NOW)
    assert rest["acked"] == ids[2:] and unread(ws, trio["bob"]) == []
    with pytest.raises(UsageError):
        actions.ack_signals(ws, trio["bob"], "", env={}, now=NOW)


@pytest.mark.sqlite_only
def test_ambiguous_prefix(ws, trio):
    # two stored ids sharing 8 characters: forge them (finding a real collision takes 2**32 tries)
    from synapolis.store import SessionStore

    store = SessionStore.open(ws, trio["bob"].session_id)
    with store.write() as conn:
        for suffix in ("a" * 56, "b" * 56):
            conn.execute("INSERT INTO signals (id, timestamp, sender, recipient, type, content) "
                         "VALUES (?, '2030-01-01T00:00:00.000000Z', 'alice', 'bob', 'inform', 'forged')",
                         ("12345678" + suffix,))
    store.close()
    with pytest.raises(UsageError, match="ambiguous"):
        actions.ack_signals(ws, trio["bob"], "12345678", env={}, now=NOW)
    assert actions.ack_signals(ws, trio["bob"], "12345678a", env={}, now=NOW)["acked"] == ["12345678" + "a" * 56]


@pytest.mark.sqlite_only
def test_watermarks_agree_with_a_naive_reading(ws, trio):
    """Random sends and acks: the indexed inbox equals a brute-force filter of every signal."""
    import random

    from synapolis.signals import is_visible
    from synapolis.store import SessionStore

    rng = random.Random(7)
    ws = _config(ws, rate_limit_per_min=100000)
    names = ["alice", "bob", "carol"]
    targets = ["*", "alice", "bob", "carol", "bob.x", "carol.y.z"]
    for step in range(300):
        who = trio[rng.choice(names)]
        if rng.random() < 0.7:
            send(ws, who, rng.choice(targets), f"s{step}")
        else:
            mine = actions.read_signals(ws, who, env={}, now=NOW)["signals"]
            if mine:
                pick = rng.sample(mine, k=rng.randint(1, len(mine)))
                actions.ack_signals(ws, who, [s["id"] for s in pick], env={}, now=NOW)
        if step % 50 == 0:
            actions.signals_pending(ws, trio[rng.choice(names)], env={}, now=NOW)
    store = SessionStore.open(ws, trio["alice"].session_id)
    with store.read() as conn:
        every = conn.execute("SELECT * FROM signals ORDER BY sequence").fetchall()
        reads = {(r["signal_id"], r["agent_id"]) for r in conn.execute("SELECT * FROM signal_reads")}
    store.close()
    for name in names:
        naive = [r["content"] for r in every if is_visible(r, name) and (r["id"], name) not in reads]
        assert unread(ws, trio[name]) == naive


def _config(ws, **values):
    doc = json.loads(ws.paths.config.read_text())
    doc.update(values)
    ws.paths.config.write_text(json.dumps(doc))
    return Workspace.open(ws.root)


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_signal_round_trip(cli):
    assert cli("start", "--agent-id", "alice").returncode == 0
    assert cli("start", "--agent-id", "bob").returncode == 0
    sent = cli("signal", "bob", "-", "--agent-id", "alice", "--json", input="from stdin\n")
    assert sent.returncode == 0, sent.stderr
    data = json.loads(sent.stdout)
    assert data["signal"]["content"] == "from stdin" and data["audience"]["live"] == ["bob"]
    read = json.loads(cli("read-signals", "--agent-id", "bob", "--json").stdout)
    assert [s["content"] for s in read["signals"]] == ["from stdin"]
    assert set(read["signals"][0]) >= {"id", "sequence", "timestamp", "sender", "recipient", "type", "content",
                                       "lamport", "read", "delivered_at"}
    text = cli("read-signals", "--agent-id", "bob")
    assert "alice -> bob" in text.stdout and "from stdin" in text.stdout
    acked = cli("ack-signals", data["signal"]["id"][:8], "--agent-id", "bob", "--json")
    assert json.loads(acked.stdout)["acked"] == [data["signal"]["id"]]
    assert json.loads(cli("read-signals", "--agent-id", "bob", "--json").stdout)["signals"] == []


def test_cli_signal_exit_codes(cli, state_dir):
    assert cli("init").returncode == 0
    config = json.loads((state_dir / "synapolis.json").read_text())
    (state_dir / "synapolis.json").write_text(json.dumps(dict(config, rate_limit_per_min=2)))
    assert cli("start", "--agent-id", "alice").returncode == 0
    assert cli("signal", "nobody", "x", "--agent-id", "alice").returncode == 6
    assert cli("signal", "*", "x", "--agent-id", "alice", "--sender-id", "bob").returncode == 7
    assert cli("signal", "*", "x", "--agent-id", "alice", "--type", "gossip").returncode == 2
    assert cli("signal", "*", "x" * 70000, "--agent-id", "alice").returncode == 2
    assert cli("ack-signals", "abc", "--agent-id", "alice").returncode == 2
    assert cli("ack-signals", "abcdef0123", "--agent-id", "alice").returncode == 6
    assert cli("signal", "*", "x", "--agent-id", "alice", "--reply-to", "abcdef0123").returncode == 6
    for i in range(2):  # refused sends took no token
        assert cli("signal", "*", f"m{i}", "--agent-id", "alice").returncode == 0
    limited = cli("signal", "*", "one too many", "--agent-id", "alice", "--json")
    assert limited.returncode == 5
    error = json.loads(limited.stdout)["error"]
    assert error["type"] == "RateLimitedError" and error["retry_after_s"] > 0 and "retry in" in error["message"]


def test_cli_signal_path_imports_nothing_heavy(cli, state_dir):
    """Start-up cost: the verbs a harness runs on every tool call load none of the heavy libraries."""
    import subprocess
    import sys

    assert cli("start", "--agent-id", "alice").returncode == 0
    env = clean_env()
    for verb in (["signal", "alice", "note to self"], ["read-signals"], ["beat"], ["signals-pending"]):
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "synapolis", "--state-dir", str(state_dir),
                              *verb, "--agent-id", "alice"], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        loaded = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
        assert not loaded & {"jsonschema", "dateutil", "filelock", "watchdog", "mcp", "asyncio"}, verb


def test_collect_reads_each_active_sessions_newest_signals_on_either_store(ws, start_agent):
    """The page's data straight from the library, on each store the tests run (SQLite, PostgreSQL)."""
    from synapolis import actions, dashboard
    from synapolis.identity import Who

    alice = start_agent("alice")
    start_agent("bob", session_id=alice["session_id"])
    me = Who("alice", alice["session_id"])
    for n in range(5):
        actions.signal(ws, me, "bob", f"s{n}", env={}, piggyback=False)
    actions.note(ws, me, "a note", env={}, piggyback=False)
    data = dashboard.collect(ws, signals_shown=3)
    (activity,) = data["activity"]
    assert [s["content"] for s in activity["signals"]] == ["s2", "s3", "s4"]  # the newest 3, oldest first
    assert [n["text"] for n in activity["notes"]] == ["a note"]
    assert {a["agent_id"] for a in data["agents"]} == {"alice", "bob"}


@pytest.mark.parametrize("seeks", [64, 1])
def test_broadcasts_from_each_sender_past_the_readers_own(ws, trio, start_agent, monkeypatch, seeks):
    """An inbox reads each other sender's broadcasts as its own branch (issue 31), or, past MAX_BROADCAST_SEEKS
    senders, one walk of them all: the same answer either way, never the reader's own or its sub-agents'."""
    from synapolis.store.postgres import PostgresTransaction
    from synapolis.store.sqlite import SqliteTransaction

    for kind in (SqliteTransaction, PostgresTransaction):
        monkeypatch.setattr(kind, "MAX_BROADCAST_SEEKS", seeks)
    start_agent("bob.x", session_id=trio["bob"].session_id)
    helper = Who("bob.x", trio["bob"].session_id)
    for i, who in enumerate([trio["bob"], trio["alice"], helper, trio["carol"], trio["bob"], trio["alice"]]):
        send(ws, who, "*", f"{who.agent_id} {i}")
    assert unread(ws, trio["bob"]) == ["alice 1", "carol 3", "alice 5"]
    assert unread(ws, trio["bob"], limit=2) == ["alice 1", "carol 3"]
    page = actions.read_signals(ws, trio["bob"], env={}, now=NOW, limit=1)
    assert page["remaining"] == 2 and [s["content"] for s in page["signals"]] == ["alice 1"]
    assert unread(ws, trio["alice"]) == ["bob 0", "bob.x 2", "carol 3", "bob 4"]


def test_a_broadcast_audience_judged_by_the_store_matches_the_registry_rows(ws, start_agent, trio):
    """Every registry state a broadcast meets, judged by the store itself (SQLite: from agents_by_liveness, no
    row per recipient) exactly as signals.audience judges the rows: live within the window, the rest waiting
    with why; the sender's own chain never in it."""
    from synapolis.sessions import ts
    from synapolis.signals import audience
    from synapolis.store import open_session

    sid = trio["alice"].session_id
    for name in ("alice.helper", "dave", "erin", "frank", "gina", "hugo", "ivan"):
        start_agent(name)
    stale, skew = ws.config.stale_after_s, ws.config.clock_skew_s
    states = {  # agent: (registry status, last_heartbeat)
        "alice": ("active", ts(NOW)), "alice.helper": ("active", ts(NOW)), "bob": ("active", ts(NOW)),
        "carol": ("idle", ts(NOW - timedelta(seconds=stale))),  # the window's edge: still live
        "dave": ("sleeping", ts(NOW)), "erin": ("stale", ts(NOW)),
        "frank": ("active", ts(NOW - timedelta(seconds=stale + 1))),  # out of the window: stale
        "gina": ("idle", ts(NOW + timedelta(seconds=skew + 60))),  # a clock far ahead: no evidence of life
        "hugo": ("active", ts(NOW + timedelta(seconds=skew))),  # the ceiling itself: live
        "ivan": ("active", ""),
    }
    with open_session(ws, sid) as store, store.write() as tx:
        for agent, (status, stamp) in states.items():
            tx.refresh_agent(agent, stamp, status)
    heard = actions.signal(ws, Who("alice.helper", sid), "*", "all hands", env={}, now=NOW)["audience"]
    rows = [(agent, status, stamp) for agent, (status, stamp) in sorted(states.items())
            if agent not in ("alice", "alice.helper")]
    assert heard == audience(rows, NOW, ws.config)
    assert heard == {"live": ["bob", "carol", "hugo"], "waiting": ["dave", "erin", "frank", "gina", "ivan"],
                     "waiting_status": {"dave": "sleeping", "erin": "stale", "frank": "stale", "gina": "stale",
                                        "ivan": "stale"}}
    # and the signal is stored once, for everyone in it
    assert [s["content"] for s in actions.read_signals(ws, trio["bob"], env={}, now=NOW)["signals"]] == ["all hands"]
