"""The MCP server through the SDK's in-process client, in both protocol modes: every tool, errors, resources, push."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys

import anyio
import pytest

pytest.importorskip("mcp")
# the handshake-era resources/subscribe is tested on purpose; the SDK warns that 2026-07-28 removed it
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

from mcp import Client, MCPError  # noqa: E402

from conftest import DEADLINE_S, Inbox, fails, ok, ts_sdk1_check, wait_until  # noqa: E402
from synapolis import actions  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.mcp.server import create_server  # noqa: E402
from synapolis.mcp.watch import inbox_uri, notes_uri, parse_uri  # noqa: E402
from synapolis.store import store_for  # noqa: E402
from synapolis.errors import UsageError  # noqa: E402

LEGACY, MODERN = "legacy", "2026-07-28"
MODES = [LEGACY, MODERN]
TOOLS = {"start_session", "beat", "signal", "read_signals", "ack_signals", "signals_pending", "read_notes", "note",
         "list_agents", "write_whiteboard", "read_whiteboard", "tired", "claim", "release", "claim_check",
         "guard"}


def run(fn, *args):
    anyio.run(fn, *args)


@contextlib.asynccontextmanager
async def alice_and_bob(server, mode):
    """Two clients of two servers on one state dir, started as alice and bob in one session."""
    async with Client(server(), mode=mode) as a, Client(server(), mode=mode) as b:
        session = (await ok(a, "start_session", agent_id="alice"))["session_id"]
        assert (await ok(b, "start_session", agent_id="bob"))["session_id"] == session
        yield a, b, session


@pytest.fixture
def server(ws, monkeypatch):
    """A fresh in-process server on this test's state dir (on the store of `store_kind`: tests using it run
    on SQLite and PostgreSQL), with an empty environment (no SYNAPOLIS_*). This process then pools its
    PostgreSQL connections, as `synapolis mcp` does (`keep_connections()`), undone after the test."""
    from synapolis import store

    monkeypatch.setattr(store, "_LONG_LIVED", True)
    yield lambda env=None, **kw: create_server(ws.root, env or {}, **kw)
    store.close_all()


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_every_tool_structured_and_small(server, mode):
    async def main():
        async with Client(server(), mode=mode) as c:
            listed = await c.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            for tool in listed.tools:
                assert "pending_signals" in tool.output_schema["required"], tool.name
                assert len(tool.description) <= 200, tool.name
            size = len(json.dumps([t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]))
            assert size < 12000
            templates = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
            assert templates == {"synapolis://session/{session_id}/inbox/{agent_id}",
                                 "synapolis://session/{session_id}/notes"}
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_start_session_is_remembered_and_signals_travel(server, state_dir, mode):
    async def main():
        async with Client(server(), mode=mode) as a, Client(server(), mode=mode) as b:
            alice = await ok(a, "start_session", agent_id="alice", harness="test", substrate="Model X")
            assert alice["agent_id"] == "alice" and alice["run_token"] and alice["status"] == "active"
            bob = await ok(b, "start_session", agent_id="bob")
            assert bob["session_id"] == alice["session_id"]  # joined the only active session

            beat = await ok(a, "beat", task="review", status="active")  # no identity given: remembered
            assert beat["heartbeat"]["agent_id"] == "alice" and beat["heartbeat"]["task"] == "review"
            on_disk = json.loads((state_dir / "heartbeats" / "alice.json").read_text())
            assert on_disk["seq"] == beat["heartbeat"]["seq"] and on_disk["task"] == "review"

            sent = await ok(a, "signal", to="bob", content="take #12", type="delegate")
            assert sent["signal"]["sender"] == "alice" and sent["audience"]["live"] == ["bob"]
            sig_id = sent["signal"]["id"]

            got = await ok(b, "beat")  # piggyback: the answer carries it, marked delivered
            assert [s["id"] for s in got["pending_signals"]] == [sig_id]
            assert (await ok(b, "beat"))["pending_signals"] == []  # delivered once

            unread = await ok(b, "read_signals")
            assert [s["id"] for s in unread["signals"]] == [sig_id] and unread["signals"][0]["read"] is False
            acked = await ok(b, "ack_signals", signal_ids=[sig_id[:10]])
            assert acked["acked"] == [sig_id]
            assert (await ok(b, "read_signals"))["signals"] == []
            assert len((await ok(b, "read_signals", unread_only=False))["signals"]) == 1

            await ok(a, "signal", to="*", content="all hands")
            pending = await ok(b, "signals_pending")
            assert [s["content"] for s in pending["pending_signals"]] == ["all hands"]
            assert (await ok(b, "ack_signals", all=True))["acked"]
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_errors_are_tool_errors_with_the_contract_message(server, mode):
    async def main():
        async with Client(server(), mode=mode) as a:
            # no identity at all: nothing in env, no start_session, no identity.json
            await fails(a, "beat", "NoIdentityError", 4)
            await ok(a, "start_session", agent_id="alice")
            msg = await fails(a, "signal", "UsageError", 2, to="../../etc/passwd", content="x")
            assert "../../etc/passwd" in msg and "^[A-Za-z0-9_.-]+$" in msg
            await fails(a, "start_session", "UsageError", 2, agent_id="a/../../b")
            await fails(a, "start_session", "UsageError", 2, agent_id="")
            await fails(a, "signal", "NotFoundError", 6, to="nobody", content="x")
            await fails(a, "signal", "ForbiddenError", 7, to="*", content="x", sender_id="mallory")
            await fails(a, "signal", "UsageError", 2, to="*", content="x" * 70000)
            await fails(a, "beat", "ForbiddenError", 7, run_token="not-the-token")
            await fails(a, "beat", "UsageError", 2, status="bogus")
            await fails(a, "read_signals", "UsageError", 2, limit=0)
            await fails(a, "signal", "UsageError", 2, content="missing to")
            await fails(a, "no_such_tool", "UsageError", 2)
            await fails(a, "ack_signals", "UsageError", 2)
            await fails(a, "ack_signals", "NotFoundError", 6, signal_ids=["deadbeefdeadbeef"])
            await fails(a, "read_whiteboard", "NotFoundError", 6, key="never-written")
            await fails(a, "list_agents", "NotFoundError", 6, session_id="no-such-session")
    run(main)


@pytest.mark.sqlite_only  # writes a damaged SQLite file itself (PostgreSQL's faults: tests/test_store_postgres.py)
@pytest.mark.parametrize("mode", MODES)
def test_a_damaged_sqlite_store_is_an_error_answer_not_a_crash(server, state_dir, mode):
    async def main():
        async with Client(server(), mode=mode) as a:
            await ok(a, "start_session", agent_id="alice")
            broken = state_dir / "sessions" / "broken" / "session.db"
            broken.parent.mkdir(parents=True)
            broken.write_bytes(b"this is not a database" * 100)
            (broken.parent / "session.json").write_text(json.dumps(
                {"session_id": "broken", "status": "active", "created_at": "2030-01-01T00:00:00Z", "ended_at": None}))
            result = await a.call_tool("list_agents", {"session_id": "broken"})
            assert result.is_error and " (exit " in result.content[0].text and "Traceback" not in result.content[0].text
            assert (await ok(a, "beat"))["heartbeat"]["agent_id"] == "alice"
    run(main)


def test_identity_from_env_and_explicit_per_call(server, state_dir, cli):
    started = cli("start", "--agent-id", "carol", "--json")
    assert started.returncode == 0, started.stderr
    carol = json.loads(started.stdout)
    dave = json.loads(cli("start", "--agent-id", "dave", "--json").stdout)

    async def main():
        env = {"SYNAPOLIS_AGENT_ID": "carol", "SYNAPOLIS_SESSION_ID": carol["session_id"],
               "SYNAPOLIS_RUN_TOKEN": carol["run_token"]}
        async with Client(server(env), mode=MODERN) as c:
            assert (await ok(c, "beat", task="from env"))["heartbeat"]["agent_id"] == "carol"
            sent = await ok(c, "signal", to="dave", content="hello", sender_id="carol.helper")
            assert sent["signal"]["sender"] == "carol.helper"
        async with Client(server(), mode=LEGACY) as c:  # nothing remembered, nothing in env: say who per call
            got = await ok(c, "beat", agent_id="dave", run_token=dave["run_token"])
            assert got["heartbeat"]["agent_id"] == "dave"
            assert [s["content"] for s in got["pending_signals"]] == ["hello"]
            await fails(c, "beat", "ForbiddenError", 7, agent_id="dave", run_token=carol["run_token"])
            await fails(c, "signal", "ForbiddenError", 7, to="carol", content="x", agent_id="dave",
                        sender_id="carol")
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_notes_whiteboard_and_agents(server, mode):
    async def main():
        async with alice_and_bob(server, mode) as (a, b, session):
            noted = await ok(a, "note", text="migrations done")
            assert noted["note"]["agent_id"] == "alice" and noted["note"]["text"] == "migrations done"
            notes = await ok(b, "read_notes", limit=5)
            assert [n["text"] for n in notes["notes"]] == ["migrations done"]
            entry = await ok(a, "write_whiteboard", key="release", value="v1.2")
            assert entry["entry"]["value"] == "v1.2" and entry["entry"]["updated_by"] == "alice"
            assert (await ok(b, "read_whiteboard", key="release"))["entry"]["value"] == "v1.2"
            assert [e["key"] for e in (await ok(b, "read_whiteboard"))["entries"]] == ["release"]
            agents = await ok(b, "list_agents", session_id=session)
            assert {x["id"] for x in agents["agents"]} == {"alice", "bob"}
            assert all(x["effective_status"] == "active" for x in agents["agents"])
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_tired_and_claims(server, mode):
    async def main():
        async with alice_and_bob(server, mode) as (a, b, session):
            held = await ok(a, "claim", item="src/api/users.py", ttl_s=60)
            token = held["claim"]["token"]
            assert held["claim"]["claimed_by"] == "alice"
            await ok(b, "claim_check", item="src/api/users.py", token=token)
            await fails(b, "claim", "ConflictError", 3, item="src/api/users.py")
            # the guard (contract §14): the same answer as the CLI's --json, blocking bob, not alice
            asked = await ok(b, "guard", paths=["src/api/users.py", "src/free.py"])
            assert asked["allowed"] is False and [(x["path"], x["claimed_by"], x["item"], x["token"])
                                                  for x in asked["blocked"]] == [("src/api/users.py", "alice",
                                                                                  "src/api/users.py", token)]
            assert (await ok(a, "guard", paths=["src/api/users.py"]))["allowed"] is True
            await fails(b, "release", "ForbiddenError", 7, item="src/api/users.py")
            await fails(b, "release", "UsageError", 2, item="src/api/users.py", force=True)
            await fails(b, "claim", "UsageError", 2, item="../etc/passwd")
            await ok(a, "release", item="src/api/users.py")
            await fails(b, "claim_check", "ForbiddenError", 7, item="src/api/users.py", token=token)
            await fails(b, "claim_check", "NotFoundError", 6, item="ticket:999", token=1)
            again = await ok(b, "claim", item="src/api/users.py")
            assert again["claim"]["token"] > token

            first = await ok(a, "tired", memories=["use WAL mode", {"text": "retry on busy", "key": "busy"}])
            assert first["outcome"] == "standby" and first["active_others"] == 1 and first["staged"] == 2
            last = await ok(b, "tired", memories="[\"use  wal MODE\"]")
            assert last["outcome"] == "consolidated" and last["merged"] >= 2
            await fails(b, "tired", "UsageError", 2, memories="{not json")
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_inbox_resource_delivers_with_push_and_notes_resource(server, mode):
    async def main():
        async with alice_and_bob(server, mode) as (a, b, session):
            sig_id = (await ok(a, "signal", to="bob.reviewer", content="look"))["signal"]["id"]
            await ok(a, "note", text="n1")

            read = await b.read_resource(inbox_uri(session, "bob"))
            doc = json.loads(read.contents[0].text)
            assert [s["id"] for s in doc["signals"]] == [sig_id]
            assert read.contents[0].mime_type == "application/json"
            assert (await ok(b, "signals_pending"))["pending_signals"] == []  # already delivered (push)
            unread = (await ok(b, "read_signals"))["signals"]
            assert unread[0]["id"] == sig_id and unread[0]["read"] is False and unread[0]["delivered_at"]
            assert unread[0].get("delivery_method", "push") == "push"

            notes = json.loads((await b.read_resource(notes_uri(session))).contents[0].text)
            assert [n["text"] for n in notes["notes"]] == ["n1"]

            for bad in (inbox_uri("no-such-session", "bob"), inbox_uri(session, "nobody"),
                        "synapolis://session/%2E%2E/inbox/bob"):
                with pytest.raises(MCPError):
                    await b.read_resource(bad)
    run(main)


def test_parse_uri_refuses_what_is_not_ours():
    assert parse_uri(inbox_uri("s1", "a.b")) == ("inbox", "s1", "a.b")
    assert parse_uri(notes_uri("s1")) == ("notes", "s1", None)
    for bad in ("synapolis://session/../inbox/a", "synapolis://session/s/inbox/a/b", "file:///etc/passwd",
                "synapolis://session/s/inbox/..", "synapolis://session/s/outbox/a"):
        with pytest.raises(UsageError):
            parse_uri(bad)


# -- push: a signal stored by another process reaches the subscriber ------------------------------------
async def _cli(cli, *args):
    done = await anyio.to_thread.run_sync(lambda: cli(*args))
    assert done.returncode == 0, done.stderr
    return done


def test_legacy_subscribe_is_notified_of_a_cli_signal(server, cli, ws, db_rows):
    async def main():
        seen = Inbox()
        async with Client(server(), mode=LEGACY, message_handler=seen) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            for other in ("alice", "carol"):  # set-up in-process; the sends below come from CLI processes
                actions.start(ws, agent_id=other, session_id=session, env={}, write_identity=False)
            mine, carols = inbox_uri(session, "bob"), inbox_uri(session, "carol")
            await b.session.subscribe_resource(mine)
            # a signal for someone else first: had it notified bob, that would arrive first
            await _cli(cli, "signal", "carol", "not for bob", "--agent-id", "alice")
            await _cli(cli, "signal", "bob", "for bob", "--agent-id", "alice")
            await seen.wait_for(mine)
            assert seen.uris == [mine]
            doc = json.loads((await b.read_resource(mine)).contents[0].text)
            assert [s["content"] for s in doc["signals"]] == ["for bob"]

            await b.session.unsubscribe_resource(mine)
            await b.session.subscribe_resource(carols)
            await _cli(cli, "signal", "bob", "after unsubscribe", "--agent-id", "alice")
            await _cli(cli, "signal", "carol", "second for carol", "--agent-id", "alice")
            await seen.wait_for(carols)
            assert seen.uris == [mine, carols]
        # the watcher held a read connection all along; every signal the CLI stored is there once
        assert db_rows(session, "SELECT count(*) AS n FROM signals") == [{"n": 4}]
    run(main)


@pytest.mark.sqlite_only  # SQLite's file itself: the watcher's long-held read connection leaves it sound
def test_a_watchers_read_connection_leaves_the_sqlite_file_sound(server, cli, ws, state_dir):
    async def main():
        seen = Inbox()
        async with Client(server(), mode=LEGACY, message_handler=seen) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            actions.start(ws, agent_id="alice", session_id=session, env={}, write_identity=False)
            await b.session.subscribe_resource(inbox_uri(session, "bob"))
            for i in range(3):
                await _cli(cli, "signal", "bob", f"n{i}", "--agent-id", "alice")
            await seen.wait_for(inbox_uri(session, "bob"))
        db = sqlite3.connect(str(state_dir / "sessions" / session / "session.db"))
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM signals").fetchone()[0] == 3
    run(main)


def test_a_waiting_verb_never_holds_up_a_push(server, ws):
    """Verbs run on the event loop only while nobody subscribed; a subscriber's push never waits behind one
    (here a claim waiting for its holder)."""
    from mcp.types import CallToolResult

    async def main():
        seen = Inbox()
        async with Client(server(), mode=LEGACY, message_handler=seen) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            alice = actions.start(ws, agent_id="alice", session_id=session, env={}, write_identity=False)
            who = Who("alice", session, alice["run_token"])
            actions.claim(ws, who, "ticket:1", env={})
            mine = inbox_uri(session, "bob")
            await b.session.subscribe_resource(mine)
            answer: list[CallToolResult] = []

            async def wait_for_the_claim():
                answer.append(await b.call_tool("claim", {"item": "ticket:1", "wait_s": 4}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_the_claim)
                await anyio.to_thread.run_sync(lambda: wait_until(  # the claim is waiting now: its waiter is recorded
                    lambda: [w for w in store_for(ws).waits() if (w["agent_id"], w["item"]) == ("bob", "ticket:1")],
                    DEADLINE_S, "bob's claim to wait"))
                await anyio.to_thread.run_sync(lambda: actions.signal(ws, who, "bob", "while you wait", env={}))
                await seen.wait_for(mine)
                assert answer == []  # the push came while the claim still waited
            assert answer[0].is_error and answer[0].content[0].text.startswith("ConflictError (exit 3)")
    run(main)


def _another_writer_mid_transaction(ws, session):
    """A connection of another writer holding the store locked for writes, as a process on another machine
    could (SQLite: BEGIN IMMEDIATE on session.db; PostgreSQL: the whiteboard's table, session_state, locked): COMMIT it, close it."""
    url = ws.config.values.get("store") or "sqlite"
    if url.startswith("postgresql://"):
        import psycopg

        locker = psycopg.connect(url, autocommit=True)
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE session_state IN EXCLUSIVE MODE")
        return locker
    locker = sqlite3.connect(str(ws.paths.session_db(session)), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    return locker


def _note_beside_the_lock(ws, session, text):
    """A note stored where the lock above does not reach: SQLite's notes.jsonl (outside session.db), or
    PostgreSQL's notes table (with a transaction of its own)."""
    from synapolis import board
    from synapolis.store import open_session, store_for
    from synapolis.timeutil import utcnow

    if not (ws.config.values.get("store") or "").startswith("postgresql://"):
        return board.append_note(ws, session, "bob", text, utcnow())
    with store_for(ws).note_appender(session) as add, open_session(ws, session).write() as tx:
        return add(tx, "bob", text, utcnow())


def test_once_subscribed_a_verb_on_a_locked_store_waits_off_the_event_loop(server, ws):
    """Before any subscription verbs run on the event loop; after one, on threads: a verb waiting for a store
    that another process holds locked (up to busy_timeout_ms) does not hold up the notes push."""
    async def main():
        seen = Inbox()
        async with Client(server(), mode=LEGACY, message_handler=seen) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            await b.session.subscribe_resource(notes_uri(session))
            locker = _another_writer_mid_transaction(ws, session)
            answer = []

            async def write():
                answer.append(await b.call_tool("write_whiteboard", {"key": "k", "value": "v"}))

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write)
                    # a fixed sleep: a writer waiting in SQLite's busy handler leaves no trace another process can
                    # see, so the call gets a moment to reach its wait (the push must come while it waits)
                    await anyio.sleep(0.3)
                    await anyio.to_thread.run_sync(lambda: _note_beside_the_lock(ws, session, "meanwhile"))
                    await seen.wait_for(notes_uri(session))
                    assert answer == []
                    locker.execute("COMMIT")
            finally:
                locker.close()
            assert not answer[0].is_error, answer[0].content[0].text
    run(main)


def test_listen_stream_is_notified_of_cli_signals_and_notes(server, cli, ws):
    async def main():
        async with Client(server(), mode=MODERN) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            actions.start(ws, agent_id="alice", session_id=session, env={}, write_identity=False)
            mine, notes = inbox_uri(session, "bob"), notes_uri(session)
            async with b.listen(resource_subscriptions=[mine, notes, "file:///not/ours"]) as stream:
                await _cli(cli, "signal", "*", "broadcast", "--agent-id", "alice")
                with anyio.fail_after(DEADLINE_S):
                    event = await stream.__anext__()
                assert event.uri == mine
                await _cli(cli, "note", "a note", "--agent-id", "alice")
                with anyio.fail_after(DEADLINE_S):
                    event = await stream.__anext__()
                assert event.uri == notes
            doc = json.loads((await b.read_resource(mine)).contents[0].text)
            assert [s["content"] for s in doc["signals"]] == ["broadcast"]
    run(main)


def test_subscribe_refuses_foreign_uris(server):
    async def main():
        async with Client(server(), mode=LEGACY) as c:
            for bad in ("file:///etc/passwd", "synapolis://session/../inbox/x"):
                with pytest.raises(MCPError) as err:
                    await c.session.subscribe_resource(bad)
                assert "UsageError (exit 2)" in str(err.value)
    run(main)


def test_other_verbs_never_import_the_sdk(state_dir, tmp_path):
    import subprocess

    probe = ("import sys; from synapolis.cli import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "bad = sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_types', 'watchdog')))\n"
             "print('LOADED', bad)")
    for args in (["--help"], ["--state-dir", str(state_dir), "beat", "--agent-id", "x"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=60)
        assert "LOADED []" in out.stdout, (args, out.stdout, out.stderr)


def test_watcher_falls_back_to_polling_when_inotify_is_unavailable(server, cli, ws, monkeypatch):
    """An inotify limit (ENOSPC) at start-up: the server still pushes, through the polling observer."""
    import watchdog.observers

    class NoInotify(watchdog.observers.Observer):
        def start(self):
            raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(watchdog.observers, "Observer", NoInotify)

    async def main():
        seen = Inbox()
        srv = server()
        async with Client(srv, mode=LEGACY, message_handler=seen) as b:
            session = (await ok(b, "start_session", agent_id="bob"))["session_id"]
            assert srv.state.watcher is None  # no subscriber yet: nothing to watch for
            actions.start(ws, agent_id="alice", session_id=session, env={}, write_identity=False)
            await b.session.subscribe_resource(inbox_uri(session, "bob"))
            assert srv.state.watcher.observer_kind == "PollingObserver"
            await _cli(cli, "signal", "bob", "polled", "--agent-id", "alice")
            await seen.wait_for(inbox_uri(session, "bob"))
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_nasty_inputs_never_crash_the_server(server, ws, store_kind, mode):
    async def main():
        async with alice_and_bob(server, mode) as (a, b, session):
            await fails(a, "write_whiteboard", "UsageError", 2, key="k", value="v" * 70000)
            await fails(a, "note", "UsageError", 2, text="x" * 70000)
            await fails(a, "claim", "UsageError", 2, item="a/../b")
            await fails(a, "claim", "UsageError", 2, item="x", ttl_s=-1)
            await fails(a, "beat", "UsageError", 2, ttl_s="soon")
            await fails(a, "tired", "UsageError", 2, memories=[{"no_text": 1}])
            await fails(a, "signal", "UsageError", 2, to="bob", content="x", type="shout")
            await fails(a, "read_notes", "UsageError", 2, session_id="../../etc")
            await fails(a, "list_agents", "UsageError", 2, session_id="a/b")
            nasty = "naïve ☃ \u0000 \"quoted\" {json}"
            if store_kind == "postgres":  # its text cannot hold U+0000 (docs/STORE.md): refused whole, not stored
                msg = await fails(a, "signal", "UsageError", 2, to="bob", content=nasty)
                assert "NUL character" in msg
                await fails(a, "note", "UsageError", 2, text="a\u0000b")
                assert (await ok(b, "read_signals"))["signals"] == []
                assert (await ok(b, "read_notes"))["notes"] == []
                nasty = nasty.replace("\u0000", "")
            unicode = await ok(a, "signal", to="bob", content=nasty)
            got = await ok(b, "read_signals")
            assert [s["content"] for s in got["signals"]] == [nasty] == [unicode["signal"]["content"]]
            assert (await ok(b, "beat"))["heartbeat"]["agent_id"] == "bob"
    run(main)


# -- what independent clients see (issue 12) and who may read an inbox (issue 11) ----------------------

@pytest.mark.parametrize("mode", MODES)
def test_an_error_from_every_tool_reaches_a_typescript_1x_client_as_our_line(server, mode):
    """Each tool that can fail, failing: the result passes a TS SDK 1.x client's output-schema check, so
    the model reads '<Type> (exit N): message' and not '-32602 Structured content does not match'."""
    failing = {
        "start_session": ("UsageError", 2, {"agent_id": "a/../b"}),
        "beat": ("UsageError", 2, {"status": "bogus"}),
        "signal": ("NotFoundError", 6, {"to": "nobody", "content": "x"}),
        "read_signals": ("UsageError", 2, {"limit": 0}),
        "ack_signals": ("NotFoundError", 6, {"signal_ids": ["deadbeefdeadbeef"]}),
        "signals_pending": ("ForbiddenError", 7, {"run_token": "wrong"}),
        "read_notes": ("NotFoundError", 6, {"session_id": "no-such-session"}),
        "note": ("UsageError", 2, {"text": "x" * 70000}),
        "list_agents": ("NotFoundError", 6, {"session_id": "no-such-session"}),
        "write_whiteboard": ("UsageError", 2, {"key": "", "value": "v"}),
        "read_whiteboard": ("NotFoundError", 6, {"key": "never-written"}),
        "tired": ("UsageError", 2, {"memories": "{not json"}),
        "claim": ("UsageError", 2, {"item": "../etc/passwd"}),
        "release": ("NotFoundError", 6, {"item": "ticket:1"}),
        "claim_check": ("NotFoundError", 6, {"item": "ticket:999", "token": 1}),
        "guard": ("UsageError", 2, {"paths": ["x" * 5000]}),
    }
    assert set(failing) == TOOLS

    async def main():
        async with Client(server(), mode=mode) as a:
            await ok(a, "start_session", agent_id="alice")
            schemas = {t.name: t.output_schema for t in (await a.list_tools()).tools}
            for tool, (type_name, code, args) in failing.items():
                result = await a.call_tool(tool, args)
                assert result.is_error and result.structured_content is None, tool
                assert result.content[0].text.startswith(f"{type_name} (exit {code}): "), (tool, result.content)
                ts_sdk1_check(result, schemas[tool])
            # and a success still carries structured content that passes the same check
            ts_sdk1_check(await a.call_tool("beat", {}), schemas["beat"])
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_hints_and_capabilities_say_only_what_is_true(server, mode):
    async def main():
        async with Client(server(), mode=mode) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            read_only = {n for n, t in tools.items() if t.annotations and t.annotations.read_only_hint}
            # every other tool refreshes a heartbeat or marks delivery
            assert read_only == {"claim_check", "guard"}
            # no prompts (there are none), in the handshake's answer and in server/discover's alike (a client
            # pinned to 2026-07-28 assumes capabilities until it asks); subscriptions in both eras
            if mode == LEGACY:
                caps = c.server_capabilities.model_dump(by_alias=True, exclude_none=True)
            else:
                caps = (await c.session.send_discover(MODERN))["capabilities"]
            assert "prompts" not in caps and "tools" in caps and caps["resources"]["subscribe"] is True
            templates = (await c.list_resource_templates()).resource_templates
            assert {t.name for t in templates} == {"inbox", "notes"}
            for t in templates:
                assert "{" not in t.description and "}" not in t.description, t.description
    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_inbox_resource_read_by_a_stranger_is_refused_and_marks_nothing(server, state_dir, db_rows, mode):
    async def main():
        async with alice_and_bob(server, mode) as (a, b, session):
            await ok(a, "signal", to="bob", content="for bob only")
            async with Client(server(), mode=mode) as stranger:  # never started as anyone
                for reader in (a, stranger):
                    with pytest.raises(MCPError) as refused:
                        await reader.read_resource(inbox_uri(session, "bob"))
                    assert "exit 7" in str(refused.value) or "exit 4" in str(refused.value), refused.value
            assert db_rows(session, "SELECT * FROM signal_deliveries WHERE agent_id = 'bob'") == []
            got = await ok(b, "signals_pending")
            assert [s["content"] for s in got["pending_signals"]] == ["for bob only"]
    run(main)
