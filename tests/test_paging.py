"""Bounded answers (issue 15, issue 11 item 7): every answer that carries signals or notes is a page, with
a count of what is left and a cursor; what is marked delivered is exactly what an answer holds; the inbox
query uses the recipient index whatever the session holds; text for a terminal is sanitised."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import NOW

from synapolis import actions, signals
from synapolis.identity import Who
from synapolis.store import SessionStore

BOB = Who("bob")


def delivered(db_rows, sid, agent="bob"):
    return {r["signal_id"]: r["delivery_method"] for r in db_rows(
        sid, "SELECT signal_id, delivery_method FROM signal_deliveries WHERE agent_id = ?", agent)}


def test_piggyback_is_a_small_page_and_marks_exactly_what_it_carries(backlog, db_rows):
    ws, sid = backlog(250)
    answer = actions.beat(ws, Who("bob", sid), env={}, now=NOW)
    assert len(answer["pending_signals"]) == signals.PIGGYBACK_LIMIT
    assert answer["pending_remaining"] == 250 - signals.PIGGYBACK_LIMIT
    assert delivered(db_rows, sid) == {s["id"]: "piggyback" for s in answer["pending_signals"]}


def test_signals_pending_pages_through_a_backlog_exactly_once(backlog, db_rows):
    total = 2 * signals.PAGE_LIMIT + 50
    ws, sid = backlog(total)
    seen, lefts = [], []
    while True:
        answer = actions.signals_pending(ws, Who("bob", sid), env={}, now=NOW)
        if not answer["pending_signals"]:
            break
        seen += [s["content"] for s in answer["pending_signals"]]
        lefts.append(answer["pending_remaining"])
    assert seen == [f"signal {i}" for i in range(total)]  # each once, oldest first
    assert lefts == [signals.PAGE_LIMIT + 50, 50, 0]
    assert set(delivered(db_rows, sid).values()) == {"poll"} and len(delivered(db_rows, sid)) == total


def test_read_signals_pages_with_after_and_counts_what_is_left(backlog, db_rows):
    ws, sid = backlog(signals.PAGE_LIMIT + 150)
    first = actions.read_signals(ws, Who("bob", sid), env={}, now=NOW)
    assert len(first["signals"]) == signals.PAGE_LIMIT and first["remaining"] == 150
    assert first["next_after"] == first["signals"][-1]["sequence"]
    got, after = [], None
    while True:
        page = actions.read_signals(ws, Who("bob", sid), limit=70, after=after, env={}, now=NOW)
        got += [s["content"] for s in page["signals"]]
        if page["next_after"] is None:
            assert page["remaining"] == 0
            break
        after = page["next_after"]
    assert got == [f"signal {i}" for i in range(signals.PAGE_LIMIT + 150)]
    assert delivered(db_rows, sid) == {}  # a pure query marks nothing


def test_read_signals_all_is_the_newest_page_and_after_zero_pages_from_the_oldest(backlog):
    ws, sid = backlog(30)
    newest = actions.read_signals(ws, Who("bob", sid), unread_only=False, limit=10, env={}, now=NOW)
    assert [s["content"] for s in newest["signals"]] == [f"signal {i}" for i in range(20, 30)]
    assert newest["remaining"] == 20 and newest["next_after"] is None
    oldest = actions.read_signals(ws, Who("bob", sid), unread_only=False, limit=10, after=0, env={}, now=NOW)
    assert [s["content"] for s in oldest["signals"]] == [f"signal {i}" for i in range(10)]
    assert oldest["remaining"] == 20 and oldest["next_after"] == oldest["signals"][-1]["sequence"]


def test_the_count_of_what_is_left_stops_at_the_cap(backlog):
    ws, sid = backlog(signals.COUNT_CAP + 150)
    page = actions.read_signals(ws, Who("bob", sid), limit=10, env={}, now=NOW)
    assert page["remaining"] == signals.COUNT_CAP
    pending = actions.signals_pending(ws, Who("bob", sid), limit=10, env={}, now=NOW)
    assert pending["pending_remaining"] == signals.COUNT_CAP


def test_big_signals_fill_a_page_by_size_and_one_always_fits(backlog):
    ws, sid = backlog(5, content=lambda i: f"{i}" + "x" * 60000)
    page = actions.read_signals(ws, Who("bob", sid), env={}, now=NOW)
    assert len(page["signals"]) == 1 and page["remaining"] == 4  # two would pass the 64 KB budget
    assert len(json.dumps(page)) < 128 * 1024
    # escaped content counts as what it costs in JSON: 20,000 control characters are 120,000 characters
    last = actions.read_signals(ws, Who("bob", sid), unread_only=False, env={}, now=NOW)["latest_sequence"]
    with SessionStore.open(ws, sid) as store, store.write() as conn:
        for i in range(3):
            signals.send(conn, caller="alice", recipient="bob.sub", content=f"{i}" + "\x01" * 20000,
                         config=ws.config, now=NOW, rate_limited=False)
    page = actions.read_signals(ws, Who("bob", sid), after=last, env={}, now=NOW)
    assert len(page["signals"]) == 1 and page["remaining"] == 2


def test_inbox_resource_marks_exactly_the_page_it_returns(backlog, db_rows):
    ws, sid = backlog(signals.PAGE_LIMIT + 55)
    early = actions.signals_pending(ws, Who("bob", sid), limit=5, env={}, now=NOW)["pending_signals"]
    page = actions.inbox(ws, Who("bob", sid), sid, "bob", env={}, now=NOW)
    assert len(page["signals"]) == signals.PAGE_LIMIT and page["remaining"] == 55
    marks = delivered(db_rows, sid)
    assert {s["id"] for s in early} <= set(marks) and all(marks[s["id"]] == "poll" for s in early)
    assert set(marks) == {s["id"] for s in page["signals"]}
    assert all(s["delivered_at"] for s in page["signals"])
    # the rest is still undelivered: the next drain starts right after the page
    rest = actions.signals_pending(ws, Who("bob", sid), env={}, now=NOW)["pending_signals"]
    assert [s["content"] for s in rest] == [f"signal {i}" for i in range(signals.PAGE_LIMIT,
                                                                          signals.PAGE_LIMIT + 55)]


def test_inbox_query_uses_the_recipient_index_for_sub_agents(backlog, start_agent):
    """The plan of a page: every branch a SEARCH of an index in sequence order, never a walk of the table; the
    broadcasts one branch per other sender (signals_broadcasts_by_sender), so the reader's own broadcasts and
    its sub-agents', which it never sees, are not read at all (issue 31)."""
    ws, sid = backlog(50, to="alice")  # signals to somebody else
    for name in ("bob.x", "carol"):
        start_agent(name, session_id=sid)
    with SessionStore.open(ws, sid) as store, store.write() as conn:
        for to in ("bob.x", "bob.y.z"):
            signals.send(conn, caller="alice", recipient=to, content="hi", config=ws.config, now=NOW,
                         rate_limited=False)
        for sender in ("bob", "bob.x", "bob", "carol"):
            signals.send(conn, caller=sender, recipient="*", content=f"all from {sender}", config=ws.config,
                         now=NOW, rate_limited=False)
        inner, args = conn._visible_select("bob", 0, 0, True, False)  # the SQLite store's inbox query
        plan = [r[3] for r in conn.conn.execute(f"EXPLAIN QUERY PLAN {inner} ORDER BY sequence LIMIT 21", args)]
        found = signals.page(conn, "bob", limit=20)
    searches = [p for p in plan if p.startswith(("SEARCH s", "SCAN s"))]
    assert len(searches) == 4, plan  # carol's broadcasts, bob, bob.x, bob.y.z
    assert "USING INDEX signals_broadcasts_by_sender (sender=? AND sequence>?)" in searches[0], plan
    assert all("USING INDEX signals_by_recipient" in p and "rowid" not in p for p in searches[1:]), plan
    assert [s["recipient"] for s in found["signals"]] == ["bob.x", "bob.y.z", "*"]
    assert found["signals"][-1]["sender"] == "carol"


