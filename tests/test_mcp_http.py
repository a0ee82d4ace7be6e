"""The team server's MCP over streamable HTTP (contract §13), with the SDK's own HTTP client against a real
`synapolis serve` process: every tool, tokens (none, wrong, pinned, read-only, revoked), identity per client,
push from another process."""

from __future__ import annotations

import json
import os
import time

import anyio
import pytest

pytest.importorskip("mcp")
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

import httpx2  # noqa: E402  (the SDK's HTTP client library)
from mcp import MCPError  # noqa: E402

from conftest import DEADLINE_S, Inbox, fails, mcp_http_client, ok, start_server, wait_until_async  # noqa: E402
from synapolis.mcp.watch import inbox_uri, notes_uri  # noqa: E402

LEGACY, MODERN = "legacy", "2026-07-28"
MODES = [LEGACY, MODERN]
PUSH_S = 2.0  # §13: push over HTTP within 2 s of a CLI signal


def run(fn, *args):
    anyio.run(fn, *args)


def tree(root) -> dict:
    """Every file under `root` with its size and mtime: what "nothing written" compares (SQLite's shared
    memory file changes on every read, so it is left out)."""
    out = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith("-shm"):
                continue
            path = os.path.join(folder, name)
            st = os.stat(path)
            if name.endswith("-wal") and st.st_size == 0:
                continue  # an empty WAL a reader made after the last writer's close removed it (Python < 3.12)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "0"}}}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "start_session", "arguments": {"agent_id": "mallory"}}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.mark.parametrize("mode", MODES)
def test_every_tool_over_http(served, cli, mode):
    alice_token = served.token("alice", "--agent", "alice")
    bob_token = served.token("bob", "--agent", "bob")

    async def main():
        async with mcp_http_client(served.url, alice_token, mode) as a, \
                mcp_http_client(served.url, bob_token, mode) as b:
            assert len((await a.list_tools()).tools) == 16
            session = (await ok(a, "start_session"))["session_id"]  # the token names the agent
            assert (await ok(b, "start_session", session_id=session))["agent_id"] == "bob"
            assert (await ok(a, "beat", task="http", session_id=session))["heartbeat"]["task"] == "http"
            sent = await ok(a, "signal", to="bob", content="over http", session_id=session)
            assert sent["signal"]["sender"] == "alice"
            unread = await ok(b, "read_signals", session_id=session)
            assert [s["content"] for s in unread["signals"]] == ["over http"]
            assert (await ok(b, "signals_pending", session_id=session))["pending_signals"][0]["content"] == "over http"
            assert (await ok(b, "ack_signals", all=True, session_id=session))["acked"] == [sent["signal"]["id"]]
            assert (await ok(a, "note", text="noted over http", session_id=session))["note"]["agent_id"] == "alice"
            assert [n["text"] for n in (await ok(b, "read_notes", session_id=session))["notes"]] == ["noted over http"]
            assert {x["id"] for x in (await ok(b, "list_agents", session_id=session))["agents"]} == {"alice", "bob"}
            await ok(a, "write_whiteboard", key="k", value="v", session_id=session)
            assert (await ok(b, "read_whiteboard", key="k", session_id=session))["entry"]["value"] == "v"
            held = await ok(a, "claim", item="src/app.py", session_id=session)
            await ok(b, "claim_check", item="src/app.py", token=held["claim"]["token"])
            await fails(b, "release", "ForbiddenError", 7, item="src/app.py", session_id=session)
            await ok(a, "release", item="src/app.py", session_id=session)
            assert (await ok(a, "tired", memories=["http works"], session_id=session))["outcome"] == "standby"
            assert (await ok(b, "tired", session_id=session))["outcome"] == "consolidated"
            # the resources too: bob reads his own inbox; the notes read as nobody
            notes = json.loads((await b.read_resource(notes_uri(session))).contents[0].text)
            assert [n["text"] for n in notes["notes"]] == ["noted over http"]
            return session

        return session

    session = anyio.run(main)
    # what another process sees: the CLI reads the note and the consolidated memory
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)
    assert [n["text"] for n in notes["notes"]] == ["noted over http"]
    ledger = (served.state_dir / "memory" / "ledger.jsonl").read_text()
    assert "http works" in ledger


