"""Identity over MCP (issue 29, docs/MCP.md "Identity"): no tool acts as an agent it cannot prove (a wrong run
token, another agent's id, look-alike ids) and none then delivers or writes anything; a pinned token takes its
agent back at once and keeps a sub-agent itself; a read-only token reads everything and writes nothing; a
stateless (2026-07-28) client is the agent its start_session made, across a server restart.

In-process (the stdio server's code, on SQLite and PostgreSQL) and over HTTP against a real `synapolis serve`.
"""

from __future__ import annotations

import json
import os
import stat

import anyio
import pytest

pytest.importorskip("mcp")
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

from mcp import Client, MCPError  # noqa: E402

from conftest import claim_events, configure, fails, mcp_http_client, ok, start_server, stop, store_rows  # noqa: E402
from synapolis import actions, store  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.mcp.server import create_server  # noqa: E402
from synapolis.mcp.watch import inbox_uri, notes_uri  # noqa: E402
from synapolis.workspace import Workspace  # noqa: E402

LEGACY, MODERN = "legacy", "2026-07-28"
WRONG = "0" * 32

# every tool that acts as an agent, with arguments that would succeed for the agent it names
ACTING = [("beat", {}), ("signal", {"to": "*", "content": "x"}), ("read_signals", {}), ("ack_signals", {"all": True}),
          ("signals_pending", {}), ("read_notes", {}), ("note", {"text": "x"}), ("list_agents", {}),
          ("write_whiteboard", {"key": "k2", "value": "v"}), ("read_whiteboard", {}), ("tired", {}),
          ("claim", {"item": "ticket:9"}), ("release", {"item": "ticket:8"}),
          ("claim_check", {"item": "ticket:8", "token": 1}), ("guard", {"paths": ["src/a.py"]})]
READERS = {"read_signals", "read_notes", "list_agents", "read_whiteboard", "claim_check", "guard"}


def run(fn, *args):
    return anyio.run(fn, *args)


def setup_pair(ws) -> dict:
    """alice and bob in one session; bob holds ticket:8; a signal waits for bob, undelivered."""
    a = actions.start(ws, agent_id="alice", env={}, write_identity=False)
    b = actions.start(ws, agent_id="bob", session_id=a["session_id"], env={}, write_identity=False)
    bob = Who("bob", b["session_id"], b["run_token"])
    fencing = actions.claim(ws, bob, "ticket:8", env={})["claim"]["token"]
    actions.whiteboard_write(ws, bob, "k", "v", env={})
    actions.signal(ws, Who("alice", a["session_id"], a["run_token"]), "bob", "for bob only", env={})
    return {"session": a["session_id"], "alice": a["run_token"], "bob": b["run_token"], "fencing": fencing}


def snapshot(ws, session: str) -> dict:
    """Everything a call could write: the store's rows that change, the heartbeat files, notes and claims."""
    rows = {t: store_rows(ws, session, f"SELECT * FROM {t}")
            for t in ("agents", "signals", "signal_reads", "signal_deliveries", "rate_buckets")}
    beats = {p.name: p.read_bytes() for p in sorted(ws.paths.heartbeats.glob("*.json"))}
    from synapolis.store import store_for

    return {"rows": rows, "beats": beats, "notes": store_for(ws).read_notes(session, 100), "claims": claim_events(ws)}


def impostor_cases(tokens: dict) -> list[tuple[str, dict]]:
    """(what, the identity arguments) a caller started as alice passes to act as someone else."""
    return [("a wrong run token", {"agent_id": "bob", "run_token": WRONG}),
            ("another agent's id", {"agent_id": "bob", "run_token": tokens["alice"]}),
            ("its case changed", {"agent_id": "Bob", "run_token": tokens["alice"]}),
            ("a trailing dot", {"agent_id": "bob.", "run_token": tokens["alice"]}),
            ("a unicode confusable", {"agent_id": "b\u043eb", "run_token": tokens["alice"]}),
            ("a sub-agent of another", {"agent_id": "bob.x", "run_token": tokens["alice"]})]