def older_store(ws, start_agent, version: int, *statements: str):
    """A session with alice's broadcast to bob, its session.db turned back into an older one: `statements` run
    on it and `user_version` set to `version`, with no pooled store keeping the schema it read. (sid, path)"""
    from synapolis import store

    sid = start_agent("alice")["session_id"]
    start_agent("bob", session_id=sid)
    actions.signal(ws, Who("alice", sid), "*", "before the upgrade", env={}, now=NOW)
    path = ws.files.session_db(sid)
    store.close_all()
    old = sqlite3.connect(path)
    for statement in statements:
        old.execute(statement)
    old.execute(f"PRAGMA user_version = {version}")
    old.commit()
    old.close()
    return sid, path


def test_a_schema_2_store_gets_the_broadcast_index_when_opened(ws, start_agent):
    """A session.db an older synapolis made (schema 2, no signals_broadcasts_by_sender) is migrated when opened:
    the index is built over the broadcasts it holds and the inbox finds them through it."""
    from synapolis import store

    sid, path = older_store(ws, start_agent, 2, "DROP INDEX signals_broadcasts_by_sender")
    page = actions.read_signals(ws, Who("bob", sid), env={}, now=NOW)
    assert [s["content"] for s in page["signals"]] == ["before the upgrade"]
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION == 6
    assert check.execute("SELECT name FROM sqlite_master WHERE name = 'signals_broadcasts_by_sender'").fetchone()
    check.close()