def test_no_or_wrong_token_is_401_and_writes_nothing(served, cli):
    served.token("real")
    cli("start", "--agent-id", "secret-agent")
    before = tree(served.state_dir)
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        for headers in ({}, {"authorization": "Bearer syn_wrong"}, {"authorization": "Basic cmVhbDpyZWFs"},
                        {"authorization": "Bearer"}, {"authorization": "Bearer " + "x" * 5000}):
            for body in (INITIALIZE, CALL):
                answer = http.post("/mcp", json=body, headers={**HEADERS, **headers})
                assert answer.status_code == 401, answer.text
                assert "secret-agent" not in answer.text and "mallory" not in answer.text
                assert answer.headers["www-authenticate"].startswith("Bearer")
            for path in ("/api/status", "/api/dashboard", "/events"):
                answer = http.get(path, headers=headers)
                assert answer.status_code == 401 and "secret-agent" not in answer.text
            assert http.post("/api/post", data={"kind": "note", "text": "x"}, headers=headers).status_code == 401
        assert http.get("/healthz").json() == {"ok": True}
    assert tree(served.state_dir) == before  # not even a last-used time

    async def main():
        async with mcp_http_client(served.url, "syn_wrong") as c:
            await c.list_tools()

    with pytest.raises(Exception):
        run(main)
    assert tree(served.state_dir) == before


def test_api_status_is_status_json(served, cli):
    token = served.token("viewer", "--read-only")
    cli("start", "--agent-id", "carol")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        over_http = http.get("/api/status", headers={"authorization": f"Bearer {token}"}).json()
    local = json.loads(cli("status", "--json").stdout)
    for doc in (over_http, local):
        doc.pop("generated_at")
        for agent in doc["agents"]:
            agent.pop("age_s")
    assert over_http == local and [a["agent_id"] for a in local["agents"]] == ["carol"]


@pytest.mark.parametrize("mode", [LEGACY])
def test_two_clients_of_one_server_never_act_as_each_other(served, mode):
    shared = served.token("team")  # one token, not pinned: each client is whoever it started as

    async def main():
        async with mcp_http_client(served.url, shared, mode) as a, mcp_http_client(served.url, shared, mode) as b:
            session = (await ok(a, "start_session", agent_id="alice"))["session_id"]
            await ok(b, "start_session", agent_id="bob", session_id=session)
            for _ in range(3):  # interleaved: neither start overwrote the other's identity
                assert (await ok(a, "beat"))["heartbeat"]["agent_id"] == "alice"
                assert (await ok(b, "beat"))["heartbeat"]["agent_id"] == "bob"
            assert (await ok(a, "signal", to="bob", content="from a"))["signal"]["sender"] == "alice"
            assert (await ok(b, "note", text="from b"))["note"]["agent_id"] == "bob"
            # a third client with the same token never started: it is nobody, not the last one to start
            async with mcp_http_client(served.url, shared, mode) as c:
                await fails(c, "beat", "NoIdentityError", 4)
                with pytest.raises(MCPError):
                    await c.read_resource(inbox_uri(session, "bob"))

    run(main)


