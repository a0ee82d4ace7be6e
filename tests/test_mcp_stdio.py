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
