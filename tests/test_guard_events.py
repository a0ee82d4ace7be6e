"""The guard's refusals as dashboard events (issue 32, contract §14/§15): a tool call a real `synapolis hook`
process denies, a `claim --wait` refused as a deadlock between two real processes, and a commit a real git's
pre-commit hook refuses are each kept in the store's bounded event record (guard-events.jsonl on SQLite, table
guard_events on PostgreSQL, where a denial on one machine shows on another's team server) and shown by the
dashboard's JSON and page; the refused commit also reaches a notify target as io.synapolis.guard.denied (data.refused "commit").
Recording never turns a refusal into a failure."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta

import pytest

from conftest import clean_env, configure, hook_denies, refuse_a_deadlock, synapolis_cmd, wait_until
from synapolis import actions, claims, dashboard, guard_events
from synapolis.harness import hooks
from synapolis.heartbeat import write_heartbeat
from synapolis.store import store_for
from synapolis.workspace import Workspace

CONV = "conv-of-bob-0001"


def alice_holds(ws, item="src/api/**"):
    actions.start(ws, agent_id="alice", env={}, write_identity=False)
    claims.claim(ws, item, "alice", ttl_s=3600)


def git(folder, *args, check=True) -> subprocess.CompletedProcess:
    env = clean_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
                    GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, env=env, timeout=120)
    assert not check or done.returncode == 0, (args, done.stderr)
    return done


def refused_commit(project, state_dir) -> subprocess.CompletedProcess:
    """A git repository at `project` (state directory ignored) with our pre-commit hook; a commit of
    src/api/users.py, which the hook refuses."""
    (project / "src" / "api").mkdir(parents=True, exist_ok=True)
    git(project.parent, "init", "-q", "-b", "main", str(project))
    (project / ".gitignore").write_text("/*\n!/src/\n!/.gitignore\n")  # the state directory, a browser's profile...
    done = subprocess.run(synapolis_cmd(state_dir, "hooks", "install", "git", "--project-dir", project),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    (project / "src" / "api" / "users.py").write_text("v = 2\n")
    git(project, "add", "-A")
    done = git(project, "commit", "-m", "touch users", check=False)
    assert done.returncode != 0 and "src/api/users.py" in done.stderr and "alice" in done.stderr, done.stderr
    return done


def deadlock(state_dir) -> None:
    bob = refuse_a_deadlock(state_dir)
    assert bob.returncode == 3 and "deadlock" in bob.stderr, bob.stderr


def two_holders(ws) -> None:
    for agent in ("alice", "bob"):
        write_heartbeat(ws.paths, agent)  # live holders: a claim of an agent with no heartbeat is free
    claims.claim(ws, "ticket:1", "alice")
    claims.claim(ws, "ticket:2", "bob")


# -- the record, on both stores ---------------------------------------------------------------------------

def test_a_denied_edit_is_kept_and_the_dashboard_shows_it(ws):
    project = ws.paths.root.parent
    alice_holds(ws)
    before = datetime.now().astimezone()
    hook_denies(ws.paths.root, project, "src/api/users.py")
    data = dashboard.collect(Workspace.open(ws.paths.root))
    (event,) = data["events"]
    assert event["type"] == "io.synapolis.guard.denied" and event["kind"] == "denied"
    assert event["paths"] == ["src/api/users.py"] and event["holders"] == ["alice"]
    assert event["agent_id"] == hooks.agent_id_for("claude-code", CONV, {}) and event["via"] == "claude-code Edit"
    at = datetime.fromisoformat(event["at"].replace("Z", "+00:00"))
    assert before - timedelta(seconds=30) < at < datetime.now().astimezone() + timedelta(seconds=30)
    assert data["events_recent"] == 1
    # an hour on, the event is still listed but no longer counted for the title
    later = dashboard.collect(Workspace.open(ws.paths.root), now=at + timedelta(hours=2))
    assert len(later["events"]) == 1 and later["events_recent"] == 0


def test_a_wait_refused_as_a_deadlock_is_kept(ws, state_dir):
    two_holders(ws)
    deadlock(state_dir)
    (event,) = dashboard.collect(Workspace.open(state_dir))["events"]
    assert event["type"] == "io.synapolis.claims.deadlock" and event["agent_id"] == "bob"
    assert event["paths"] == ["ticket:1", "ticket:2"] and event["holders"] == ["alice"]
    assert event["via"] == "claim --wait" and "deadlock" in event["line"]


def test_a_refused_commit_is_kept_and_told(ws, receiver):
    ws = configure(ws, notify=[{"url": receiver.url("/ce"), "format": "cloudevents"},
                               {"url": receiver.url("/denials-only"), "format": "slack",
                                "events": ["io.synapolis.guard.denied"]}])
    project = ws.paths.root.parent
    alice_holds(ws)
    refused_commit(project, ws.paths.root)
    wait_until(lambda: receiver.at("/ce"), 15, "the refused commit told")
    (told,) = receiver.at("/ce")
    cloud = json.loads(told["body"])
    assert told["headers"]["content-type"].startswith("application/cloudevents+json")
    assert cloud["type"] == "io.synapolis.guard.denied" and cloud["subject"] == "src/api/users.py"  # §15: "a tool call or commit refused"
    assert cloud["data"]["refused"] == "commit"
    assert cloud["data"]["blocked"][0]["claimed_by"] == "alice" and "token" not in cloud["data"]["blocked"][0]
    (event,) = dashboard.collect(Workspace.open(ws.paths.root))["events"]
    assert event["type"] == "io.synapolis.guard.denied" and event["kind"] == "commit refused"
    assert event["paths"] == ["src/api/users.py"] and event["holders"] == ["alice"] and event["via"] == "git commit"
    assert event["agent_id"] is None  # a person committing, no agent identity
    wait_until(lambda: receiver.at("/denials-only"), 15, "the refused commit told to the denials' filter too")
    assert "git commit" in json.loads(receiver.at("/denials-only")[0]["body"])["text"]
    # `guard --staged` without --commit (a person asking) is a pure query: nothing recorded, nothing told
    asked = subprocess.run(synapolis_cmd(ws.paths.root, "guard", "--staged"), cwd=project, capture_output=True,
                           text=True, env=clean_env(), timeout=60)
    assert asked.returncode == 3
    assert len(dashboard.collect(Workspace.open(ws.paths.root))["events"]) == 1


def test_a_refused_commit_of_a_file_whose_name_is_not_utf8_is_kept(ws):
    # git names such a file in bytes; its path reached the record with a surrogate in it, which neither the
    # record's UTF-8 line nor PostgreSQL takes, and the refusal was silently left out of the record
    project = ws.paths.root.parent
    alice_holds(ws)
    git(project.parent, "init", "-q", "-b", "main", str(project))
    (project / ".gitignore").write_text("/*\n!/src/\n!/.gitignore\n")
    (project / "src" / "api").mkdir(parents=True, exist_ok=True)
    (project / "src" / "api" / os.fsdecode(b"caf\xe9.py")).write_text("v = 1\n")
    git(project, "add", "-A")
    done = subprocess.run(synapolis_cmd(ws.paths.root, "guard", "--staged", "--commit"), cwd=project,
                          capture_output=True, text=True, errors="replace", env=clean_env(), timeout=60)
    assert done.returncode == 3 and "alice" in done.stdout, done.stderr
    (event,) = guard_events.recent(ws, 5)
    assert event["kind"] == "commit refused" and event["paths"] == ["src/api/caf\ufffd.py"]
    assert event["holders"] == ["alice"] and "caf\ufffd.py" in event["line"]


def test_the_record_keeps_the_newest_200_newest_first(ws):
    from synapolis.store.local import events as events_local

    for n in range(400):  # long lines: past the SQLite record's trim size more than once
        guard_events.tell(ws, guard_events.GUARD_DENIED, f"f{n}", {}, agent_id="bob", paths=[f"src/f{n}.py"],
                          holders=["alice"], via="test", line=f"refusal {n} " + "x" * 400)
    kept = guard_events.recent(ws, 1000)
    assert len(kept) == guard_events.KEEP == 200
    assert [e["paths"][0] for e in kept[:2]] == ["src/f399.py", "src/f398.py"] and kept[-1]["paths"] == ["src/f200.py"]
    record = ws.paths.root / events_local.FILE
    if store_for(ws).kind == "sqlite":
        longest = max(len(line.encode()) + 1 for line in record.read_text().splitlines())
        assert record.stat().st_size <= max(events_local.TRIM_BYTES, 2 * guard_events.KEEP * longest) + longest
        assert len(record.read_text().splitlines()) <= 2 * guard_events.KEEP
    else:
        assert not record.exists()
    shown = dashboard.collect(Workspace.open(ws.paths.root))["events"]
    assert len(shown) == dashboard.EVENTS_SHOWN and shown[0]["line"].startswith("refusal 399 ")
    # one refusal of 5,000 paths is one bounded record
    many = guard_events.tell(ws, guard_events.GUARD_DENIED, "x", {}, agent_id="bob",
                             paths=[f"src/g{n}.py" for n in range(5000)], holders=["alice"] * 5000, via="test",
                             line="y" * 100_000)
    assert len(many["paths"]) == guard_events.LIST_MAX and many["more_paths"] == 5000 - guard_events.LIST_MAX
    assert len(many["line"]) == guard_events.LINE_MAX and guard_events.recent(ws, 1)[0]["id"] == many["id"]


@pytest.mark.sqlite_only
def test_a_record_that_cannot_be_written_never_costs_the_refusal(ws, receiver):
    """A damaged record is read as far as it goes; one that cannot be written (a folder or a planted link in its
    place) leaves the denial a denial, still told to the notify targets, and nothing is written through a link."""
    ws = configure(ws, notify=[{"url": receiver.url("/ce"), "format": "cloudevents"}])
    project = ws.paths.root.parent
    alice_holds(ws)
    record = ws.paths.root / "guard-events.jsonl"
    record.write_text('{"torn": ')  # a writer killed mid-line
    hook_denies(ws.paths.root, project, "src/api/users.py")
    assert [e["paths"] for e in store_for(ws).recent_events(10)] == [["src/api/users.py"]]
    record.unlink()
    record.mkdir()
    hook_denies(ws.paths.root, project, "src/api/other.py")
    wait_until(lambda: len(receiver.at("/ce")) == 2, 15, "both denials told")
    assert dashboard.collect(Workspace.open(ws.paths.root))["events"] == []
    # a link planted in its place is not written through
    record.rmdir()
    outside = project / "elsewhere.txt"
    outside.write_text("mine\n")
    record.symlink_to(outside)
    hook_denies(ws.paths.root, project, "src/api/third.py")
    wait_until(lambda: len(receiver.at("/ce")) == 3, 15, "the third denial told")
    assert outside.read_text() == "mine\n"


@pytest.mark.sqlite_only
def test_lines_not_in_the_record_shape_never_reach_the_page(ws):
    """Lines edited by hand or written by something else (a list, a number for a type, a text for the paths, a
    missing id) are left out of what the dashboard draws; the well-formed events around them are kept, in order."""
    project = ws.paths.root.parent
    alice_holds(ws)
    hook_denies(ws.paths.root, project, "src/api/first.py")
    record = ws.paths.root / "guard-events.jsonl"
    good = json.loads(record.read_text().splitlines()[0])
    with record.open("a") as out:
        for bad in ([1, 2], {**good, "type": 5}, {**good, "paths": "src/api/x.py"}, {**good, "holders": [None]},
                    {k: v for k, v in good.items() if k != "id"}, {**good, "more_paths": "many"}, "text"):
            out.write(json.dumps(bad) + "\n")
    hook_denies(ws.paths.root, project, "src/api/second.py")
    assert [e["paths"] for e in guard_events.recent(ws, 50)] == [["src/api/second.py"], ["src/api/first.py"]]
    shown = dashboard.collect(Workspace.open(ws.paths.root))["events"]
    assert [e["paths"] for e in shown] == [["src/api/second.py"], ["src/api/first.py"]]


# -- PostgreSQL: a denial on one machine, the team server on another ---------------------------------------

@pytest.mark.postgres
def test_a_denial_on_one_machine_shows_on_the_team_server_of_another(tmp_path, pg_url):
    """Two state directories on one PostgreSQL store (a laptop runs `serve`, a CI runner runs the agent): the
    runner's hook process denies an edit, and the laptop's /api/dashboard lists the denial, woken by the
    database's NOTIFY (the laptop's files never change)."""
    import httpx2

    from conftest import start_server, stop, use_store

    laptop, runner = tmp_path / "laptop", tmp_path / "runner"
    for project in (laptop, runner):
        (project / "src" / "api").mkdir(parents=True)
    ws_laptop, ws_runner = use_store(laptop / "state", pg_url), use_store(runner / "state", pg_url)
    alice_holds(ws_laptop)
    made = subprocess.run(synapolis_cmd(ws_laptop.paths.root, "tokens", "create", "ops", "--read-only", "--json"),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    token = json.loads(made.stdout)["token"]
    proc, url = start_server(ws_laptop.paths.root)
    try:
        with httpx2.Client(base_url=url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
            assert http.get("/api/dashboard").json()["events"] == []
            with http.stream("GET", "/events") as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith("event: hello")
                hook_denies(ws_runner.paths.root, runner, "src/api/users.py")
                assert any(line.startswith("event: change") for line in lines), "no change pushed"
            data = http.get("/api/dashboard").json()
        (event,) = data["events"]
        assert event["paths"] == ["src/api/users.py"] and event["holders"] == ["alice"]
        assert data["events_recent"] == 1
        assert not (laptop / "state" / "guard-events.jsonl").exists()  # in the database, not a file
    finally:
        stop(proc)


@pytest.mark.postgres
def test_a_database_left_at_schema_10_gets_the_events_table(tmp_path, pg_url):
    import psycopg

    from conftest import use_store
    from synapolis.store import close_all

    ws = use_store(tmp_path / "state", pg_url)
    alice_holds(ws)
    close_all()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE guard_events")
        conn.execute("UPDATE synapolis_schema SET version = 10")
    guard_events.tell(Workspace.open(ws.paths.root), guard_events.GUARD_DENIED, "x", {}, agent_id="bob",
                      paths=["src/api/x.py"], holders=["alice"], via="test", line="after the upgrade")
    assert [e["line"] for e in store_for(Workspace.open(ws.paths.root)).recent_events(5)] == ["after the upgrade"]
    with psycopg.connect(pg_url) as conn:
        from synapolis.store.postgres.schema import SCHEMA_VERSION

        assert conn.execute("SELECT version FROM synapolis_schema").fetchone()[0] == SCHEMA_VERSION >= 11


# -- the page, in a real browser ---------------------------------------------------------------------------

def test_the_page_lists_each_refusal_as_it_happens(served, cli, browser, receiver, state_dir):
    """The dashboard open in headless Chromium (a browser in India): a real hook process's denial, a deadlock
    between two real `claim --wait` processes and a commit refused by a real git appear in its Events list
    without a reload, each with its time in the browser's zone, the agent, the path(s) and the holder; the tab's
    title counts them; the refused commit also reached the notify target."""
    ws = configure(Workspace.open(state_dir), notify=[{"url": receiver.url("/ntfy"), "format": "ntfy"}])
    project = ws.paths.root.parent
    alice_holds(ws)
    two_holders(ws)
    token = served.token("ops")
    page = browser.new_page()
    page.context.new_cdp_session(page).send("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    page.goto(served.url + "/")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#live:text-is('live')", timeout=10_000)
    assert page.is_visible("#no-events") and page.text_content("#no-events") == "None refused."
    page.evaluate("window.notReloaded = true")

    hook_denies(state_dir, project, "src/api/users.py")
    denied = page.wait_for_selector('#events li[data-type="io.synapolis.guard.denied"]', timeout=10_000)
    text = denied.text_content()
    assert "denied" in text and hooks.agent_id_for("claude-code", CONV, {}) in text and "src/api/users.py" in text
    assert denied.query_selector(".holder").text_content() == "alice" and "claude-code Edit" in text
    (event,) = dashboard.collect(ws)["events"]
    utc = datetime.fromisoformat(event["at"].replace("Z", "+00:00"))
    shown = denied.query_selector("time").text_content()
    local = utc + timedelta(hours=5, minutes=30)
    assert local.strftime("%I:%M") in shown and utc.strftime("%I:%M") not in shown, (shown, event["at"])
    assert denied.query_selector("time").get_attribute("datetime") == event["at"]
    assert page.title() == "(1 refused in 1h) synapolis"

    deadlock(state_dir)
    stuck = page.wait_for_selector('#events li[data-type="io.synapolis.claims.deadlock"]', timeout=10_000)
    assert "deadlock" in stuck.text_content() and "bob" in stuck.text_content() and "ticket:1" in stuck.text_content()
    assert stuck.query_selector(".holder").text_content() == "alice"

    refused_commit(project, state_dir)
    commit = page.wait_for_selector('#events li[data-kind="commit refused"]', timeout=10_000)
    assert "commit refused" in commit.text_content() and "a person" in commit.text_content()
    assert "git commit" in commit.text_content() and commit.query_selector(".holder").text_content() == "alice"
    kinds = [li.get_attribute("data-kind") for li in page.query_selector_all("#events li")]
    assert kinds == ["commit refused", "deadlock", "denied"]
    page.wait_for_function("document.title === '(3 refused in 1h) synapolis'", timeout=10_000)
    assert page.evaluate("window.notReloaded") is True
    # the text filter narrows the events too
    page.fill("#filter-text", "ticket")
    assert [li.get_attribute("data-type") for li in page.query_selector_all("#events li")] == [
        "io.synapolis.claims.deadlock"]
    page.fill("#filter-text", "")

    wait_until(lambda: any(r["headers"].get("title", "") for r in receiver.at("/ntfy")
                           if b"git commit" in r["body"]), 15, "the refused commit told")
    told = [r for r in receiver.at("/ntfy") if b"git commit" in r["body"]][0]
    assert b"src/api/users.py" in told["body"] and b"alice" in told["body"] and "no_entry" in told["headers"]["tags"]
    # a phone: the events fit its width
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


@pytest.mark.sqlite_only  # on PostgreSQL the record is a table: nothing is rewritten
def test_events_larger_than_the_trim_size_together_are_not_rewritten_on_every_refusal(ws):
    """200 refusals of ~1 KB each pass the SQLite record's 128 KiB: the file is rewritten about once in 200
    appends (it is replaced whole: a new inode), not on every one, and still answers the newest 200."""
    from synapolis.store.local import events as events_local

    record, inodes = ws.paths.root / events_local.FILE, set()
    for n in range(600):
        guard_events.tell(ws, guard_events.GUARD_DENIED, f"f{n}", {}, agent_id="bob",
                          paths=[f"src/module_{n}_{k}.py" for k in range(20)], holders=["alice"] * 20, via="test",
                          line=f"refusal {n} " + "y" * 300)
        inodes.add(os.stat(record).st_ino)
    assert len(inodes) <= 6, f"{len(inodes)} files for 600 appends"
    kept = guard_events.recent(ws, 1000)
    assert len(kept) == 200 and kept[0]["line"].startswith("refusal 599 ") and kept[-1]["line"].startswith("refusal 400 ")