def test_modern_http_remembers_per_token_and_client_and_never_borrows_the_servers_identity(served, cli):
    """2026-07-28 over HTTP has no sessions: what start_session made a client is kept for what its requests
    carry, the bearer token and the client identity in `_meta` (docs/MCP.md, "Identity"). The identity.json of
    the server's machine is never its identity (nor lends it a run token)."""
    from mcp_types import Implementation

    local = json.loads(cli("start", "--agent-id", "local-agent", "--json").stdout)
    token, other = served.token("team"), served.token("other")

    async def main():
        async with mcp_http_client(served.url, token, MODERN) as c:
            await fails(c, "beat", "NoIdentityError", 4)  # not local-agent of identity.json
            started = await ok(c, "start_session", agent_id="remote", session_id=local["session_id"])
            assert (await ok(c, "note", text="who am I?"))["note"]["agent_id"] == "remote"
            noted = await ok(c, "note", text="named", agent_id="remote", session_id=started["session_id"],
                             run_token=started["run_token"])
            assert noted["note"]["agent_id"] == "remote"
        # the same token and client, on a new connection: the same agent
        async with mcp_http_client(served.url, token, MODERN) as again:
            assert (await ok(again, "beat"))["heartbeat"]["agent_id"] == "remote"
        # another client (its clientInfo) or another token: nobody
        async with mcp_http_client(served.url, token, MODERN,
                                   client_info=Implementation(name="another-client", version="1")) as c2, \
                mcp_http_client(served.url, other, MODERN) as c3:
            await fails(c2, "beat", "NoIdentityError", 4)
            await fails(c3, "beat", "NoIdentityError", 4)

    run(main)
    identity = json.loads((served.state_dir / "identity.json").read_text())
    assert identity["agent_id"] == "local-agent"  # a remote start_session never rewrites it


def test_pinned_token_cannot_act_as_another_agent(served, cli):
    cli("start", "--agent-id", "bob")
    token = served.token("alice", "--agent", "alice")

    async def main():
        async with mcp_http_client(served.url, token) as a:
            await fails(a, "start_session", "ForbiddenError", 7, agent_id="bob")
            session = (await ok(a, "start_session"))["session_id"]
            bob_beat = (served.state_dir / "heartbeats" / "bob.json").read_text()
            for tool, args in (("beat", {}), ("note", {"text": "as bob"}), ("signal", {"to": "*", "content": "x"}),
                               ("claim", {"item": "ticket:1"}), ("tired", {}),
                               ("read_signals", {}), ("signals_pending", {})):
                await fails(a, tool, "ForbiddenError", 7, agent_id="bob", **args)
            await fails(a, "signal", "ForbiddenError", 7, to="*", content="x", sender_id="bob")
            with pytest.raises(MCPError):
                await a.read_resource(inbox_uri(session, "bob"))
            assert (served.state_dir / "heartbeats" / "bob.json").read_text() == bob_beat
            # its own sub-agents are its own
            sent = await ok(a, "signal", to="*", content="from my helper", sender_id="alice.helper")
            assert sent["signal"]["sender"] == "alice.helper"
            return session

    session = anyio.run(main)
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert notes == []
    assert json.loads(cli("claims", "--json").stdout)["claims"] == []


def test_only_an_inboxs_own_agent_is_told_of_its_news(served, cli):
    """A subscription tells its holder each time a signal arrives for that inbox: a token pinned to alice,
    or a read-only one, may not watch bob's (either way of subscribing), only alice's own and the notes."""
    session = json.loads(cli("start", "--agent-id", "bob", "--json").stdout)["session_id"]
    alice, viewer = served.token("alice", "--agent", "alice"), served.token("viewer", "--read-only")
    bobs, notes = inbox_uri(session, "bob"), notes_uri(session)

    async def main():
        for token, allowed in ((alice, [inbox_uri(session, "alice"), inbox_uri(session, "alice.helper"), notes]),
                               (viewer, [notes])):
            refused = [bobs] + ([inbox_uri(session, "alice")] if token == viewer else [])
            async with mcp_http_client(served.url, token) as c:
                for uri in refused:
                    with pytest.raises(MCPError) as err:
                        await c.session.subscribe_resource(uri)
                    assert "ForbiddenError (exit 7)" in str(err.value)
                for uri in allowed:
                    await c.session.subscribe_resource(uri)
            async with mcp_http_client(served.url, token, MODERN) as m:
                for uri in refused:
                    with pytest.raises(MCPError) as err:
                        async with m.listen(resource_subscriptions=[notes, uri]):
                            pass
                    assert "ForbiddenError (exit 7)" in str(err.value)
                async with m.listen(resource_subscriptions=allowed):
                    pass

    run(main)


