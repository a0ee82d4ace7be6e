"""The dashboard in a real browser (contract §13): headless Chromium (Debian's package) renders the page,
shows the agents and their status, shows an agent started from the CLI within 2 s without a reload, works
at a phone's width, signs in with a token into an HttpOnly SameSite=Strict cookie, and posts a note that
`read-notes` then shows. Screenshots at desktop and phone widths go to the test's output folder."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("mcp")

LIVE_S = 2.0


def test_dashboard_in_chromium(served, cli, browser, tmp_path):
    token = served.token("ops")  # a person's: the page posts as the person ops (tests/test_people.py)
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("beat", "--task", "porting the parser", "--agent-id", "alice")
    cli("claim", "src/parser.py", "--agent-id", "alice")
    blocked: list[str] = []
    page = browser.new_page()
    # no request may leave for another origin (no CDN, fonts or scripts from elsewhere)
    page.on("request", lambda r: blocked.append(r.url) if not r.url.startswith(served.url) else None)

    page.goto(served.url + "/")
    page.fill("#token", "syn_wrong")
    page.click("button[type=submit]")
    assert "not valid" in page.text_content("body")
    page.fill("#token", token)
    page.click("button[type=submit]")
    alice = page.wait_for_selector('#agents tr[data-agent="alice"]', timeout=10_000)
    assert alice.query_selector(".badge").text_content() == "active"  # the word, not only a colour
    assert "porting the parser" in alice.text_content() and "src/parser.py" in alice.text_content()
    page.wait_for_selector("#live:text-is('live')", timeout=10_000)

    (cookie,) = [c for c in browser.cookies() if c["name"] == "synapolis_token"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # no script can read it

    shots = tmp_path / "screenshots"
    shots.mkdir()
    page.screenshot(path=str(shots / "desktop.png"), full_page=True)

    # a new agent started from the CLI shows up without a reload, within 2 s
    page.evaluate("window.notReloaded = true")
    done = cli("start", "--agent-id", "newcomer", "--session-id", session)
    assert done.returncode == 0
    finished = time.monotonic()
    page.wait_for_selector('#agents tr[data-agent="newcomer"]', timeout=(LIVE_S + 1) * 1000)
    shown_after = time.monotonic() - finished
    assert shown_after < LIVE_S, shown_after
    assert page.evaluate("window.notReloaded") is True

    # post a note from the page: it is the token's person's, and the CLI reads it
    page.select_option("#post-session", session)
    page.fill("#post-text", "posted from the browser")
    page.click("#post-form button[type=submit]")
    page.wait_for_selector("#message:text-is('posted')", timeout=10_000)
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["person"], n["text"]) for n in notes] == [("ops", "posted from the browser")]
    page.wait_for_selector("text=posted from the browser", timeout=(LIVE_S + 1) * 1000)

    # a phone's width: everything readable without sideways scrolling of the page
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.is_visible('#agents tr[data-agent="alice"]')
    page.screenshot(path=str(shots / "phone.png"), full_page=True)
    assert (shots / "desktop.png").stat().st_size > 5000 and (shots / "phone.png").stat().st_size > 5000
    assert blocked == []
    print(f"screenshots: {shots}")