async def no_impostor_gets_through(client, ws, tokens, *, require_run_token: bool):
    session = tokens["session"]
    await ok(client, "start_session", agent_id="alice", session_id=session, run_token=tokens["alice"])
    before = snapshot(ws, session)
    cases = impostor_cases(tokens)
    if require_run_token:
        cases.append(("no run token at all", {"agent_id": "bob"}))
    tried = 0
    for what, ident in cases:
        for tool, args in ACTING:
            result = await client.call_tool(tool, {**args, **ident, "session_id": session})
            tried += 1
            if result.is_error:
                text = result.content[0].text
                refusal = text.split(" (exit ")[0]
                assert refusal in ("ForbiddenError", "UsageError", "NoIdentityError"), (what, tool, text)
            else:  # only a reader, reading as nobody, answers (under require_run_token without a token)
                assert tool in READERS and "run_token" not in ident, (what, tool, result.structured_content)
                assert result.structured_content["pending_signals"] == []
            assert snapshot(ws, session) == before, (what, tool)
    # the inbox resource: bob's, read by alice's client
    with pytest.raises(MCPError):
        await client.read_resource(inbox_uri(session, "bob"))
    result = await client.call_tool("start_session", {"agent_id": "bob", "session_id": session, "run_token": WRONG})
    assert result.is_error and result.content[0].text.startswith("ForbiddenError (exit 7)")
    assert snapshot(ws, session) == before
    return tried


@pytest.fixture
def server(ws, monkeypatch):
    monkeypatch.setattr(store, "_LONG_LIVED", True)
    yield lambda env=None, **kw: create_server(ws.root, env or {}, **kw)
    store.close_all()


@pytest.mark.parametrize("require_run_token", [False, True])
@pytest.mark.parametrize("mode", [LEGACY, MODERN])
def test_no_tool_acts_as_an_agent_it_cannot_prove_in_process(ws, server, mode, require_run_token):
    tokens = setup_pair(ws)
    if require_run_token:
        ws = configure(ws, require_run_token=True)

    async def main():
        async with Client(server(), mode=mode) as c:
            return await no_impostor_gets_through(c, ws, tokens, require_run_token=require_run_token)

    assert run(main) >= len(ACTING) * 6
    # and bob's own signal is still waiting for him: nobody took its delivery
    got = actions.signals_pending(ws, Who("bob", tokens["session"], tokens["bob"]), env={})
    assert [s["content"] for s in got["pending_signals"]] == ["for bob only"]


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
def test_no_tool_acts_as_an_agent_it_cannot_prove_over_http(served, mode):
    ws = Workspace.open(served.state_dir)
    tokens = setup_pair(ws)
    team = served.token("team")

    async def main():
        async with mcp_http_client(served.url, team, mode) as c:
            return await no_impostor_gets_through(c, ws, tokens, require_run_token=False)

    assert run(main) >= len(ACTING) * 6
    got = actions.signals_pending(ws, Who("bob", tokens["session"], tokens["bob"]), env={})
    assert [s["content"] for s in got["pending_signals"]] == ["for bob only"]


def test_the_cli_and_mcp_agree_a_wrong_token_is_refused(served, cli):
    """The same read with a wrong run token: exit 7 from the CLI, ForbiddenError (exit 7) from the tool."""
    ws = Workspace.open(served.state_dir)
    tokens = setup_pair(ws)
    for verb in ("read-notes", "list-agents", "whiteboard-read"):
        done = cli(verb, "--agent-id", "bob", "--run-token", WRONG, "--session-id", tokens["session"])
        assert done.returncode == 7, (verb, done.stderr)

    async def main():
        async with mcp_http_client(served.url, served.token("team"), MODERN) as c:
            for tool in ("read_notes", "list_agents", "read_whiteboard"):
                await fails(c, tool, "ForbiddenError", 7, agent_id="bob", run_token=WRONG, session_id=tokens["session"])

    run(main)


