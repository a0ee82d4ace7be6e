"""Notifications (contract §15): each format as a real receiver on 127.0.0.1 gets it, retries, the event filter,
`notify test`, secrets never sent, and verbs that never wait for a receiver."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from conftest import configure, refuse_a_deadlock, synapolis_cmd, clean_env, processes_running, wait_until
from synapolis import notify
from synapolis.atomic import atomic_write_json, read_jsonl
from synapolis.notify_send import deliver
from synapolis.timeutil import now_ts
from synapolis.workspace import Workspace


def put_monitor(ws, **statuses):
    atomic_write_json(ws.paths.monitor, {"generated_at": now_ts(), "agents": [
        {"agent_id": a, "effective_status": s} for a, s in sorted(statuses.items())]})


def escalate(state_dir, timeout=30):
    result = subprocess.run(synapolis_cmd(state_dir, "escalate", "--json"), capture_output=True, text=True,
                            timeout=timeout, env=clean_env())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def senders_done(state_dir, deadline_s: float = 30) -> None:
    """Wait until no notification sender of this state directory runs (each is a detached process whose spool
    lies under it): everything handed over by now has reached the receiver, or been given up."""
    wait_until(lambda: not processes_running("synapolis.notify_send", str(state_dir)), deadline_s,
               "the notification senders to finish")


def incident_id(state_dir, agent):
    result = subprocess.run(synapolis_cmd(state_dir, "escalations", "--json"), capture_output=True, text=True,
                            env=clean_env(), timeout=30)
    return next(i["id"] for i in json.loads(result.stdout)["incidents"] if i["agent_id"] == agent)


def targets(receiver, *specs):
    return [{"url": receiver.url(path), "format": fmt, **({"events": events} if events else {})}
            for path, fmt, events in specs]


def test_each_format_reaches_its_receiver_from_a_real_escalation_pass(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/ce", "cloudevents", None), ("/slack", "slack", None),
                                      ("/ntfy", "ntfy", None)))
    put_monitor(ws, worker="dead")
    escalate(state_dir)
    iid = incident_id(state_dir, "worker")
    for path in ("/ce", "/slack", "/ntfy"):
        wait_until(lambda: receiver.at(path), 15, f"a POST to {path}")

    (ce,) = receiver.at("/ce")
    assert ce["headers"]["content-type"] == "application/cloudevents+json"
    event = json.loads(ce["body"])
    assert event["specversion"] == "1.0" and event["type"] == "io.synapolis.incident.opened"
    assert event["source"] == f"synapolis://{socket.gethostname()}/state"
    assert event["subject"] == "worker" and event["datacontenttype"] == "application/json"
    assert event["time"].endswith("Z") and len(event["id"]) >= 16
    assert event["data"]["id"] == iid and event["data"]["condition"] == "dead" and event["data"]["level"] == 2

    (slack,) = receiver.at("/slack")
    assert slack["headers"]["content-type"] == "application/json"
    text = json.loads(slack["body"])["text"]
    assert "\n" not in text and "agent worker is dead" in text
    assert text.endswith(f"escalations ack {iid}") and f"--state-dir {state_dir}" in text

    (ntfy,) = receiver.at("/ntfy")
    assert ntfy["body"].decode() == text
    assert ntfy["headers"]["title"] == "synapolis: worker dead"
    assert ntfy["headers"]["priority"] == "high"
    assert ntfy["headers"]["tags"] == "synapolis,warning"


def test_a_stale_agent_is_default_priority_and_recovery_is_told(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/ntfy", "ntfy", None)))
    put_monitor(ws, worker="stale")
    escalate(state_dir)
    wait_until(lambda: receiver.at("/ntfy"), 15, "the opened notice")
    assert receiver.at("/ntfy")[0]["headers"]["priority"] == "default"
    put_monitor(ws, worker="active")
    escalate(state_dir)
    wait_until(lambda: len(receiver.at("/ntfy")) == 2, 15, "the resolved notice")
    resolved = receiver.at("/ntfy")[1]
    assert resolved["body"].decode().startswith("resolved: agent worker was stale")
    assert resolved["headers"]["tags"] == "synapolis,white_check_mark"


def test_a_receiver_failing_twice_gets_three_tries_of_one_event_id(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/ce", "cloudevents", None)))
    receiver.script["/ce"] = [503, 500]
    put_monitor(ws, worker="dead")
    escalate(state_dir)
    wait_until(lambda: len(receiver.at("/ce")) == 3, 20, "three tries")
    senders_done(state_dir)  # a fourth try would come from the sender, before it ends
    tries = receiver.at("/ce")
    assert len(tries) == 3
    assert len({json.loads(t["body"])["id"] for t in tries}) == 1
    assert tries[2]["at"] - tries[0]["at"] < 30
    assert not (state_dir / notify.FAILURE_LOG).exists()


def test_a_target_still_failing_is_logged_once_per_pass_and_the_pass_succeeds(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/down", "slack", None), ("/up", "slack", None)))
    receiver.script["/down"] = [500] * 10
    put_monitor(ws, a="dead", b="stale")  # two events in one pass
    result = escalate(state_dir)
    assert [e["event"] for e in result["events"]] == ["opened", "opened"]
    log = state_dir / notify.FAILURE_LOG
    wait_until(log.exists, 20, "the failure log")
    senders_done(state_dir)  # the log is whole once its sender has ended
    (line,) = read_jsonl(log)
    assert line["url"] == receiver.url("/down") and line["error"] == "HTTP 500 after 3 tries"
    assert line["delivered"] == 0 and line["undelivered"] == 2
    assert len(receiver.at("/down")) == 3  # the second event is not tried once the target gave up
    assert len(receiver.at("/up")) == 2


def test_the_event_filter(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/resolved", "slack", ["io.synapolis.incident.resolved"]),
                                      ("/incidents", "slack", ["io.synapolis.incident.*"]),
                                      ("/guard", "slack", ["io.synapolis.guard.denied"])))
    put_monitor(ws, worker="dead")
    escalate(state_dir)
    wait_until(lambda: receiver.at("/incidents"), 15, "the opened notice")
    put_monitor(ws, worker="active")
    escalate(state_dir)
    wait_until(lambda: len(receiver.at("/incidents")) == 2, 15, "the resolved notice")
    wait_until(lambda: receiver.at("/resolved"), 15, "the resolved notice on the filtered target")
    assert notify.emit(Workspace.open(state_dir), notify.GUARD_DENIED, "src/app.py", {"tool": "Edit"},
                       line="guard refused Edit of src/app.py")
    wait_until(lambda: receiver.at("/guard"), 15, "the guard notice")
    senders_done(state_dir)  # anything wrongly sent to /resolved has arrived by then
    assert [json.loads(r["body"])["text"].split(":")[0] for r in receiver.at("/resolved")] == ["resolved"]
    assert len(receiver.at("/incidents")) == 2 and len(receiver.at("/guard")) == 1
    assert json.loads(receiver.at("/guard")[0]["body"])["text"] == "guard refused Edit of src/app.py"
    assert notify.wants({"events": ["io.synapolis.claims.*"]}, notify.CLAIMS_DEADLOCK)
    assert not notify.wants({"events": ["io.synapolis.claims.*"]}, notify.GUARD_DENIED)


def test_no_token_or_password_is_ever_sent(ws, receiver):
    ws = configure(ws, notify=targets(receiver, ("/ce", "cloudevents", None)))
    data = {"agent_id": "alice", "run_token": "rt-secret", "nested": [{"Password": "pw", "token": "t", "path": "a"}],
            "api_token_hash": "h"}
    assert notify.emit(ws, notify.CLAIMS_DEADLOCK, "alice", data, line="deadlock")
    wait_until(lambda: receiver.at("/ce"), 15, "the deadlock event")
    body = receiver.at("/ce")[0]["body"].decode()
    assert json.loads(body)["data"] == {"agent_id": "alice", "nested": [{"path": "a"}]}
    assert "secret" not in body and "pw" not in body


def test_notify_test_reports_each_target(ws, receiver, state_dir):
    with socket.socket() as sock:  # a port nobody listens on: refused at once
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    ws = configure(ws, notify=targets(receiver, ("/ok", "ntfy", ["io.synapolis.guard.denied"])) + [
        {"url": f"http://127.0.0.1:{closed}/x", "format": "cloudevents"}])
    result = subprocess.run(synapolis_cmd(state_dir, "notify", "test", "--json"), capture_output=True, text=True,
                            env=clean_env(), timeout=60)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    ok, down = data["targets"]
    assert ok["ok"] and ok["status"] == 200 and ok["tries"] == 1  # a test goes to a target whatever its filter
    assert not down["ok"] and down["tries"] == 3 and "refused" in down["error"].lower()
    assert data["delivered"] == 1 and data["failed"] == 1
    (got,) = receiver.at("/ok")
    assert got["headers"]["title"] == "synapolis: test" and got["headers"]["priority"] == "default"

    configure(ws, notify=targets(receiver, ("/ok", "slack", None)))
    result = subprocess.run(synapolis_cmd(state_dir, "notify", "test"), capture_output=True, text=True,
                            env=clean_env(), timeout=60)
    assert result.returncode == 0 and "1 delivered, 0 failed" in result.stdout
    configure(ws, notify=[])
    result = subprocess.run(synapolis_cmd(state_dir, "notify", "test"), capture_output=True, text=True,
                            env=clean_env(), timeout=60)
    assert result.returncode == 1 and "no notify targets" in result.stdout


def test_a_verb_returns_at_once_while_the_receiver_hangs(ws, receiver, state_dir):
    ws = configure(ws, notify=targets(receiver, ("/hang", "cloudevents", None)))
    receiver.hang["/hang"] = 20
    put_monitor(ws, worker="dead")
    started = time.monotonic()
    escalate(state_dir)
    took = time.monotonic() - started
    wait_until(lambda: receiver.at("/hang"), 15, "the sender to reach the hanging receiver")
    assert took < 5, took  # a Python start-up and one pass; the receiver holds the sender 20 s
    started = time.monotonic()
    assert notify.emit(Workspace.open(state_dir), notify.GUARD_DENIED, "x", {}, line="x")
    assert time.monotonic() - started < 0.5


def test_bad_targets_are_refused_in_one_line(ws, cli):
    for bad, says in [([{"url": "ftp://x", "format": "slack"}], "notify[0].url"),
                      ([{"url": "http://x", "format": "teams"}], "notify[0].format"),
                      ([{"url": "http://x", "format": "slack", "secret": 1}], "unknown key notify[0].secret"),
                      ([{"url": "http://x", "format": "slack", "events": []}], "notify[0].events"),
                      ({"url": "http://x"}, "notify must be a list")]:
        document = json.loads(ws.paths.config.read_text())
        ws.paths.config.write_text(json.dumps({**document, "notify": bad}))
        result = cli("status")
        assert result.returncode == 2 and says in result.stderr, (bad, result.stderr)
        assert "Traceback" not in result.stderr


def test_deliver_counts_tries_and_redacts_credentials(receiver):
    receiver.script["/r?auth=tk"] = [500, 500, 500]  # the receiver sees the query; reports never do
    msg = notify.message(Workspace.open("/tmp/x-state"), notify.TEST, "s", {}, line="l")
    url = receiver.url("/r").replace("http://", "http://user:pw@") + "?auth=tk"
    result = deliver({"url": url, "format": "slack"}, msg, backoff_factor=0.01)
    assert result == {"url": receiver.url("/r"), "format": "slack", "ok": False, "status": 500, "tries": 3,
                      "error": "HTTP 500 after 3 tries"}


@pytest.mark.parametrize("fmt", ["cloudevents", "slack", "ntfy"])
def test_non_ascii_lines_survive_each_format(receiver, fmt):
    msg = notify.message(Workspace.open("/tmp/x-state"), notify.TEST, "agent-ü", {"note": "naïve"},
                         line="agent-ü is dead — ack", title="synapolis: agent-ü dead")
    assert deliver({"url": receiver.url("/u"), "format": fmt}, msg)["ok"]
    body = receiver.at("/u")[0]["body"].decode("utf-8")
    assert "agent-ü" in (json.loads(body)["subject"] if fmt == "cloudevents" else body)


def test_a_wait_refused_as_a_deadlock_is_told_as_a_cloudevent(ws, receiver, state_dir, tmp_path):
    """§14 + §15: the claim --wait that would close a cycle is refused at once, and the targets hear of it."""
    from synapolis import claims
    from synapolis.heartbeat import write_heartbeat

    ws = configure(ws, notify=targets(receiver, ("/ce", "cloudevents", None), ("/slack", "slack", [notify.CLAIMS_DEADLOCK]),
                                      ("/only-incidents", "slack", ["io.synapolis.incident.opened"])))
    for agent in ("alice", "bob"):
        write_heartbeat(ws.paths, agent)  # live holders: a claim of a holder with no heartbeat is free
    claims.claim(ws, "ticket:1", "alice")
    claims.claim(ws, "ticket:2", "bob")
    bob = refuse_a_deadlock(state_dir)
    assert bob.returncode == 3 and "deadlock" in bob.stderr
    wait_until(lambda: receiver.at("/ce") and receiver.at("/slack"), 15, "the deadlock told")
    (ce,) = receiver.at("/ce")
    event = json.loads(ce["body"])
    assert event["type"] == "io.synapolis.claims.deadlock" and event["subject"] == "ticket:1"
    assert [step["agent_id"] for step in event["data"]["cycle"]] == ["bob", "alice"]
    text = json.loads(receiver.at("/slack")[0]["body"])["text"]
    assert "deadlock" in text and "bob" in text and "alice" in text
    assert receiver.at("/only-incidents") == []  # the event filter


def test_an_edit_refused_by_the_harness_hook_is_told(ws, receiver, state_dir):
    """§14 + §15: a pre-tool hook that denies an edit hands io.synapolis.guard.denied to the targets; a warning
    (guard.mode warn) is no denial and is not told."""
    from synapolis import actions, claims
    from synapolis.harness import hooks

    ws = configure(ws, notify=targets(receiver, ("/ce", "cloudevents", [notify.GUARD_DENIED])))
    project = ws.paths.root.parent
    actions.start(ws, agent_id="alice", env={}, write_identity=False)
    claims.claim(ws, "src/api/**", "alice")
    edit = json.dumps({"session_id": "conv-of-bob", "hook_event_name": "PreToolUse", "cwd": str(project),
                       "tool_name": "Edit", "tool_input": {"file_path": str(project / "src/api/users.py"),
                                                           "old_string": "a", "new_string": "b"}})
    denied = hooks.handle("claude-code", edit, state_dir=ws.paths.root, env={})
    assert denied["output"]["hookSpecificOutput"]["permissionDecision"] == "deny"
    wait_until(lambda: receiver.at("/ce"), 15, "the denial told")
    event = json.loads(receiver.at("/ce")[0]["body"])
    assert event["type"] == "io.synapolis.guard.denied" and event["subject"] == "src/api/users.py"
    assert event["data"]["tool"] == "Edit" and event["data"]["blocked"][0]["claimed_by"] == "alice"
    ws = configure(ws, guard={"mode": "warn", "auto_claim": False})
    warned = hooks.handle("claude-code", edit, state_dir=ws.paths.root, env={})
    assert "permissionDecision" not in json.dumps(warned["output"])
    senders_done(ws.paths.root)  # the sender is a detached process: a wrongly handed-over event has arrived once it ends
    assert len(receiver.at("/ce")) == 1