def test_a_schema_4_store_gets_the_liveness_index_and_broadcasts_through_it(ws, start_agent):
    """A session.db of schema 4 (no agents_by_liveness) is migrated when opened, and a broadcast's audience is
    then read from that index: the query plan says so, and the answer lists every recipient."""
    from synapolis.store.local.audience import _LIVE_IDS, _WAITING_ROWS

    sid, path = older_store(ws, start_agent, 4, "DROP INDEX agents_by_liveness")
    start_agent("carol", session_id=sid)
    heard = actions.signal(ws, Who("alice", sid), "*", "after the upgrade", env={}, now=NOW)["audience"]
    assert heard == {"live": ["bob", "carol"], "waiting": [], "waiting_status": {}}
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 6
    assert check.execute("SELECT name FROM sqlite_master WHERE name = 'agents_by_liveness'").fetchone()
    for sql, args in ((_LIVE_IDS, ("a", "b")), (_WAITING_ROWS, ("a", "b"))):
        plan = " ".join(row[3] for row in check.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "COVERING INDEX agents_by_liveness" in plan and "SCAN agents" not in plan, plan
    check.close()

def test_read_notes_pages_back_with_before_and_a_budget(ws, start_agent):
    sid = start_agent("alice")["session_id"]
    for i in range(1, 121):
        actions.note(ws, Who("alice", sid), f"note {i}", env={}, now=NOW)
    page = actions.read_notes(ws, Who("alice", sid), env={}, now=NOW)
    assert [n["seq"] for n in page["notes"]] == list(range(71, 121))
    assert page["remaining"] == 70 and page["next_before"] == 71
    back = actions.read_notes(ws, Who("alice", sid), before=71, limit=60, env={}, now=NOW)
    assert [n["seq"] for n in back["notes"]] == list(range(11, 71)) and back["next_before"] == 11
    last = actions.read_notes(ws, Who("alice", sid), before=11, limit=60, env={}, now=NOW)
    assert [n["seq"] for n in last["notes"]] == list(range(1, 11))
    assert last["remaining"] == 0 and last["next_before"] is None
    for i in range(3):
        actions.note(ws, Who("alice", sid), "y" * 40000, env={}, now=NOW)
    big = actions.read_notes(ws, Who("alice", sid), env={}, now=NOW)
    assert len(big["notes"]) == 1 and big["next_before"] == big["notes"][0]["seq"]


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_pages_and_says_how_to_go_on(backlog, cli):
    ws, sid = backlog(120)
    out = cli("read-signals", "--agent-id", "bob", "--limit", "50")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    data = json.loads(cli("read-signals", "--agent-id", "bob", "--limit", "50", "--json").stdout)
    assert len(lines) == 51 and lines[-1] == f"-- 70 more signals: `synapolis read-signals --after " \
                                                f"{data['next_after']}`"
    rest = json.loads(cli("read-signals", "--agent-id", "bob", "--after", data["next_after"], "--json").stdout)
    assert [s["content"] for s in rest["signals"]] == [f"signal {i}" for i in range(50, 120)]
    bad = cli("read-signals", "--agent-id", "bob", "--after", "-1", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["type"] == "UsageError"
    beat = cli("beat", "--agent-id", "bob")
    assert beat.stdout.splitlines()[-1] == "-- 100 more undelivered: `synapolis signals-pending` delivers them"
    pending = json.loads(cli("signals-pending", "--agent-id", "bob", "--limit", "30", "--json").stdout)
    assert len(pending["pending_signals"]) == 30 and pending["pending_remaining"] == 70


def test_terminal_text_is_sanitised_and_json_is_not(backlog, cli):
    hostile = "\x1b[2J\x1b]0;owned\x07hello\r\u202eevil\x9b31m"
    ws, sid = backlog(1, content=lambda i: hostile)
    actions.note(ws, Who("alice", sid), hostile, env={}, now=NOW)
    for verb in (["read-signals"], ["signals-pending"], ["read-notes"]):
        out = cli(*verb, "--agent-id", "bob")
        assert out.returncode == 0, out.stderr
        assert not any(c in out.stdout for c in "\x1b\x07\r\u202e\x9b"), (verb, out.stdout)
        assert "\\x1b[2J" in out.stdout and "\\u202e" in out.stdout, (verb, out.stdout)
    data = json.loads(cli("read-signals", "--agent-id", "bob", "--all", "--json").stdout)
    assert data["signals"][0]["content"] == hostile


# -- over MCP (the SDK's in-process client) --------------------------------------------------------

def test_mcp_answers_are_pages_under_256_kb(backlog, state_dir):
    import anyio
    import pytest

    pytest.importorskip("mcp")
    from mcp import Client

    from synapolis.mcp.server import create_server
    from synapolis.mcp.watch import inbox_uri

    ws, sid = backlog(400, content=lambda i: f"{i} " + "z" * 3000)

    async def main():
        async with Client(create_server(state_dir, {"SYNAPOLIS_AGENT_ID": "bob", "SYNAPOLIS_SESSION_ID": sid})) as bob:
            sizes = []

            async def call(tool, **args):
                result = await bob.call_tool(tool, args)
                assert not result.is_error, result.content[0].text
                sizes.append(len(result.model_dump_json(by_alias=True, exclude_none=True).encode()))
                return result.structured_content

            beat = await call("beat")
            taken = len(beat["pending_signals"])
            assert 8 <= taken <= 10 and beat["pending_remaining"] == 400 - taken  # 32 KB of 3 KB signals
            got, after = [], None
            while True:
                page = await call("read_signals", **({"after": after} if after is not None else {}))
                got += [int(s["content"].split()[0]) for s in page["signals"]]
                if page["next_after"] is None:
                    break
                after = page["next_after"]
            assert got == list(range(400))
            pending = await call("signals_pending", limit=5)
            assert len(pending["pending_signals"]) == 5 and pending["pending_remaining"] == 395 - taken
            inbox = json.loads((await bob.read_resource(inbox_uri(sid, "bob"))).contents[0].text)
            assert inbox["remaining"] > 0 and inbox["next_after"] == inbox["signals"][-1]["sequence"]
            assert max(sizes) < 256 * 1024, sizes
            assert len(json.dumps(inbox)) < 256 * 1024

    anyio.run(main)


def test_ack_all_over_a_backlog_acks_everything_and_lists_a_bounded_answer(backlog, cli, db_rows):
    ws, sid = backlog(1100)
    out = cli("ack-signals", "--all", "--agent-id", "bob")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("acked 1100 signal(s): ") and out.stdout.rstrip().endswith("and 1080 more")
    assert len(db_rows(sid, "SELECT * FROM signal_reads WHERE agent_id = 'bob'")) == 1100
    with SessionStore.open(ws, sid) as store, store.write() as conn:
        for i in range(1100):
            signals.send(conn, caller="alice", recipient="bob", content=f"more {i}", config=ws.config,
                         now=NOW, rate_limited=False)
    answer = actions.ack_signals(ws, Who("bob", sid), None, all=True, env={}, now=NOW)
    assert answer["acked_count"] == 1100 and len(answer["acked"]) == actions.ACKED_SHOWN
    assert len(json.dumps(answer)) < 256 * 1024


def test_whiteboard_pages_by_key(ws, start_agent, cli):
    sid = start_agent("alice")["session_id"]
    for i in range(130):
        actions.whiteboard_write(ws, Who("alice", sid), f"k{i:03d}", "v" * (2000 if i >= 120 else 10), env={})
    first = actions.whiteboard_read(ws, Who("alice", sid), env={}, now=NOW)
    assert [e["key"] for e in first["entries"]] == [f"k{i:03d}" for i in range(100)]
    assert first["remaining"] == 30 and first["next_after"] == "k099"
    rest = json.loads(cli("whiteboard-read", "--agent-id", "alice", "--after", "k099", "--limit", "25",
                          "--json").stdout)
    assert [e["key"] for e in rest["entries"]] == [f"k{i:03d}" for i in range(100, 125)]
    assert rest["remaining"] == 5 and rest["next_after"] == "k124"
    for i in range(30):
        actions.whiteboard_write(ws, Who("alice", sid), f"big{i:02d}", "x" * 40000, env={})
    big = actions.whiteboard_read(ws, Who("alice", sid), after="big", env={}, now=NOW)
    assert len(big["entries"]) == 1 and big["remaining"] == 29 + 130  # 40 KB each: one per 48 KB page
    text = cli("whiteboard-read", "--agent-id", "alice").stdout
    assert text.splitlines()[-1] == "-- 159 more entries: `synapolis whiteboard-read --after big00`"


def test_status_shows_a_hostile_task_as_escapes(ws, put_heartbeat, cli):
    from datetime import datetime, timezone

    from synapolis.timeutil import format_ts

    now = datetime.now(timezone.utc)
    put_heartbeat("mallory", format_ts(now), written_at=now, task="\x1b]0;owned\x07\x1b[2Jwork")
    out = cli("status")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b]0;owned\\x07" in out.stdout


@pytest.mark.parametrize("left_out", ["the broadcasts' index", "idempotency keys"])
def test_a_store_at_version_3_of_either_kind_is_completed(ws, start_agent, left_out):
    """Version 3 was the broadcasts' index on one branch and idempotency keys on another; 4 has both, so a
    session.db at 3 with either one missing gets the other when opened, and keeps its signals."""
    left = {"the broadcasts' index": ["DROP INDEX signals_broadcasts_by_sender"],
            "idempotency keys": ["DROP INDEX signals_by_key", "ALTER TABLE signals DROP COLUMN idempotency_key",
                                 "DROP TABLE note_keys"]}[left_out]
    sid, path = older_store(ws, start_agent, 3, *left)
    page = actions.read_signals(ws, Who("bob", sid), env={}, now=NOW)
    assert [s["content"] for s in page["signals"]] == ["before the upgrade"]
    sent = actions.signal(ws, Who("alice", sid), "bob", "keyed", env={}, now=NOW, idempotency_key="k1")
    again = actions.signal(ws, Who("alice", sid), "bob", "keyed", env={}, now=NOW, idempotency_key="k1")
    assert again["replayed"] is True and again["signal"]["id"] == sent["signal"]["id"]
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 6
    names = {row[0] for row in check.execute("SELECT name FROM sqlite_master")}
    assert {"signals_broadcasts_by_sender", "signals_by_key", "note_keys"} <= names
    check.close()


def test_a_schema_5_store_keeps_its_token_buckets_in_the_registry_after_the_upgrade(ws, start_agent):
    """Schema 6 moves each agent's token bucket into its registry row: a session.db of schema 5 whose
    rate_buckets says alice has spent her tokens is migrated when opened, and her next send is refused with
    the wait her stored bucket gives, where a fresh bucket would have let it through; bob's full one sends."""
    from synapolis.errors import RateLimitedError

    moment = NOW.timestamp()
    sid, path = older_store(ws, start_agent, 5, "ALTER TABLE agents DROP COLUMN tokens",
                            "ALTER TABLE agents DROP COLUMN bucket_at", "DELETE FROM rate_buckets",
                            f"INSERT INTO rate_buckets VALUES ('alice', 0.5, {moment!r})")
    with pytest.raises(RateLimitedError) as refused:
        actions.signal(ws, Who("alice", sid), "bob", "one too many", env={}, now=NOW)
    assert refused.value.retry_after_s == pytest.approx(0.5 / (ws.config.rate_limit_per_min / 60.0))
    actions.signal(ws, Who("bob", sid), "alice", "a full bucket", env={}, now=NOW)
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 6
    assert check.execute("SELECT id, tokens, bucket_at FROM agents ORDER BY id").fetchall() == [
        ("alice", 0.5, moment), ("bob", ws.config.rate_limit_per_min - 1.0, moment)]
    check.close()
