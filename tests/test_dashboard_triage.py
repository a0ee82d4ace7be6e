"""The dashboard as a triage screen, in headless Chromium (issue 32): a dead agent is the first row, the tab
title counts what needs a person, claims show token and expiry, times are in the browser's zone, an incident
is acked from the page, the per-agent view lists its beat history, the session view shows each signal's
delivery state and the staged memories, filters narrow the list, a phone gets one line per agent with no
sideways scrolling, dark mode is dark, /favicon.ico answers, and a server that goes away is shown.

Screenshots (desktop 1280, phone 390, dark) go to the test's folder; with SYNAPOLIS_UPDATE_SCREENSHOTS=1 they
are also written to docs/screenshots/ for the README.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from conftest import ROOT, hook_denies, stop
from synapolis.timeutil import format_ts, utcnow

pytest.importorskip("mcp")


def make_dead(state_dir, agent_id, hours=3):
    """An agent that stopped beating `hours` ago: its heartbeat file says so (time is a parameter)."""
    path = Path(state_dir) / "heartbeats" / f"{agent_id}.json"
    doc = json.loads(path.read_text())
    doc["beat_at"] = format_ts(utcnow() - timedelta(hours=hours))
    path.write_text(json.dumps(doc))


def swarm(cli, state_dir) -> str:
    """alice (active, a claim, a signal to zed), bob (idle), zed (dead, an open incident); three monitor passes;
    an edit of alice's file that a Claude Code conversation's pre-tool hook denied (an event)."""
    session = json.loads(cli("start", "--agent-id", "alice", "--harness", "claude-code", "--substrate",
                             "Claude Sonnet 4.6", "--json").stdout)["session_id"]
    for agent in ("bob", "zed"):
        assert cli("start", "--agent-id", agent, "--session-id", session, "--harness", "codex").returncode == 0
    cli("beat", "--agent-id", "bob", "--status", "idle")
    assert cli("monitor").returncode == 0
    cli("beat", "--task", "porting the parser", "--agent-id", "alice")
    assert cli("claim", "src/parser.py", "--agent-id", "alice", "--ttl", "1800").returncode == 0
    hook_denies(state_dir, Path(state_dir).parent, "src/parser.py")
    assert cli("monitor").returncode == 0
    assert cli("signal", "--agent-id", "alice", "zed", "are you there?").returncode == 0
    assert cli("whiteboard-write", "--agent-id", "alice", "release", "v0.3 on Friday").returncode == 0
    tired = cli("tired", "--agent-id", "bob", "--memories", "-", input='"the parser needs a fuzz test"')
    assert tired.returncode == 0, tired.stderr
    cli("beat", "--agent-id", "alice")
    make_dead(state_dir, "zed")
    assert cli("monitor").returncode == 0
    assert cli("escalate").returncode == 0
    return session


WIDER_THAN_SCREEN = """() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 0.5)
  .slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


def no_sideways_scroll(page, width):
    assert page.evaluate("document.documentElement.scrollWidth") <= width, page.evaluate(WIDER_THAN_SCREEN)


def keep(shot: Path, name: str) -> None:
    if os.environ.get("SYNAPOLIS_UPDATE_SCREENSHOTS") == "1":
        target = Path(ROOT) / "docs" / "screenshots"
        target.mkdir(exist_ok=True)
        shutil.copyfile(shot, target / name)