# -- read-only tokens: every read tool and resource, nothing written -----------------------------------------

def test_a_read_only_token_reads_every_read_tool_and_resource_and_writes_nothing(served):
    ws = Workspace.open(served.state_dir)
    tokens = setup_pair(ws)
    session = tokens["session"]
    actions.note(ws, Who("alice", session, tokens["alice"]), "hello", env={})
    viewer = served.token("viewer", "--read-only")
    before = snapshot(ws, session)
    reads = [("read_notes", {"session_id": session}, lambda d: [n["text"] for n in d["notes"]] == ["hello"]),
             ("list_agents", {"session_id": session}, lambda d: {a["id"] for a in d["agents"]} == {"alice", "bob"}),
             ("read_whiteboard", {"session_id": session, "key": "k"}, lambda d: d["entry"]["value"] == "v"),
             ("read_whiteboard", {"session_id": session}, lambda d: [e["key"] for e in d["entries"]] == ["k"]),
             ("read_signals", {"session_id": session},
              lambda d: [s["content"] for s in d["signals"]] == ["for bob only"]),
             ("read_signals", {"session_id": session, "agent_id": "bob"},
              lambda d: [s["content"] for s in d["signals"]] == ["for bob only"]),
             ("claim_check", {"session_id": session, "item": "ticket:8", "token": tokens["fencing"]},
              lambda d: d["claim"]["claimed_by"] == "bob"),
             ("guard", {"paths": ["src/a.py"]}, lambda d: d["allowed"] is True and d["agent_id"] is None)]

    async def main():
        for mode in (LEGACY, MODERN):
            async with mcp_http_client(served.url, viewer, mode) as r:
                for tool, args, check in reads:
                    result = await r.call_tool(tool, args)
                    data = result.structured_content
                    assert not result.is_error, (tool, result.content[0].text)
                    assert check(data), (tool, data)
                    assert data["pending_signals"] == []
                    assert snapshot(ws, session) == before, (mode, tool)
                inbox = json.loads((await r.read_resource(inbox_uri(session, "bob"))).contents[0].text)
                assert [s["content"] for s in inbox["signals"]] == ["for bob only"]
                notes = json.loads((await r.read_resource(notes_uri(session))).contents[0].text)
                assert [n["text"] for n in notes["notes"]] == ["hello"]
                assert snapshot(ws, session) == before, mode

    run(main)
    got = actions.signals_pending(ws, Who("bob", session, tokens["bob"]), env={})
    assert [s["content"] for s in got["pending_signals"]] == ["for bob only"]  # still bob's to receive


# -- pinned tokens ------------------------------------------------------------------------------------

@pytest.mark.parametrize("require_run_token", [False, True])
@pytest.mark.parametrize("mode", [LEGACY, MODERN])
def test_a_pinned_token_takes_its_agent_back_at_once_and_its_sub_agent_stays_itself(served, mode, require_run_token):
    """A harness restarted within the stale window with its --agent token: start_session takes the agent back
    (it was ConflictError: already active); a sub-agent started under the token acts as itself afterwards (the
    next beat acted as the parent)."""
    ws = Workspace.open(served.state_dir)
    if require_run_token:
        ws = configure(ws, require_run_token=True)
    token = served.token("alice-laptop", "--agent", "alice")

    async def main():
        async with mcp_http_client(served.url, token, mode) as first:
            started = await ok(first, "start_session")
            assert started["agent_id"] == "alice"
            assert (await ok(first, "beat", task="before the restart"))["heartbeat"]["agent_id"] == "alice"
        # the harness restarts at once: alice's heartbeat is seconds old, live
        async with mcp_http_client(served.url, token, mode) as second:
            again = await ok(second, "start_session", session_id=started["session_id"])
            assert (again["agent_id"], again["registration"]) == ("alice", "reclaimed")
            assert (await ok(second, "note", text="back"))["note"]["agent_id"] == "alice"
            helper = await ok(second, "start_session", agent_id="alice.helper", session_id=started["session_id"])
            assert helper["agent_id"] == "alice.helper"
            for _ in range(2):
                assert (await ok(second, "beat"))["heartbeat"]["agent_id"] == "alice.helper"
            assert (await ok(second, "note", text="from the helper"))["note"]["agent_id"] == "alice.helper"
            # its parent, named, is still its own
            assert (await ok(second, "beat", agent_id="alice"))["heartbeat"]["agent_id"] == "alice"
            await fails(second, "beat", "ForbiddenError", 7, agent_id="alice", run_token=WRONG)
        return started["session_id"]

    session = run(main)
    agents = {r["id"] for r in store_rows(ws, session, "SELECT id FROM agents")}
    assert agents == {"alice", "alice.helper"}


