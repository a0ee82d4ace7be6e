"""A person posts as a person (issue 29, docs/MCP.md "Who posts"): from the dashboard's HTTP endpoint and its
page in headless Chromium, a person's note or signal is marked as a person's wherever it is shown (CLI text and
JSON, the page) and touches no agent's heartbeat or registry entry; naming an agent to post "as" is refused;
the library's person posts on both stores."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import httpx2
import pytest

pytest.importorskip("mcp")

from conftest import ago, configure, store_rows  # noqa: E402
from synapolis import actions, people  # noqa: E402
from synapolis.identity import Who  # noqa: E402
from synapolis.workspace import Workspace  # noqa: E402
from test_dashboard_browser import LIVE_S  # noqa: E402


def agents_and_beats(state_dir, cli, session) -> tuple:
    """The registry rows (every column, read around the library) and every heartbeat file: what a person's
    post must leave alone."""
    rows = store_rows(Workspace.open(state_dir), session, "SELECT * FROM agents ORDER BY id")
    beats = {p.name: p.read_bytes() for p in sorted((state_dir / "heartbeats").glob("*.json"))}
    return rows, beats


def dead_agent(cli, state_dir) -> str:
    """alice live, ghost silent for an hour (dead to the watchdog); the session's id."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "ghost", "--session-id", session)
    path = state_dir / "heartbeats" / "ghost.json"
    doc = json.loads(path.read_text())
    doc["beat_at"] = ago(3600, datetime.now(timezone.utc))
    path.write_text(json.dumps(doc))
    return session


def test_a_person_posts_as_a_person_over_the_endpoint_and_is_shown_as_one(served, cli):
    session = dead_agent(cli, served.state_dir)
    token = served.token("dana")
    before = agents_and_beats(served.state_dir, cli, session)
    with httpx2.Client(base_url=served.url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        for named in ("ghost", "newcomer", "alice"):  # "as" a dead agent, a new name, a live agent: refused
            refused = http.post("/api/post", data={"kind": "note", "session_id": session, "agent_id": named,
                                                   "text": f"as {named}"})
            assert refused.status_code == 403 and refused.json()["error"]["type"] == "ForbiddenError", refused.text
        noted = http.post("/api/post", data={"kind": "note", "session_id": session, "text": "from a person"})
        assert noted.status_code == 200, noted.text
        assert noted.json()["note"]["person"] == "dana"
        sent = http.post("/api/post", data={"kind": "signal", "session_id": session, "to": "ghost",
                                            "content": "wake up"})
        assert sent.status_code == 200, sent.text
        assert sent.json()["signal"]["sender"] == "synapolis.person.dana"
        unknown = http.post("/api/post", data={"kind": "signal", "session_id": session, "to": "nobody",
                                               "content": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"
        board = http.get("/api/dashboard").json()
    assert agents_and_beats(served.state_dir, cli, session) == before  # no heartbeat, no registry change
    (activity,) = board["activity"]
    assert [(n["person"], n["text"]) for n in activity["notes"]] == [("dana", "from a person")]
    assert [(g.get("person"), g["content"]) for g in activity["signals"]] == [("dana", "wake up")]
    assert board["me"]["posts_as"] == "synapolis.person.dana"

    # the CLI: JSON and text say a person wrote them
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["agent_id"], n["person"]) for n in notes] == [("synapolis.person.dana", "dana")]
    assert "dana (person): from a person" in cli("read-notes", "--session-id", session).stdout
    got = json.loads(cli("read-signals", "--agent-id", "ghost", "--json").stdout)["signals"]
    assert [(s["person"], s["content"]) for s in got] == [("dana", "wake up")]
    assert "dana (person) -> ghost" in cli("read-signals", "--agent-id", "ghost", "--all").stdout
    # nobody can be the person: the id is reserved
    refused = cli("start", "--agent-id", "synapolis.person.dana", "--session-id", session)
    assert refused.returncode == 7


def test_a_pinned_token_posts_as_its_agent_and_refreshes_only_it(served, cli, state_dir):
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "bob", "--session-id", session)
    configure(Workspace.open(state_dir), require_run_token=True)
    token = served.token("bobs", "--agent", "bob")
    alice_beat = (state_dir / "heartbeats" / "alice.json").read_bytes()
    with httpx2.Client(base_url=served.url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        posted = http.post("/api/post", data={"kind": "signal", "session_id": session, "to": "alice",
                                              "content": "from bob's page"})
        assert posted.status_code == 200, posted.text
    assert posted.json()["signal"]["sender"] == "bob" and "person" not in posted.json()["signal"]
    assert (state_dir / "heartbeats" / "alice.json").read_bytes() == alice_beat
    agents = json.loads(cli("list-agents", "--session-id", session, "--json").stdout)["agents"]
    assert sorted(a["id"] for a in agents) == ["alice", "bob"]


def test_a_persons_note_and_signal_on_either_store(ws):
    started = actions.start(ws, agent_id="alice", env={}, write_identity=False)
    session = started["session_id"]
    note = people.note(ws, "dana", session, "hello from a person")["note"]
    assert (note["agent_id"], note["person"]) == ("synapolis.person.dana", "dana")
    people.signal(ws, "dana", session, "alice", "for alice")
    people.signal(ws, "dana", session, "*", "for everyone")
    alice = Who("alice", session, started["run_token"])
    got = actions.read_signals(ws, alice, env={})["signals"]
    assert [(s["person"], s["content"]) for s in got] == [("dana", "for alice"), ("dana", "for everyone")]
    notes = actions.read_notes(ws, alice, env={})["notes"]
    assert [(n["person"], n["text"]) for n in notes] == [("dana", "hello from a person")]
    assert [a["id"] for a in actions.list_agents(ws, alice, env={})["agents"]] == ["alice"]
    assert people.person_id("a..b").startswith("synapolis.person.token-")  # a token name that is no id


def test_the_page_posts_as_a_person_in_chromium(served, cli, browser):
    session = dead_agent(cli, served.state_dir)
    token = served.token("ops")
    before = agents_and_beats(served.state_dir, cli, session)
    page = browser.new_page()
    page.goto(served.url + "/")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector('#agents tr[data-agent="ghost"]', timeout=10_000)
    assert page.text_content("#post-as") == "as ops (a person)"
    assert page.query_selector('#post-form [name="agent_id"]') is None  # no free-text "as agent" any more
    page.select_option("#post-session", session)
    page.fill("#post-text", "a person's note")
    page.click("#post-form button[type=submit]")
    page.wait_for_selector("#message:text-is('posted')", timeout=10_000)
    page.evaluate("document.getElementById('message').textContent = ''")  # the next 'posted' is the signal's
    page.select_option("#post-kind", "signal")
    page.fill("#post-to", "ghost")
    page.fill("#post-text", "a person's signal")
    page.click("#post-form button[type=submit]")
    page.wait_for_selector("#message:text-is('posted')", timeout=10_000)
    page.wait_for_selector("text=a person's signal", timeout=(LIVE_S + 1) * 1000)
    feed = page.text_content(f'[data-session="{session}"]')
    assert "ops (person) → ghost" in feed and "ops (person)" in feed
    assert agents_and_beats(served.state_dir, cli, session) == before
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["person"], n["text"]) for n in notes] == [("ops", "a person's note")]
    got = json.loads(cli("read-signals", "--agent-id", "ghost", "--json").stdout)["signals"]
    assert [(s["person"], s["content"]) for s in got] == [("ops", "a person's signal")]
