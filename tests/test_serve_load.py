"""The team server under load (contract §13): 32 MCP clients over HTTP, each sending 50 signals at once;
every one of the 1,600 is stored, and the dashboard's change events keep coming meanwhile and after."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import anyio
import pytest

pytest.importorskip("mcp")
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

import httpx2  # noqa: E402

from conftest import mcp_http_client, ok, start_server  # noqa: E402

CLIENTS, EACH = 32, 50
LIVE_S = 2.0


def test_32_clients_sending_50_signals_each_lose_nothing(state_dir, cli):
    state_dir.mkdir()
    # the per-agent rate limit (10 a minute by default) is not what is under test here
    (state_dir / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 100000}))
    token = json.loads(cli("tokens", "create", "team", "--json").stdout)["token"]
    session = json.loads(cli("start", "--agent-id", "sink", "--json").stdout)["session_id"]
    proc, url = start_server(state_dir)
    events: list[float] = []
    heard = threading.Condition()
    stop = threading.Event()

    def listen():
        try:
            with httpx2.Client(base_url=url, timeout=60) as http:
                with http.stream("GET", "/events", headers={"authorization": f"Bearer {token}"}) as stream:
                    for line in stream.iter_lines():
                        if line == "event: change":
                            with heard:
                                events.append(time.monotonic())
                                heard.notify_all()
                        if stop.is_set():
                            return
        except httpx2.HTTPError:
            if not stop.is_set():
                raise

    listener = threading.Thread(target=listen, daemon=True)
    try:
        listener.start()

        async def one(i, failures):
            async with mcp_http_client(url, token) as c:
                await ok(c, "start_session", agent_id=f"load{i:02d}", session_id=session)
                for n in range(EACH):
                    result = await c.call_tool("signal", {"to": "sink", "content": f"{i}:{n}"})
                    if result.is_error:
                        failures.append(result.content[0].text)

        async def main():
            failures: list[str] = []
            async with anyio.create_task_group() as tg:
                for i in range(CLIENTS):
                    tg.start_soon(one, i, failures)
            return failures

        began = time.monotonic()
        failures = anyio.run(main)
        loaded = time.monotonic()
        assert failures == []
        db = sqlite3.connect(str(state_dir / "sessions" / session / "session.db"))
        rows = db.execute("SELECT sender, content FROM signals WHERE recipient = 'sink'").fetchall()
        assert len(rows) == CLIENTS * EACH
        assert {c for _s, c in rows} == {f"{i}:{n}" for i in range(CLIENTS) for n in range(EACH)}
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # the dashboard kept hearing about it while the load ran, and still does after
        assert any(began <= at <= loaded for at in events), (began, loaded, events[:5])
        started = time.monotonic()
        done = cli("start", "--agent-id", "after-the-load", "--session-id", session)
        finished = time.monotonic()
        assert done.returncode == 0
        # the event may come before the CLI process has even exited; never later than 2 s after
        with heard:
            heard.wait_for(lambda: any(at > started for at in events), timeout=LIVE_S)
        assert any(started < at < finished + LIVE_S for at in events)
        with httpx2.Client(base_url=url, timeout=30) as http:
            agents = http.get("/api/dashboard", headers={"authorization": f"Bearer {token}"}).json()["agents"]
        assert len(agents) == CLIENTS + 2
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=15)


def test_the_team_server_settles_its_garbage_collector_once_built():
    """What `serve` does once its app is built (web.serve.settle_garbage_collector): the objects made so far
    frozen out of the collector's sight, and a collection only every GC_THRESHOLDS[0] new objects."""
    import subprocess
    import sys

    script = ("import gc, json\nfrom synapolis.web import app, serve\nbefore = gc.get_threshold()\n"
              "serve.settle_garbage_collector()\nprint(json.dumps({'before': before, 'after': gc.get_threshold(), "
              "'frozen': gc.get_freeze_count(), 'wanted': serve.GC_THRESHOLDS}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["after"] == seen["wanted"] != seen["before"]
    assert seen["frozen"] > 10_000  # the SDK, starlette and pydantic's schemas, made at import