def test_read_only_token_reads_and_never_writes(served, cli):
    started = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)
    session = started["session_id"]
    cli("note", "hello", "--agent-id", "alice")
    cli("whiteboard-write", "k", "v", "--agent-id", "alice")
    assert cli("claim", "src/held.py", "--agent-id", "alice").returncode == 0
    token = served.token("viewer", "--read-only")
    before = tree(served.state_dir / "sessions")
    beat_before = (served.state_dir / "heartbeats" / "alice.json").read_text()

    async def main():
        async with mcp_http_client(served.url, token) as r:
            assert [n["text"] for n in (await ok(r, "read_notes", session_id=session))["notes"]] == ["hello"]
            assert [a["id"] for a in (await ok(r, "list_agents", session_id=session))["agents"]] == ["alice"]
            assert (await ok(r, "read_whiteboard", key="k", session_id=session))["entry"]["value"] == "v"
            # the guard reads as nobody: a path a live agent holds is blocked for a read-only token
            asked = await ok(r, "guard", paths=["src/held.py", "src/free.py"])
            assert asked["agent_id"] is None and [b["path"] for b in asked["blocked"]] == ["src/held.py"]
            notes = json.loads((await r.read_resource(notes_uri(session))).contents[0].text)
            assert [n["text"] for n in notes["notes"]] == ["hello"]
            for tool, args in (("start_session", {}), ("beat", {}), ("note", {"text": "x"}),
                               ("signal", {"to": "*", "content": "x"}), ("write_whiteboard", {"key": "a", "value": "b"}),
                               ("claim", {"item": "ticket:1"}), ("release", {"item": "ticket:1"}), ("tired", {}),
                               ("ack_signals", {"all": True}), ("signals_pending", {})):
                await fails(r, tool, "ForbiddenError", 7, **args)
            await fails(r, "read_notes", "ForbiddenError", 7, agent_id="alice", session_id=session)
            # signals are read as nobody: alice's inbox is shown, not delivered (tests/test_identity_http.py)
            assert (await ok(r, "read_signals", agent_id="alice", session_id=session))["signals"] == []
            assert json.loads((await r.read_resource(inbox_uri(session, "alice"))).contents[0].text)["signals"] == []

    run(main)
    assert tree(served.state_dir / "sessions") == before
    assert (served.state_dir / "heartbeats" / "alice.json").read_text() == beat_before


def test_revoked_token_is_refused_from_the_next_request(served, cli):
    token = served.token("laptop")

    async def main():
        async with mcp_http_client(served.url, token) as c:
            await ok(c, "start_session", agent_id="alice")
            await ok(c, "beat")
            revoked = await anyio.to_thread.run_sync(lambda: cli("tokens", "revoke", "laptop"))
            assert revoked.returncode == 0, revoked.stderr
            with pytest.raises(Exception):
                await c.call_tool("beat", {})

    run(main)
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        assert http.post("/mcp", json=INITIALIZE, headers={**HEADERS, "authorization": f"Bearer {token}"}
                         ).status_code == 401
    listed = json.loads(cli("tokens", "list", "--json").stdout)
    assert listed == {"tokens": []}


