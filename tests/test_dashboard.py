"""The dashboard of `synapolis serve` over plain HTTP (contract §13): sign-in and its cookie, what the page's
data holds, CSRF-safe posting as the token's identity, and the change events that keep it live.
(tests/test_dashboard_browser.py drives the page itself in Chromium.)"""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("mcp")

import httpx2  # noqa: E402

LIVE_S = 2.0  # §13: the page updates within 2 s of a change in the store


def sign_in(http, token):
    answer = http.post("/login", data={"token": token}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return answer


def test_sign_in_sets_a_strict_httponly_cookie_and_a_wrong_token_gets_the_form_again(served):
    token = served.token("ops", "--agent", "ops")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        form = http.get("/")
        assert form.status_code == 200 and 'action="/login"' in form.text and "ops" not in form.text
        assert "default-src 'self'" in form.headers["content-security-policy"]
        wrong = http.post("/login", data={"token": "syn_nope"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not valid" in wrong.text and "set-cookie" not in wrong.headers
        cookie = sign_in(http, token).headers["set-cookie"]
        flags = {part.strip().lower() for part in cookie.split(";")}
        assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
        assert "secure" not in flags  # plain HTTP on loopback; over TLS the cookie is Secure too
        page = http.get("/")
        assert 'id="agents"' in page.text and "<script" in page.text
        # nothing on the page comes from elsewhere
        assert "http://" not in page.text.replace("http://localhost", "") and "https://" not in page.text
        assert http.post("/logout", follow_redirects=False).status_code == 303


def test_dashboard_data_has_agents_incidents_signals_notes_whiteboard(served, cli):
    token = served.token("viewer", "--read-only")
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "bob", "--session-id", session)
    cli("beat", "--task", "migrating the schema", "--agent-id", "alice")
    cli("claim", "db/schema.sql", "--agent-id", "alice")
    cli("signal", "bob", "take the API", "--agent-id", "alice")
    cli("note", "schema frozen", "--agent-id", "bob")
    cli("whiteboard-write", "release", "v2", "--agent-id", "bob")
    with httpx2.Client(base_url=served.url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        data = http.get("/api/dashboard").json()
    agents = {a["agent_id"]: a for a in data["agents"]}
    assert agents["alice"]["effective_status"] == "active" and agents["alice"]["task"] == "migrating the schema"
    assert agents["alice"]["claims"] == ["db/schema.sql"] and agents["alice"]["host"]
    (activity,) = data["activity"]
    assert activity["session_id"] == session
    assert [s["content"] for s in activity["signals"]] == ["take the API"]
    assert [n["text"] for n in activity["notes"]] == ["schema frozen"]
    assert activity["whiteboard"][0]["key"] == "release"
    assert data["me"] == {"token": "viewer", "agent_id": None, "read_only": True, "csrf": data["me"]["csrf"],
                          "posts_as": None}
    assert data["incidents"] == []


def test_posting_needs_the_pages_csrf_token_and_posts_as_the_tokens_agent(served, cli):
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    cli("start", "--agent-id", "carol", "--session-id", session)
    token = served.token("carol", "--agent", "carol")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        sign_in(http, token)
        csrf = http.get("/api/dashboard").json()["me"]["csrf"]
        note = {"kind": "note", "session_id": session, "text": "from the page"}
        assert http.post("/api/post", data=note).status_code == 403  # no CSRF token: a forged form
        assert http.post("/api/post", data={**note, "csrf": "0" * 64}).status_code == 403
        forged = http.post("/api/post", data={**note, "csrf": csrf}, headers={"origin": "https://evil.example"})
        assert forged.status_code == 403
        assert json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"] == []
        posted = http.post("/api/post", data={**note, "csrf": csrf, "agent_id": "alice"})
        assert posted.status_code == 403  # the token is carol's: the page cannot post as alice
        posted = http.post("/api/post", data={**note, "csrf": csrf})
        assert posted.status_code == 200, posted.text
        signal = {"kind": "signal", "session_id": session, "to": "alice", "content": "ping", "csrf": csrf}
        assert http.post("/api/post", data=signal).status_code == 200
        again = http.post("/api/post", data={**note, "text": "second", "csrf": csrf})
        assert again.status_code == 200, again.text
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["agent_id"], n["text"]) for n in notes] == [("carol", "from the page"), ("carol", "second")]
    got = json.loads(cli("read-signals", "--agent-id", "alice", "--json").stdout)["signals"]
    assert [(s["sender"], s["content"]) for s in got] == [("carol", "ping")]
    assert all("person" not in n for n in notes)  # the agent carol wrote them, not a person


def test_forms_are_small_url_encoded_bodies_or_refused_unread(served, cli):
    """The sign-in reads its body before any token is checked: a multipart body (each file part spooled to
    disk, whatever its size) or a huge one (up to 1000 fields of 1 MB in memory) is refused, not parsed."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("carol")
    huge = b"token=" + b"a" * (4 << 20)

    def chunked():  # no content-length: the bound holds on what arrives, not on what is declared
        yield b"token="
        for _ in range(64):
            yield b"a" * (64 << 10)

    with httpx2.Client(base_url=served.url, timeout=30) as http:
        upload = http.post("/login", files={"token": ("t.bin", b"x" * (2 << 20))}, follow_redirects=False)
        assert upload.status_code == 415 and upload.json()["error"]["type"] == "UsageError"
        as_multipart = http.post("/login", files={"token": (None, token)}, follow_redirects=False)
        assert as_multipart.status_code == 415 and "set-cookie" not in as_multipart.headers
        headers = {"content-type": "application/x-www-form-urlencoded"}
        assert http.post("/login", content=huge, headers=headers).status_code == 413
        assert http.post("/login", content=chunked(), headers=headers).status_code == 413
        many = "&".join(f"f{i}=x" for i in range(500)) + f"&token={token}"
        assert http.post("/login", content=many, headers=headers, follow_redirects=False).status_code == 400
        sign_in(http, token)  # the form a browser sends still signs in
        csrf = http.get("/api/dashboard").json()["me"]["csrf"]
        note = {"kind": "note", "session_id": session, "text": "x", "csrf": csrf}
        assert http.post("/api/post", files={"text": (None, "x")}, data=note).status_code == 415
        big = {**note, "text": "y" * (3 * 65536 + 20000)}
        assert http.post("/api/post", data=big).status_code == 413
        assert http.post("/api/post", data=note).status_code == 200
    assert "Traceback" not in "".join(served.proc.said)
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [n["text"] for n in notes] == ["x"]


def test_read_only_and_unpinned_tokens_on_the_page(served, cli):
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    viewer, team = served.token("viewer", "--read-only"), served.token("team")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        sign_in(http, viewer)
        csrf = http.get("/api/dashboard").json()["me"]["csrf"]
        refused = http.post("/api/post", data={"kind": "note", "session_id": session, "text": "x", "csrf": csrf})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "ForbiddenError"
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        sign_in(http, team)
        csrf = http.get("/api/dashboard").json()["me"]["csrf"]
        # not pinned: a person, who posts as a person and never "as" an agent they name
        named = http.post("/api/post", data={"kind": "note", "session_id": session, "text": "x", "csrf": csrf,
                                             "agent_id": "dave"})
        assert named.status_code == 403 and named.json()["error"]["type"] == "ForbiddenError"
        unnamed = http.post("/api/post", data={"kind": "note", "session_id": session, "text": "hi", "csrf": csrf})
        assert unnamed.status_code == 200, unnamed.text
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["agent_id"], n.get("person"), n["text"]) for n in notes] == [("synapolis.person.team", "team", "hi")]


def test_change_events_arrive_within_two_seconds_of_a_cli_change(served, cli):
    token = served.token("viewer", "--read-only")
    events: list[tuple[float, str]] = []
    ready = threading.Event()
    started = [float("inf")]

    def listen():
        with httpx2.Client(base_url=served.url, timeout=30) as http:
            with http.stream("GET", "/events", headers={"authorization": f"Bearer {token}"}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        events.append((time.monotonic(), line[7:]))
                        if line == "event: hello":
                            ready.set()
                        if line == "event: change" and events[-1][0] > started[0]:
                            return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(10)
    started[0] = time.monotonic()
    done = cli("start", "--agent-id", "newcomer")
    finished = time.monotonic()
    assert done.returncode == 0
    thread.join(LIVE_S + 5)
    changes = [at for at, kind in events if kind == "change" and at > started[0]]
    assert changes, events
    assert changes[0] - finished < LIVE_S  # measured from the CLI's exit, its own start-up aside


def test_an_open_page_with_nothing_changing_hears_no_change(served, cli):
    """The page refetches on every change event; its own reads must never cause one (SQLite readers open,
    close, create and delete files; were those news, the page would refetch forever)."""
    cli("start", "--agent-id", "alice")
    token = served.token("viewer", "--read-only")
    auth = {"authorization": f"Bearer {token}"}
    changes: list[float] = []
    hello = threading.Event()
    stop = threading.Event()

    def page():
        try:
            with httpx2.Client(base_url=served.url, timeout=30, headers=auth) as http:
                with http.stream("GET", "/events") as stream:
                    for line in stream.iter_lines():
                        if stop.is_set():
                            return
                        if line in ("event: hello", "event: change"):
                            if line == "event: change":
                                changes.append(time.monotonic())
                            http.get("/api/dashboard").raise_for_status()  # what the page does on an event
                            hello.set()
        except httpx2.HTTPError:
            if not stop.is_set():  # the server going away at the end of the test is expected
                raise

    thread = threading.Thread(target=page, daemon=True)
    thread.start()
    assert hello.wait(10)
    quiet_until = time.monotonic() + LIVE_S
    stop.wait(LIVE_S)  # a window in which nothing changes: the page's reads alone
    # the server's first read of a session may leave one trace (it then holds the session open); a page
    # that fed itself would have refetched dozens of times in this window
    assert len([at for at in changes if at < quiet_until]) <= 1, changes
    stop.set()


def test_a_revoked_tokens_open_event_stream_ends(served, cli):
    """Revocation applies from the next request (§13); an event stream is one long request, and kept telling
    a revoked page each time the store changed. It now ends at the first change after the revocation."""
    token = served.token("laptop", "--read-only")
    lines: list[str] = []
    hello, ended = threading.Event(), threading.Event()

    def page():
        with httpx2.Client(base_url=served.url, timeout=30) as http:
            with http.stream("GET", "/events", headers={"authorization": f"Bearer {token}"}) as stream:
                for line in stream.iter_lines():
                    lines.append(line)
                    hello.set()
        ended.set()

    threading.Thread(target=page, daemon=True).start()
    assert hello.wait(10)
    assert cli("tokens", "revoke", "laptop").returncode == 0
    assert cli("start", "--agent-id", "alice").returncode == 0  # news the revoked page must not hear
    assert ended.wait(LIVE_S + 5), lines  # (the revocation's own write may be told before it is seen)


def test_a_config_broken_while_serving_is_an_error_answer_not_a_500(served, cli):
    """synapolis.json is re-read per request; broken under a running server, /api/status and /api/dashboard
    raised the UsageError out of the app (500, a traceback in the server's log); /api/post answers it."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("carol", "--agent", "carol")
    (served.state_dir / "synapolis.json").write_text("{broken")
    auth = {"authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=served.url, timeout=10, headers=auth) as http:
        for answer in (http.get("/api/status"), http.get("/api/dashboard"),
                       http.post("/api/post", data={"kind": "note", "session_id": session, "text": "x"})):
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["type"] == "UsageError" and "synapolis.json" in answer.json()["error"]["message"]
    from conftest import everything_said, stop

    stop(served.proc)  # its log whole: everything it said until it stopped
    assert "Traceback" not in everything_said(served.proc)


def test_with_run_tokens_required_a_pinned_token_posts_as_its_agent_before_and_after_a_restart(state_dir, cli):
    """A token pinned to an agent is that agent's credential: the page posts as it with require_run_token on,
    no run token kept anywhere, the same after the server restarts. An unpinned token posts as a person and
    may name no agent; a pinned one whose agent is not in the session is told so, and registers nobody."""
    from conftest import configure, start_server, stop
    from synapolis.workspace import Workspace

    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    configure(Workspace.open(state_dir), require_run_token=True)
    as_alice = json.loads(cli("tokens", "create", "al", "--agent", "alice", "--json").stdout)["token"]
    carol = json.loads(cli("tokens", "create", "carol", "--agent", "carol", "--json").stdout)["token"]
    other = json.loads(cli("tokens", "create", "other", "--json").stdout)["token"]
    note = {"kind": "note", "session_id": session}
    for run in ("before", "after"):
        proc, url = start_server(state_dir)
        try:
            with httpx2.Client(base_url=url, timeout=10, headers={"authorization": f"Bearer {as_alice}"}) as http:
                posted = http.post("/api/post", data={**note, "text": f"{run} the restart"})
                assert posted.status_code == 200, posted.text
            with httpx2.Client(base_url=url, timeout=10, headers={"authorization": f"Bearer {carol}"}) as http:
                absent = http.post("/api/post", data={**note, "text": "carol is in no session"})
                assert absent.json()["error"]["type"] == "NoIdentityError", absent.text
            with httpx2.Client(base_url=url, timeout=10, headers={"authorization": f"Bearer {other}"}) as http:
                refused = http.post("/api/post", data={**note, "agent_id": "alice", "text": "as alice, by another"})
                assert refused.status_code == 403 and refused.json()["error"]["type"] == "ForbiddenError"
        finally:
            stop(proc)
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [(n["agent_id"], n["text"]) for n in notes] == [("alice", "before the restart"),
                                                           ("alice", "after the restart")]
    agents = json.loads(cli("list-agents", "--session-id", session, "--json").stdout)["agents"]
    assert {a["id"]: a["harness"] for a in agents} == {"alice": "cli"}
    assert "Traceback" not in "".join(proc.said)


def test_a_form_posted_with_raw_utf8_is_stored_as_written(served, cli):
    """`curl -d 'text=café'` sends the UTF-8 bytes unescaped; a URL-encoded body's bytes are UTF-8 whether
    raw or %-escaped (WHATWG). They were decoded as latin-1, and the note stored as 'cafÃ©'."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("carol")
    headers = {"authorization": f"Bearer {token}", "content-type": "application/x-www-form-urlencoded"}
    with httpx2.Client(base_url=served.url, timeout=10, headers=headers) as http:
        for body in ("text=café ✓ %E2%9C%93", "text=caf%C3%A9 ✓ ✓", "text=café+%E2%9C%93+✓"):
            posted = http.post("/api/post", content=f"kind=note&session_id={session}&{body}".encode())
            assert posted.status_code == 200, posted.text
        broken = http.post("/api/post", content=f"kind=note&session_id={session}&text=a\xffb".encode("latin-1"))
        assert broken.status_code == 200, broken.text  # not UTF-8: replaced, as an invalid %-escape is
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [n["text"] for n in notes] == ["café ✓ ✓"] * 3 + ["a\ufffdb"]


def test_another_sites_page_cannot_sign_a_browser_in(served):
    """Login CSRF: a page elsewhere auto-submitting a form to /login signed the browser in with a token of the
    attacker's choosing (SameSite=Strict stops a cookie being sent cross-site, not being set by a top-level
    navigation's answer), so what the person then posted went out as that token. A sign-in whose Origin is
    not this server's is refused as a cross-site post is."""
    token = served.token("mallory", "--agent", "mallory")
    with httpx2.Client(base_url=served.url, timeout=10) as http:
        forged = http.post("/login", data={"token": token}, headers={"origin": "https://evil.example"},
                           follow_redirects=False)
        assert forged.status_code == 403 and "set-cookie" not in forged.headers
        assert forged.json()["error"]["type"] == "ForbiddenError"
        null = http.post("/login", data={"token": token}, headers={"origin": "null"}, follow_redirects=False)
        assert null.status_code == 403 and "set-cookie" not in null.headers
        ours = http.post("/login", data={"token": token}, headers={"origin": served.url}, follow_redirects=False)
        assert ours.status_code == 303 and "set-cookie" in ours.headers
        assert sign_in(http, token).headers["set-cookie"]  # a client that sends no Origin still signs in


def test_a_head_request_for_the_event_stream_ends_and_its_connection_serves_the_next(served):
    """HEAD /events (curl -I, a monitor's probe) answered the headers, then ran the endless stream with its
    body dropped: the response never ended, and a keep-alive client's next request on that connection waited
    forever. A HEAD now gets the stream's headers and its end."""
    token = served.token("viewer", "--read-only")
    with httpx2.Client(base_url=served.url, timeout=5, headers={"authorization": f"Bearer {token}"}) as http:
        head = http.head("/events")
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
        assert http.get("/healthz").json() == {"ok": True}  # the same connection, answered at once
        assert http.head("/events", headers={"authorization": "Bearer syn_nope"}).status_code == 401


def test_a_post_of_an_unknown_kind_is_refused_not_taken_for_a_note(served, cli):
    """`kind` is note or signal; anything else (kind=sginal, a typo) was posted as a note of the form's `text`."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("carol")
    with httpx2.Client(base_url=served.url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        typo = http.post("/api/post", data={"kind": "sginal", "session_id": session, "to": "alice", "text": "x",
                                            "content": "x"})
        assert typo.status_code == 400 and typo.json()["error"]["type"] == "UsageError", typo.text
        assert "sginal" in typo.json()["error"]["message"]
        plain = http.post("/api/post", data={"session_id": session, "text": "no kind: a note"})
        assert plain.status_code == 200, plain.text
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert [n["text"] for n in notes] == ["no kind: a note"]


def test_a_persons_first_posts_at_once_all_go_through(served, cli):
    """Twelve posts at once (a double click, two tabs): each goes through (a person's first post once
    registered them, and two at once were ConflictError; a person now registers nothing)."""
    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("team")
    answers: list = []

    def post(i):
        with httpx2.Client(base_url=served.url, timeout=30, headers={"authorization": f"Bearer {token}"}) as http:
            answers.append(http.post("/api/post", data={"kind": "note", "session_id": session,
                                                        "text": f"note {i}"}))

    threads = [threading.Thread(target=post, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    notes = json.loads(cli("read-notes", "--session-id", session, "--json").stdout)["notes"]
    assert sorted(n["text"] for n in notes) == sorted(f"note {i}" for i in range(12))
