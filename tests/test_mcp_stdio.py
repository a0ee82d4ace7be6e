"""End to end over real stdio: the SDK's stdio client starts `synapolis mcp`, subscribes to its inbox, another
process sends a signal with the CLI, and the notification arrives (bounded by a deadline)."""

from __future__ import annotations

import json
import sys

import anyio
import pytest

pytest.importorskip("mcp")
# the handshake-era resources/subscribe is tested on purpose; the SDK warns that 2026-07-28 removed it
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from synapolis.mcp.watch import inbox_uri  # noqa: E402

DEADLINE_S = 15  # the server's start-up (importing the SDK) is inside it on a loaded machine


def server_params(state_dir, **env) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "synapolis", "--state-dir", str(state_dir), "mcp"], env=env)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_stdio_subscriber_hears_a_cli_signal(state_dir, cli, tmp_path, mode):
    errlog_path = tmp_path / "server-stderr.txt"
    updates: list[str] = []
    arrived = anyio.Event()

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/resources/updated":
            updates.append(message.params.uri)
            arrived.set()

    async def send_from_cli(*args):
        done = await anyio.to_thread.run_sync(lambda: cli(*args))
        assert done.returncode == 0, done.stderr
        return done

    async def main():
        with open(errlog_path, "w") as errlog:
            transport = stdio_client(server_params(state_dir), errlog=errlog)
            with anyio.fail_after(60):
                async with Client(transport, mode=mode, message_handler=on_message) as client:
                    started = await client.call_tool("start_session", {"agent_id": "bob", "harness": "stdio-test"})
                    assert not started.is_error, started.content
                    session = started.structured_content["session_id"]
                    mine = inbox_uri(session, "bob")
                    await send_from_cli("start", "--agent-id", "alice", "--session-id", session)

                    if mode == "legacy":
                        await client.subscribe_resource(mine)
                        await send_from_cli("signal", "bob", "over stdio", "--agent-id", "alice")
                        with anyio.fail_after(DEADLINE_S):
                            await arrived.wait()
                        assert updates == [mine]
                    else:
                        async with client.listen(resource_subscriptions=[mine]) as stream:
                            await send_from_cli("signal", "bob", "over stdio", "--agent-id", "alice")
                            with anyio.fail_after(DEADLINE_S):
                                event = await stream.__anext__()
                            assert event.uri == mine

                    inbox = json.loads((await client.read_resource(mine)).contents[0].text)
                    assert [s["content"] for s in inbox["signals"]] == ["over stdio"]
                    beat = await client.call_tool("beat", {})
                    assert beat.structured_content["pending_signals"] == []  # delivered by the read (push)
                    bad = await client.call_tool("signal", {"to": "../x", "content": "c"})
                    assert bad.is_error and bad.content[0].text.startswith("UsageError (exit 2): ")

    anyio.run(main)
    assert "Traceback" not in errlog_path.read_text()


@pytest.mark.parametrize("stdin_kind", ["pipe", "file"])
def test_a_line_that_is_not_json_rpc_gets_a_json_rpc_error_and_the_server_goes_on(state_dir, tmp_path, stdin_kind):
    """JSON-RPC 2.0 §5.1: text that is not JSON is -32700, JSON that is no message -32600, both with id null;
    the next request is answered as if nothing had happened. Over a pipe (what harnesses give the server: the
    loop's own I/O) and a file (the SDK's threaded stdio)."""
    import select
    import subprocess

    from conftest import clean_env, synapolis_cmd

    ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    bad_lines = ["this is not json", '{"hello": "not a message"}', '{"jsonrpc": "2.0", "id": 3}', "[1, 2"]
    expected_codes = [-32700, -32600, -32600, -32700]
    if stdin_kind == "pipe":  # one line at a time, each answered before the next is sent (no EOF race)
        proc = subprocess.Popen(synapolis_cmd(state_dir, "mcp"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=clean_env(), text=True)
        answers = []
        try:
            for line in [*bad_lines, json.dumps(ping)]:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
                ready, _w, _x = select.select([proc.stdout], [], [], DEADLINE_S)
                if not ready:
                    pytest.fail(f"no answer within {DEADLINE_S} s to {line!r}")
                answers.append(json.loads(proc.stdout.readline()))
        finally:
            proc.stdin.close()
            if proc.wait(timeout=30) != 0:
                pytest.fail(f"synapolis mcp exited {proc.returncode}")
    else:  # the whole input at once from a file; the ping comes first, since requests in flight at EOF are not
        # waited for (a client closes stdin when it is done)
        source = tmp_path / "input.jsonl"
        source.write_text("\n".join([json.dumps(ping), *bad_lines]) + "\n")
        with open(source) as stdin:
            done = subprocess.run(synapolis_cmd(state_dir, "mcp"), stdin=stdin, capture_output=True, text=True,
                                  env=clean_env(), timeout=60)
        assert done.returncode == 0, done.stderr
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        answers = answers[1:] + answers[:1]  # the ping's answer to the end, as for the pipe
    assert [a["error"]["code"] for a in answers[:-1]] == expected_codes
    assert all(a["id"] is None and a["jsonrpc"] == "2.0" and a["error"]["message"] for a in answers[:-1])
    assert answers[-1] == {"jsonrpc": "2.0", "id": 7, "result": {}}