def test_a_new_token_of_a_revoked_ones_name_cannot_continue_its_mcp_session(served, cli):
    """An MCP session belonged to the token's name: after `tokens revoke laptop` and a new `tokens create
    laptop` (given to someone else), the new token, presented with the old session's id, acted as the
    identity that session's start_session remembered, run token and all. A session is now the token's own."""
    old = served.token("laptop")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        opened = http.post("/mcp", json=INITIALIZE, headers={**HEADERS, "authorization": f"Bearer {old}"})
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        as_old = {**HEADERS, **session, "authorization": f"Bearer {old}"}
        http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=as_old)
        started = http.post("/mcp", json={**CALL, "params": {"name": "start_session",
                                                             "arguments": {"agent_id": "alice"}}}, headers=as_old)
        assert started.json()["result"]["structuredContent"]["agent_id"] == "alice", started.text
        assert cli("tokens", "revoke", "laptop").returncode == 0
        new = served.token("laptop")
        note = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "note", "arguments": {"text": "as the old session's alice"}}}
        taken = http.post("/mcp", json=note, headers={**as_old, "authorization": f"Bearer {new}"})
        assert taken.status_code == 404, taken.text  # the SDK's answer to a session that is not this token's
    assert json.loads(cli("read-notes", "--json", "--agent-id", "alice").stdout)["notes"] == []