def test_the_dashboard_for_triage(served, cli, browser, tmp_path, state_dir):
    session = swarm(cli, state_dir)
    token = served.token("ops", "--agent", "ops")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    page = browser.new_page()
    page.goto(served.url + "/")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector('#agents tr[data-agent="zed"]', timeout=10_000)
    page.wait_for_selector("#live:text-is('live')", timeout=10_000)

    # severity first: the dead agent is the first row, whatever the alphabet says
    rows = page.query_selector_all("#agents tbody tr")
    assert [r.get_attribute("data-agent") for r in rows] == ["zed", "alice", "bob"]
    assert rows[0].query_selector(".badge").text_content() == "dead"
    assert page.title() == "(1 dead, 1 incident, 1 refused in 1h) synapolis"
    (event,) = page.query_selector_all("#events li[data-event]")
    assert "src/parser.py" in event.text_content() and event.query_selector(".holder").text_content() == "alice"
    alice = page.query_selector('#agents tr[data-agent="alice"]').text_content()
    assert "claude-code · Claude Sonnet 4.6" in alice and "porting the parser" in alice
    assert "src/parser.py · token 1 · until " in alice and ("(in 29m)" in alice or "(in 30m)" in alice)
    assert page.text_content("#zone") == "times in UTC"
    # a browser in India: the same incident's time reads 5 h 30 min later, and the zone is named
    page.context.new_cdp_session(page).send("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    page.reload()
    page.wait_for_selector("#incidents li[data-incident] time", timeout=10_000)
    assert page.text_content("#zone") in ("times in Asia/Kolkata", "times in Asia/Calcutta")  # ICU's old name
    (opened_at,) = [i["opened_at"] for i in json.loads(cli("escalations", "--json").stdout)["incidents"]]
    utc = datetime.fromisoformat(opened_at.replace("Z", "+00:00"))
    local = utc + timedelta(hours=5, minutes=30)
    shown = page.text_content("#incidents li[data-incident] time")
    assert local.strftime("%I:%M") in shown and utc.strftime("%I:%M") not in shown, (shown, opened_at)

    # the session view: the signal to zed was never delivered (zed is dead), bob's memory waits to be merged
    signal = page.wait_for_selector(f'[data-session="{session}"] li[data-signal]:has-text("are you there?")')
    assert "alice → zed" in signal.text_content() and "not delivered yet" in signal.text_content()
    assert "the parser needs a fuzz test" in page.text_content(f'[data-session="{session}"]')
    page.screenshot(path=str(shots / "desktop.png"), full_page=True)
    keep(shots / "desktop.png", "dashboard-desktop.png")

    # ack the incident from the page: the store says acked, and so does the page
    incident = page.query_selector("#incidents li[data-incident]")
    incident_id = incident.get_attribute("data-incident")
    assert f"synapolis escalations ack {incident_id}" in incident.text_content()
    incident.query_selector("button.ack").click()
    page.wait_for_selector(f'#incidents li[data-incident="{incident_id}"] .badge:text-is("acked")', timeout=10_000)
    listed = json.loads(cli("escalations", "--json").stdout)["incidents"]
    assert [(i["id"], bool(i["acked_at"])) for i in listed] == [(incident_id, True)]

    # filters: text and status narrow the list
    page.fill("#filter-text", "parser")
    assert [r.get_attribute("data-agent") for r in page.query_selector_all("#agents tbody tr")] == ["alice"]
    page.fill("#filter-text", "")
    page.select_option("#filter-status", "attention")
    assert [r.get_attribute("data-agent") for r in page.query_selector_all("#agents tbody tr")] == ["zed"]
    page.select_option("#filter-status", "")

    # the per-agent view: its beat history (one row per monitor pass), its claim, its signal with delivery state
    page.click('#agents tr[data-agent="alice"] a')
    page.wait_for_selector("#agent-view:not([hidden]) #beat-history table", timeout=10_000)
    history = page.query_selector_all("#beat-history tbody tr")
    assert len(history) == 3, page.text_content("#agent-view")
    view = page.text_content("#agent-view")
    assert "src/parser.py" in view and "out · alice → zed" in view and "not delivered yet" in view
    page.screenshot(path=str(shots / "agent.png"), full_page=True)

    # a phone: one line per agent, details on tap, nothing wider than the screen
    page.goto(served.url + "/")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_selector("#agents tbody tr")
    no_sideways_scroll(page, 390)
    heights = page.eval_on_selector_all("#agents tbody tr", "rows => rows.map(r => r.getBoundingClientRect().height)")
    assert len(heights) == 3 and max(heights) < 40, heights  # one line each (it was a 7-row card)
    assert not page.is_visible('#agents tr[data-agent="alice"] td[data-label="task"]')
    page.click('#agents tr[data-agent="alice"] td[data-label="status"]')
    assert page.is_visible('#agents tr[data-agent="alice"] td[data-label="task"]')
    no_sideways_scroll(page, 390)
    page.screenshot(path=str(shots / "phone.png"), full_page=True)
    keep(shots / "phone.png", "dashboard-phone.png")

    # dark mode follows the system's preference
    dark = browser.new_page()
    dark.emulate_media(color_scheme="dark")
    dark.set_viewport_size({"width": 1280, "height": 800})
    dark.goto(served.url + "/")
    dark.wait_for_selector('#agents tr[data-agent="zed"]', timeout=10_000)
    assert dark.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(13, 17, 23)"
    dark.screenshot(path=str(shots / "dark.png"), full_page=True)
    keep(shots / "dark.png", "dashboard-dark.png")
    dark.close()

    # a favicon, so the tab has one (and the server's log no 404 per page load)
    with urllib.request.urlopen(served.url + "/favicon.ico", timeout=10) as answer:
        assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")

    # the server goes away: the page says so in words, not only a grey dot
    stop(served.proc)
    page.wait_for_selector("#offline:not([hidden])", timeout=15_000)
    assert "Disconnected" in page.text_content("#offline") and page.text_content("#live") == "disconnected"
    for name in ("desktop.png", "phone.png", "dark.png", "agent.png"):
        assert (shots / name).stat().st_size > 5000
    print(f"screenshots: {shots}")


# -- the read and ack endpoints over plain HTTP ----------------------------------------------------------

def test_agent_view_and_ack_endpoints(served, cli, state_dir):
    import httpx2

    session = swarm(cli, state_dir)
    viewer, ops = served.token("viewer", "--read-only"), served.token("ops", "--agent", "ops")
    (incident,) = json.loads(cli("escalations", "--json").stdout)["incidents"]
    with httpx2.Client(base_url=served.url, timeout=10, headers={"authorization": f"Bearer {viewer}"}) as http:
        data = http.get("/api/dashboard").json()
        (activity,) = data["activity"]
        signal = next(g for g in activity["signals"] if g["content"] == "are you there?")
        assert [(r["agent_id"], r["delivered_at"]) for r in signal["receipts"]] == [("zed", None)]
        assert [m["text"] for m in activity["staged_memories"]] == ["the parser needs a fuzz test"]
        view = http.get("/api/agent", params={"id": "alice"}).json()
        assert [h["effective_status"] for h in view["history"]] == ["active", "active", "active"]
        assert [h["seq"] for h in view["history"]] == sorted(h["seq"] for h in view["history"])
        assert [c["item"] for c in view["claims"]] == ["src/parser.py"] and view["agent"]["session_id"] == session
        assert [(g["direction"], g["recipient"]) for g in view["signals"] if g["sender"] == "alice"] == [("out", "zed")]
        zed = http.get("/api/agent", params={"id": "zed"}).json()
        assert zed["history"][-1]["effective_status"] == "dead"
        assert {"from": "active", "to": "dead"} in [{k: t[k] for k in ("from", "to")} for t in zed["transitions"]]
        assert http.get("/api/agent", params={"id": "nobody"}).status_code == 404
        assert http.get("/api/agent", params={"id": "../etc"}).status_code == 400
        refused = http.post("/api/ack", data={"incident_id": incident["id"]})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "ForbiddenError"
    assert httpx2.get(served.url + "/api/agent?id=alice").status_code == 401
    with httpx2.Client(base_url=served.url, timeout=10) as http:  # a browser: the cookie needs the page's CSRF token
        http.post("/login", data={"token": ops}, follow_redirects=False)
        assert http.post("/api/ack", data={"incident_id": incident["id"]}).status_code == 403
        csrf = http.get("/api/dashboard").json()["me"]["csrf"]
        assert http.post("/api/ack", data={"incident_id": "nothere", "csrf": csrf}).status_code == 404
        acked = http.post("/api/ack", data={"incident_id": incident["id"][:8], "csrf": csrf})
        assert acked.status_code == 200 and acked.json()["acked"] is True
    assert json.loads(cli("escalations", "--json").stdout)["incidents"][0]["acked_at"]
