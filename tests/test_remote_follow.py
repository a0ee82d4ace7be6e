"""The verbs a sandbox used to be refused, through the team server (contract §16): `claims`, `guard`, `memories`,
`escalations` (list and ack) and `read-signals --follow` answer as they do beside the store; the verbs that stay
beside the store say why, naming what to do instead.

Two state directories as in tests/test_remote.py (the `team` fixture): a real `synapolis serve` on the team's
(SQLite or PostgreSQL), and a sandbox that has only the server's URL and a token.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timezone

from conftest import SANDBOX_OWN, clean_env, refused, start_server, stop, succeeded as ok, synapolis_cmd


def same(a: dict, b: dict, *ignore) -> bool:
    return {k: v for k, v in a.items() if k not in ignore} == {k: v for k, v in b.items() if k not in ignore}


def test_claims_and_guard_answer_as_beside_the_store(team):
    token = team.token("sandbox")
    me = ok(team.there(token, "start", "--json"))["agent_id"]
    ok(team.here("start", "--agent-id", "bob"))
    ok(team.here("claim", "src/api/**", "--agent-id", "bob"))
    ok(team.there(token, "claim", "docs/guide.md", "--json"))
    here, there = ok(team.here("claims", "--json")), ok(team.there(token, "claims", "--json"))
    assert [c["item"] for c in there["claims"]] == [c["item"] for c in here["claims"]] == ["docs/guide.md", "src/api/**"]
    assert [c["claimed_by"] for c in there["claims"]] == [me, "bob"] and there["waiting"] == []
    text = team.there(token, "claims")
    assert text.returncode == 0 and "src/api/**" in text.stdout and "HOLDER" in text.stdout
    # guard: the sandbox's own paths (absolute in its clone, or project-relative) against the server's claims
    mine = str(team.sandbox_dir.parent / "docs" / "guide.md")
    held = str(team.sandbox_dir.parent / "src" / "api" / "users.py")
    blocked = team.there(token, "guard", held, mine, "/etc/passwd", "--json")
    assert blocked.returncode == 3, blocked.stderr
    answer = json.loads(blocked.stdout)
    assert answer["allowed"] is False and answer["agent_id"] == me
    assert [(b["path"], b["claimed_by"], b["item"]) for b in answer["blocked"]] == [(held, "bob", "src/api/**")]
    assert answer["outside"] == ["/etc/passwd"]
    assert team.there(token, "guard", "docs/guide.md").returncode == 0  # its own claim
    said = team.there(token, "guard", "src/api/x.py")
    assert said.returncode == 3 and "held by bob" in said.stdout
    # the same question beside the store, asked as the sandbox's agent, has the same answer
    local = json.loads(team.here("guard", "src/api/users.py", "--agent-id", me, "--json").stdout)
    assert [b["item"] for b in local["blocked"]] == ["src/api/**"]
    # a read-only token may read the claims, and asks the guard as nobody
    reader = team.token("reader", "--read-only")
    assert len(ok(team.there(reader, "claims", "--json"))["claims"]) == 2
    assert team.there(reader, "guard", "docs/guide.md").returncode == 3  # nobody: held by a live agent
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_a_pinned_token_guards_as_its_agent_without_a_run_token(team):
    config = json.loads((team.server_dir / "synapolis.json").read_text())
    (team.server_dir / "synapolis.json").write_text(json.dumps(dict(config, require_run_token=True)))
    pinned = team.token("pinned", "--agent", "builder")
    ok(team.there(pinned, "start", "--json"))
    ok(team.there(pinned, "claim", "src/core.py", "--json"))
    (team.sandbox_dir / "identity.json").unlink()  # nothing on the sandbox but the token
    assert team.there(pinned, "guard", "src/core.py").returncode == 0, "the token vouches for builder"
    assert team.there(pinned, "guard", "src/core.py", "--agent-id", "intruder").returncode == 7


def test_memories_and_escalations_list_and_ack_through_the_server(team, put_heartbeat):
    token = team.token("sandbox")
    ok(team.there(token, "start", "--json"))
    memories = json.dumps(["tests run with uv run pytest"])
    assert ok(team.there(token, "tired", "--memories", "-", "--json", input=memories))["outcome"] == "consolidated"
    here, there = ok(team.here("memories", "--json")), ok(team.there(token, "memories", "--json"))
    assert [m["text"] for m in there["memories"]] == [m["text"] for m in here["memories"]] == \
        ["tests run with uv run pytest"]
    assert "tests run with uv run pytest" in team.there(token, "memories").stdout
    refused(team.there(token, "memories", "--limit", "0"), 2, "UsageError")
    # an incident on the team's side: an agent long silent
    old = datetime(2020, 1, 1, tzinfo=timezone.utc)
    put_heartbeat("ghost", "2020-01-01T00:00:00.000000Z", written_at=old)
    ok(team.here("monitor"))
    ok(team.here("escalate"))
    here, there = ok(team.here("escalations", "--json")), ok(team.there(token, "escalations", "--json"))
    assert [i["id"] for i in there["incidents"]] == [i["id"] for i in here["incidents"]] and there["incidents"]
    incident = there["incidents"][0]
    assert incident["agent_id"] == "ghost" and incident["acked_at"] is None
    assert team.there(token, "escalations", "--all").returncode == 0
    reader = team.token("reader", "--read-only")
    assert ok(team.there(reader, "escalations", "--json"))["incidents"][0]["id"] == incident["id"]
    refused(team.there(reader, "escalations", "ack", incident["id"]), 7, "ForbiddenError")
    refused(team.there(token, "escalations", "ack", "ffffffffffff"), 6, "NotFoundError")
    acked = ok(team.there(token, "escalations", "ack", incident["id"][:8], "--json"))
    assert acked["acked"] is True and acked["incident"]["id"] == incident["id"]
    assert ok(team.here("escalations", "--json"))["incidents"][0]["acked_at"]
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def follower(team, token, *args, poll_s=None):
    """`read-signals --follow --json` in the sandbox; its stdout lines collect in `proc.lines` (a queue), read
    by `proc.reader` (a thread that ends at the process's end of output)."""
    import queue
    import threading

    env = {"SYNAPOLIS_SERVER": team.url, "SYNAPOLIS_TOKEN": token}
    if poll_s is not None:
        env["SYNAPOLIS_FOLLOW_POLL_S"] = str(poll_s)
    proc = subprocess.Popen(synapolis_cmd(team.sandbox_dir, "read-signals", "--follow", "--json", *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(env))
    proc.lines = queue.Queue()
    proc.reader = threading.Thread(target=lambda: [proc.lines.put(line) for line in proc.stdout], daemon=True)
    proc.reader.start()
    return proc


def next_line(proc, timeout_s=20) -> dict:
    import queue

    try:
        return json.loads(proc.lines.get(timeout=timeout_s))
    except queue.Empty:
        raise AssertionError("no line within the bound") from None


def test_follow_prints_each_new_signal_once_and_ends_cleanly_on_ctrl_c(team):
    token = team.token("sandbox")
    me = ok(team.there(token, "start", "--json"))["agent_id"]
    ok(team.here("start", "--agent-id", "lead"))
    ok(team.here("signal", "--agent-id", "lead", me, "before the follow"))
    proc = follower(team, token, poll_s=1)
    try:
        assert next_line(proc)["content"] == "before the follow"
        began = time.monotonic()
        ok(team.here("signal", "--agent-id", "lead", me, "one"))
        assert next_line(proc)["content"] == "one"
        assert time.monotonic() - began < 5  # woken by the server's change feed, not the poll's end
        ok(team.here("signal", "--agent-id", "lead", "*", "two"))
        ok(team.here("signal", "--agent-id", "lead", me, "three"))
        assert [next_line(proc)["content"] for _ in range(2)] == ["two", "three"]
        # past one long-poll's end (1 s here): the next poll must neither repeat nor miss. A poll that ends
        # empty leaves nothing another process can see, so this one wait is a fixed one.
        time.sleep(1.5)
        ok(team.here("signal", "--agent-id", "lead", me, "four"))
        assert next_line(proc)["content"] == "four"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) in (0, 130)
        assert "Traceback" not in proc.stderr.read()
        proc.reader.join(timeout=10)  # every line the follower printed is in the queue
        assert proc.lines.empty()  # nothing printed twice
    finally:
        proc.kill()
        proc.wait()


def test_follow_ends_with_exit_8_in_bounded_time_when_the_server_goes_away(ws, tmp_path, cli):
    from conftest import Team

    proc, url = start_server(ws.root)
    team = Team(ws.root, tmp_path / "sandbox" / "state", url, proc, cli)
    try:
        token = team.token("sandbox")
        me = ok(team.there(token, "start", "--json"))["agent_id"]
        following = follower(team, token)
        ok(team.here("start", "--agent-id", "lead"))
        ok(team.here("signal", "--agent-id", "lead", me, "now in a long-poll"))
        assert next_line(following)["content"] == "now in a long-poll"  # printed: the next poll has begun
        assert following.poll() is None
        stopped = time.monotonic()
        stop(proc)
        code = following.wait(timeout=40)
        assert code == 8, following.stderr.read()
        assert time.monotonic() - stopped < 15
        said = following.stderr.read()
        assert "BusyError" in said and "127.0.0.1" in said and "Traceback" not in said
    finally:
        stop(proc)


def test_verbs_that_stay_beside_the_store_say_why(team):
    token = team.token("sandbox")
    mcp = team.there(token, "mcp")
    refused(mcp, 2, "UsageError")
    assert f"{team.url}/mcp" in mcp.stderr
    for args, says in ((["watchdog"], "cron"), (["tokens", "list"], "server's machine"), (["serve"], "SYNAPOLIS_SERVER"),
                       (["notify", "test"], "server's"), (["init"], "run it there")):
        done = team.there(token, *args)
        refused(done, 2, "UsageError")
        assert says in done.stderr, done.stderr
    assert team.sandbox_holds() <= SANDBOX_OWN, team.sandbox_holds()


def test_a_follow_poll_that_is_no_number_of_seconds_is_one_line(team):
    token = team.token("sandbox")
    ok(team.there(token, "start", "--json"))
    for bad in ("soon", "0", "26", "nan"):
        done = team.there(token, "read-signals", "--follow", "--json", env={"SYNAPOLIS_FOLLOW_POLL_S": bad})
        assert "SYNAPOLIS_FOLLOW_POLL_S" in refused(done, 2, "UsageError")


def test_follow_through_the_server_prints_every_unread_signal_past_a_budget_cut_page(team):
    # four 40,000-character signals: the first page holds two (PAGE_BUDGET_CHARS); the follower used to go on
    # from the newest sequence after it and never print the other two
    token = team.token("sandbox")
    me = ok(team.there(token, "start", "--json"))["agent_id"]
    ok(team.here("start", "--agent-id", "lead"))
    for i in range(4):
        ok(team.here("signal", "--agent-id", "lead", me, "x" * 40_000 + f" big {i}"))
    proc = follower(team, token, poll_s=1)
    try:
        assert [next_line(proc)["content"][-5:] for _ in range(4)] == ["big 0", "big 1", "big 2", "big 3"]
        ok(team.here("signal", "--agent-id", "lead", me, "after"))
        assert next_line(proc)["content"] == "after"
    finally:
        proc.kill()
        proc.wait()


def test_a_server_only_knob_given_by_position_is_a_usage_error_not_a_crash(team):
    # escalation.ack(ws, incident_id, now): `now` is the server's clock, refused by name, but `args` reached it
    # by position, and a text there was a 500 with a traceback in the server's log
    import httpx2

    token = team.token("sandbox")
    with httpx2.Client(base_url=team.url, timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        answer = http.post("/api/call/escalations_ack", json={"args": ["abcdefgh", "2020-01-01T00:00:00Z"]})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "UsageError" and "now" in error["message"]
        answer = http.post("/api/call/escalations_ack", json={"args": ["abcdefgh"]})  # as the CLI sends it
        assert answer.status_code == 404 and answer.json()["error"]["type"] == "NotFoundError"
    assert "Traceback" not in "".join(team.proc.said)