def test_a_sequence_beyond_64_bits_is_a_page_of_nothing_not_an_internal_error(served, cli):
    """read_signals `after` (and the CLI's --after) past SQLite's 64-bit integers: InternalError (exit 1),
    'Python int too large to convert to SQLite INTEGER'. No signal has such a sequence: nothing is after it."""
    token = served.token("alice", "--agent", "alice")
    huge = 10 ** 23

    async def main():
        async with mcp_http_client(served.url, token) as c:
            await ok(c, "start_session", new_session=True)
            page = await ok(c, "read_signals", after=huge)
            assert page["signals"] == [] and page["remaining"] == 0
            everything = await ok(c, "read_signals", after=huge, unread_only=False)
            assert everything["signals"] == []

    run(main)
    done = cli("read-signals", "--agent-id", "alice", "--after", str(huge), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["signals"] == [], done.stderr


def test_a_revoked_tokens_open_push_streams_carry_nothing_more(served, cli):
    """Revocation reaches the streams a client opened before it: no push of what changed after it."""
    token = served.token("bob", "--agent", "bob")
    other = served.token("carol", "--agent", "carol")

    async def main():
        seen = Inbox()
        async with mcp_http_client(served.url, token, message_handler=seen) as b, \
                mcp_http_client(served.url, other, MODERN) as m:
            session = (await ok(b, "start_session"))["session_id"]
            await anyio.to_thread.run_sync(lambda: cli("start", "--agent-id", "alice", "--session-id", session))
            mine = inbox_uri(session, "bob")
            await b.session.subscribe_resource(mine)
            async with m.listen(resource_subscriptions=[notes_uri(session)]) as stream:
                done = await anyio.to_thread.run_sync(lambda: cli("signal", "bob", "one", "--agent-id", "alice"))
                assert done.returncode == 0, done.stderr
                await seen.wait_for(mine, DEADLINE_S)  # the standing GET stream works before
                assert cli("note", "first", "--agent-id", "alice", "--session-id", session).returncode == 0
                with anyio.fail_after(DEADLINE_S):
                    assert (await stream.__anext__()).uri == notes_uri(session)  # and so does the listen one
                pushed = len(seen.uris)
                for name in ("bob", "carol"):
                    assert cli("tokens", "revoke", name).returncode == 0
                assert cli("signal", "bob", "two", "--agent-id", "alice").returncode == 0
                assert cli("note", "second", "--agent-id", "alice", "--session-id", session).returncode == 0
                with anyio.move_on_after(PUSH_S + 1.0):
                    try:
                        event = await stream.__anext__()
                    except Exception:  # noqa: BLE001 - the stream ended: what must happen
                        event = None
                    else:
                        pytest.fail(f"a revoked token's listen stream carried {event}")
                # a fixed sleep: nothing shows that a push was NOT sent; the GET stream gets a window past the
                # listen stream's (which may have ended at once) for a wrongly sent one to arrive
                await anyio.sleep(0.5)
                assert len(seen.uris) == pushed, seen.uris[pushed:]

    run(main)


def test_tokens_are_stored_as_hashes_private_and_last_used(served, cli):
    token = served.token("laptop", "--agent", "alice")
    path = served.state_dir / "tokens.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert token not in path.read_text() and token.startswith("syn_")
    assert json.loads(cli("tokens", "list", "--json").stdout)["tokens"][0]["last_used_at"] is None
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        assert http.get("/api/status", headers={"authorization": f"Bearer {token}"}).status_code == 200
    listed = json.loads(cli("tokens", "list", "--json").stdout)["tokens"][0]
    assert listed["name"] == "laptop" and listed["agent_id"] == "alice" and listed["last_used_at"]
    assert "sha256" not in listed and "token" not in listed
    again = cli("tokens", "create", "laptop")
    assert again.returncode == 3 and "laptop" in again.stderr
    for bad in (("tokens", "create", "../x"), ("tokens", "create", "ok", "--agent", "a/b")):
        assert cli(*bad).returncode == 2
    assert cli("tokens", "revoke", "nobody").returncode == 6


def test_push_over_http_within_two_seconds_of_a_cli_signal(served, cli):
    token = served.token("bob", "--agent", "bob")

    async def main():
        seen = Inbox()
        async with mcp_http_client(served.url, token, message_handler=seen) as b:
            session = (await ok(b, "start_session"))["session_id"]
            await anyio.to_thread.run_sync(lambda: cli("start", "--agent-id", "alice", "--session-id", session))
            mine = inbox_uri(session, "bob")
            await b.session.subscribe_resource(mine)
            sent_at = time.monotonic()
            done = await anyio.to_thread.run_sync(lambda: cli("signal", "bob", "pushed", "--agent-id", "alice"))
            assert done.returncode == 0, done.stderr
            await seen.wait_for(mine, DEADLINE_S)
            # measured from the CLI's exit: the CLI's own start-up is not the server's delay
            assert time.monotonic() - sent_at < PUSH_S + 1.5
            doc = json.loads((await b.read_resource(mine)).contents[0].text)
            assert [s["content"] for s in doc["signals"]] == ["pushed"]

        # the 2026-07-28 way: a listen stream
        async with mcp_http_client(served.url, token, MODERN) as m:
            async with m.listen(resource_subscriptions=[mine]) as stream:
                done = await anyio.to_thread.run_sync(lambda: cli("signal", "bob", "again", "--agent-id", "alice"))
                assert done.returncode == 0
                with anyio.fail_after(PUSH_S):
                    event = await stream.__anext__()
                assert event.uri == mine

    run(main)


def test_serve_refuses_a_wide_address_without_tokens_and_warns_over_plain_http(state_dir, cli):
    refused = cli("serve", "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 2 and "token" in refused.stderr
    assert cli("serve", "--certfile", "/nonexistent").returncode == 2
    cli("tokens", "create", "t")
    proc, url = start_server(state_dir, "--host", "0.0.0.0")
    try:
        port = url.rsplit(":", 1)[1]
        with httpx2.Client(timeout=10) as http:
            assert http.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    said = "".join(proc.said)
    assert "warning" in said and "TLS" in said


def test_serve_on_any_loopback_address_answers_requests_naming_it(state_dir, cli):
    """`--host 127.0.0.2` (or any 127.x) is loopback, so serve checks Host against DNS rebinding, but only
    127.0.0.1, localhost and [::1] were allowed: every MCP request to the address served was 421 Invalid Host
    header. The address served is allowed too; another name still is not."""
    token = json.loads(cli("tokens", "create", "t", "--json").stdout)["token"]
    proc, url = start_server(state_dir, "--host", "127.0.0.2")
    try:
        assert url.startswith("http://127.0.0.2:")
        auth = {**HEADERS, "authorization": f"Bearer {token}"}
        with httpx2.Client(timeout=10) as http:
            answer = http.post(url + "/mcp", json=INITIALIZE, headers=auth)
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["serverInfo"]
            origin = http.post(url + "/mcp", json=INITIALIZE, headers={**auth, "origin": url})
            assert origin.status_code == 200, origin.text
            rebound = http.post(url + "/mcp", json=INITIALIZE, headers={**auth, "host": "evil.example"})
            assert rebound.status_code == 421
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_that_cannot_listen_says_why_in_one_line(served, cli, tmp_path):
    """A port another process holds, an address not this machine's, a certificate that is not one: uvicorn
    failed inside the server's task group, which printed an ExceptionGroup traceback and exited 3 (or said
    'InternalError: unexpected ExceptionGroup'). Now one line and the contract's exit code."""
    cli("tokens", "create", "t")
    taken = served.url.rsplit(":", 1)[1]
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    for args, code, words in ((("--port", taken), 3, "another process listens"),
                              (("--host", "192.0.2.1", "--port", "0"), 2, "cannot listen on 192.0.2.1"),
                              (("--port", "0", "--certfile", str(not_pem), "--keyfile", str(not_pem)), 2,
                               "not a certificate")):
        done = cli("serve", *args, timeout=30)
        assert done.returncode == code, (args, done.stderr)
        assert "Traceback" not in done.stderr and words in done.stderr.splitlines()[-1], done.stderr
        assert [line for line in done.stderr.splitlines() if line.startswith("synapolis: ")] == \
            [done.stderr.splitlines()[-1]]


def test_tls_with_certfile_and_keyfile(state_dir, cli, tmp_path):
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    token = json.loads(cli("tokens", "create", "tls", "--json").stdout)["token"]
    proc, url = start_server(state_dir, "--certfile", cert, "--keyfile", key)
    try:
        assert url.startswith("https://127.0.0.1:")
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx2.Client(base_url=url, verify=trust, timeout=10) as http:
            assert http.get("/healthz").json() == {"ok": True}
            cookie = http.post("/login", data={"token": token}, follow_redirects=False).headers["set-cookie"]
            assert "secure" in {part.strip().lower() for part in cookie.split(";")}
        with pytest.raises(httpx2.HTTPError):  # plain HTTP on the TLS port is no way in
            httpx2.get(url.replace("https://", "http://") + "/healthz", timeout=5)

        async def main():
            from mcp import Client
            from mcp.client.streamable_http import streamable_http_client

            http = httpx2.AsyncClient(verify=trust, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            async with Client(streamable_http_client(url + "/mcp", http_client=http), mode=LEGACY) as c:
                assert (await ok(c, "start_session", agent_id="over-tls"))["agent_id"] == "over-tls"

        run(main)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not any("warning" in line for line in proc.said)  # TLS on loopback: nothing to warn about


@pytest.mark.parametrize("plain", [False, True], ids=["as-installed", "plain-stack"])
def test_serve_runs_on_httptools_and_uvloop_where_installed_and_on_h11_and_asyncio_when_told(state_dir, cli, plain):
    """The HTTP parser and event loop serve picks (the `serve` extra's when installed), and SYNAPOLIS_SERVE_PLAIN=1
    for uvicorn's and Python's own: either way, the server says which it runs on and serves a tool call."""
    from importlib.util import find_spec

    from synapolis.web.serve import PLAIN_ENV

    token = json.loads(cli("tokens", "create", "stack", "--json").stdout)["token"]
    proc, url = start_server(state_dir, env={PLAIN_ENV: "1"} if plain else None)
    try:
        async def main():
            async with mcp_http_client(url, token, LEGACY) as c:
                assert (await ok(c, "start_session", agent_id="stacked"))["agent_id"] == "stacked"

        run(main)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    listening = next(line for line in proc.said if "listening on" in line)
    fast = not plain and find_spec("httptools") is not None
    assert ("; httptools" in listening) == fast and ("; h11" in listening) == (not fast)
    assert ("uvloop" in listening) == (not plain and find_spec("uvloop") is not None)


def test_a_call_waiting_on_a_locked_store_holds_up_no_other_client_push_or_page(served, cli):
    """A verb runs on the server's event loop only while it cannot wait: one whose session store another
    process holds locked waits on a worker thread instead. Meanwhile another client's calls (in another
    session), its push and the page's change event all go through; the lock is let go only after they did,
    so a stalled loop fails this test rather than slowing it. Then the waiting call succeeds, once."""
    from conftest import Holder, configure

    from synapolis.workspace import Workspace

    configure(Workspace.open(served.state_dir), busy_timeout_ms=60_000)  # the waiting call outlasts the test's steps
    alice_token = served.token("alice", "--agent", "alice")
    bob_token = served.token("bob", "--agent", "bob")

    async def main():
        seen = Inbox()
        changes = []
        async with mcp_http_client(served.url, alice_token) as alice, \
                mcp_http_client(served.url, bob_token, message_handler=seen) as bob, \
                httpx2.AsyncClient(base_url=served.url, timeout=60) as page, anyio.create_task_group() as tg:
            locked_session = (await ok(alice, "start_session", new_session=True))["session_id"]
            free_session = (await ok(bob, "start_session", new_session=True))["session_id"]
            assert locked_session != free_session
            for agent, session in (("dave", locked_session), ("carol", free_session)):
                done = await anyio.to_thread.run_sync(
                    lambda: cli("start", "--agent-id", agent, "--session-id", session))
                assert done.returncode == 0, done.stderr
            mine = inbox_uri(free_session, "bob")
            await bob.session.subscribe_resource(mine)
            listening = anyio.Event()

            async def watch_page():
                async with page.stream("GET", "/events", headers={"authorization": f"Bearer {bob_token}"}) as events:
                    async for line in events.aiter_lines():
                        if line == "event: hello":
                            listening.set()
                        elif line == "event: change":
                            changes.append(time.monotonic())

            tg.start_soon(watch_page)
            with anyio.fail_after(DEADLINE_S):
                await listening.wait()
            db = served.state_dir / "sessions" / locked_session / "session.db"
            waited = {}
            with Holder.store(db):
                async def signal_dave():
                    began = time.monotonic()
                    waited["result"] = await ok(alice, "signal", to="dave", content="once")
                    waited["s"] = time.monotonic() - began

                tg.start_soon(signal_dave)
                # a fixed sleep: alice's call waits in SQLite's busy handler, which leaves no trace another
                # process can see; a moment for it to get there, so what follows runs beside a waiting call
                await anyio.sleep(0.5)
                with anyio.fail_after(DEADLINE_S):  # all of it while alice's call still waits
                    await bob.send_ping()
                    entry = await ok(bob, "write_whiteboard", key="k", value="v")
                    assert entry["entry"]["value"] == "v"
                    assert (await ok(bob, "read_whiteboard", key="k"))["entry"]["value"] == "v"
                    await ok(bob, "read_signals")
                    before_push = time.monotonic()
                    done = await anyio.to_thread.run_sync(
                        lambda: cli("signal", "bob", "pushed", "--agent-id", "carol"))
                    assert done.returncode == 0, done.stderr
                    await seen.wait_for(mine, DEADLINE_S)
                    await wait_until_async(lambda: [t for t in changes if t > before_push], DEADLINE_S,
                                           "the page's change event")
                assert "result" not in waited, "alice's call did not wait for the locked store"
            # the lock is gone (its holder was killed): the waiting call goes through, and stores its signal once
            await wait_until_async(lambda: "result" in waited, DEADLINE_S, "the waiting call to go through")
            assert waited["result"]["signal"]["content"] == "once"
            read = await anyio.to_thread.run_sync(
                lambda: cli("read-signals", "--agent-id", "dave", "--session-id", locked_session, "--json"))
            assert read.returncode == 0, read.stderr
            assert [s["content"] for s in json.loads(read.stdout)["signals"]] == ["once"]
            tg.cancel_scope.cancel()

    run(main)