# -- stateless clients: per token and client, across a restart --------------------------------------------

def test_the_sdks_auto_client_negotiates_2026_07_28_and_stays_the_agent_it_started(served):
    """`Client(mode="auto")` (the SDK's default) probes with server/discover and speaks 2026-07-28: no MCP
    session; its second call acts as the agent its first made (it was NoIdentityError)."""
    token = served.token("team")

    async def main():
        async with mcp_http_client(served.url, token, "auto") as c:
            assert c.protocol_version == MODERN
            started = await ok(c, "start_session", agent_id="auto-agent")
            assert (await ok(c, "note", text="second"))["note"]["agent_id"] == "auto-agent"
            assert (await ok(c, "read_signals"))["agent_id"] == "auto-agent"
            return started

    started = run(main)
    kept = json.loads((served.state_dir / "mcp-identities.json").read_text())["clients"]
    assert [(e["agent_id"], e["session_id"]) for e in kept.values()] == [("auto-agent", started["session_id"])]


@pytest.mark.parametrize("require_run_token", [False, True])
def test_a_stateless_clients_identity_survives_a_server_restart(state_dir, cli, require_run_token):
    ws = Workspace.open(state_dir).ensure()
    if require_run_token:
        ws = configure(ws, require_run_token=True)
    token = json.loads(cli("tokens", "create", "team", "--json").stdout)["token"]
    proc, url = start_server(state_dir)
    try:
        async def first():
            async with mcp_http_client(url, token, MODERN) as c:
                started = await ok(c, "start_session", agent_id="worker")
                assert (await ok(c, "beat"))["heartbeat"]["agent_id"] == "worker"
                return started

        started = run(first)
    finally:
        stop(proc)
    kept = state_dir / "mcp-identities.json"
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    assert started["run_token"] not in kept.read_text()  # sealed under the bearer token, never in clear
    proc, url = start_server(state_dir)
    try:
        async def second():
            async with mcp_http_client(url, token, MODERN) as c:
                assert (await ok(c, "note", text="after the restart"))["note"]["agent_id"] == "worker"

        run(second)
    finally:
        stop(proc)


@pytest.mark.parametrize("planted", ["not json", "folder", "huge"])
def test_a_damaged_identities_file_is_ignored_and_the_server_still_remembers(served, planted):
    """state/mcp-identities.json is a convenience across restarts: broken JSON, a folder in its place or a
    huge file is ignored (never a traceback, never a refusal), and the running server still knows its client."""
    path = served.state_dir / "mcp-identities.json"
    if planted == "folder":
        path.mkdir()
    elif planted == "huge":
        path.write_text('{"clients": {"' + "x" * (5 << 20) + '": {}}}')
    else:
        path.write_text("{not json")
    token = served.token("team")

    async def main():
        async with mcp_http_client(served.url, token, MODERN) as c:
            await ok(c, "start_session", agent_id="worker")
            assert (await ok(c, "note", text="still me"))["note"]["agent_id"] == "worker"

    run(main)
    assert "Traceback" not in "".join(served.proc.said)
