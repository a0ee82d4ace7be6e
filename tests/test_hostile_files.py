"""Planted files in the state directory (issue 11, family 4): a symbolic link out of it, a FIFO and a
link to /dev/zero in place of every kind of state file, under every verb that reads or writes it.

Each run has a time limit (a FIFO must never hang a verb) and an address-space limit (a reader that
took in /dev/zero would fail fast instead of eating the machine). A verb may refuse with the contract's
exit code and one line; it never hangs, never dies of a signal, never shows a traceback, never
writes through the link, and a reader reports the bad file instead of failing because of it.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import ago, heartbeat_doc, run_limited
from synapolis import actions
from synapolis.timeutil import utcnow

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, symlinks and /dev/zero are POSIX")

MEMORY = 1536 * 1024 * 1024  # RLIMIT_AS: plenty for a verb, far too little to read /dev/zero whole
KINDS = ("link-out", "fifo", "zero")
OUTSIDE = b'{"outside": "must stay as it is"}\n'


@pytest.fixture
def world(ws, tmp_path):
    """alice and bob in a session, a claim, a dead carol with an open incident, notes, a monitor and a
    ledger line: every kind of state file exists once. Returns (ws, session id, outside file)."""
    sid = actions.start(ws, agent_id="alice", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    alice = actions.Who("alice", sid)
    actions.note(ws, alice, "a note", env={})
    actions.claim(ws, alice, "job", env={})
    (ws.paths.heartbeats / "carol.json").write_text(json.dumps(heartbeat_doc("carol", ago(10 ** 6, utcnow()))))
    from synapolis import escalation, monitor, sleep

    monitor.run_monitor(ws)
    escalation.run_escalation(ws, on_alert=lambda incident: None)
    ws.paths.memory_ledger.parent.mkdir(parents=True, exist_ok=True)
    ws.paths.memory_ledger.write_text(json.dumps({"text": "old memory", "norm": "old memory"}) + "\n")
    sleep.tired(ws, actions.Who("bob", sid), memories=["staged by bob"], env={})
    hook = run_limited(ws.root, "hook", "claude-code", input=HOOK_EVENT)
    assert hook.returncode == 0 and len(_hook_states(ws)) == 1, hook.stderr
    outside = tmp_path / "outside.json"
    outside.write_bytes(OUTSIDE)
    return ws, sid, outside


def _hook_states(ws, folder: str = "") -> list:
    """The hook's files: its conversation states, or (folder "conversations") their index entries."""
    where = ws.paths.hook_states / folder
    return sorted(where / name for name in os.listdir(where) if name.endswith(".json"))


def _plant(path, kind: str, outside) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "link-out":
        os.symlink(outside, path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


AS_ALICE = ("--agent-id", "alice")
HOOK_EVENT = json.dumps({"session_id": "conversation-1", "hook_event_name": "UserPromptSubmit", "prompt": "hi"})


def _files(ws, sid):
    """Each kind of state file, with the verbs that read or write it."""
    alice = [*AS_ALICE, "--session-id", sid]
    return {
        "heartbeat": (ws.paths.heartbeat("alice"), [
            ["beat", *alice], ["monitor"], ["watchdog"], ["status"], ["list-agents"], ["claims"],
            ["claim", "job", "--agent-id", "bob", "--session-id", sid], ["note", "n", *alice]]),
        "claim": (ws.paths.claims / "job.json", [
            ["claim", "job", *alice], ["release", "job", *alice], ["claims"], ["claim-check", "job", "--token", "1"],
            ["watchdog"], ["status"]]),
        "identity": (ws.paths.identity, [["beat"], ["status"], ["list-agents"], ["start", *alice]]),
        "session": (ws.paths.session_json(sid), [
            ["start", *AS_ALICE], ["beat", *alice], ["note", "n", *alice], ["list-agents"], ["status"],
            ["watchdog"], ["tired", *alice]]),
        "config": (ws.paths.config, [["beat", *alice], ["status"], ["doctor"], ["init"]]),
        "monitor": (ws.paths.monitor, [["monitor"], ["escalate"], ["watchdog"], ["status"]]),
        "incident": (ws.paths.escalations / "carol.json", [
            ["escalate"], ["escalations"], ["escalations", "--all"], ["status"], ["watchdog"]]),
        "notes": (ws.paths.session_notes(sid), [["note", "n", *alice], ["read-notes"], ["read-notes", "--limit", "1"]]),
        "claims log": (ws.paths.claims_log, [["claim", "job2", *alice], ["release", "job", *alice]]),
        "escalations log": (ws.paths.escalations_log, [["escalations", "--all"], ["escalate"]]),
        "ledger": (ws.paths.memory_ledger, [["tired", *alice]]),
        "lock": (ws.paths.lock(f"notes.{sid}"), [["note", "n", *alice]]),
        "heartbeat lock": (ws.paths.lock("heartbeat.alice"), [["beat", *alice]]),
        "hook state": (_hook_states(ws)[0], [["hook", "claude-code"]]),
        "hook index": (_hook_states(ws, "conversations")[0], [["hook", "claude-code"]]),
        "session store": (ws.paths.session_db(sid), [
            ["beat", *alice], ["note", "n", *alice], ["list-agents"], ["status"], ["watchdog"], ["read-notes"]]),
    }


FILE_KINDS = ["heartbeat", "claim", "identity", "session", "config", "monitor", "incident", "notes", "claims log",
              "escalations log", "ledger", "lock", "heartbeat lock", "hook state", "hook index", "session store"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", FILE_KINDS)
def test_a_planted_file_never_hangs_exhausts_or_is_written_through(world, what, kind):
    ws, sid, outside = world
    path, verbs = _files(ws, sid)[what]
    around = sorted(os.listdir(outside.parent))
    for args in verbs:
        _plant(path, kind, outside)  # again for each verb: a writer may have replaced the link (allowed)
        hook = args[0] == "hook"
        out = run_limited(ws.root, *args, *([] if hook else ["--json"]), input=HOOK_EVENT if hook else None,
                          memory=MEMORY, timeout=30)
        assert out.returncode in (0, 1, 2, 3, 4, 6, 7, 8), (args, out.returncode, out.stderr[-2000:])
        assert "Traceback" not in out.stderr and "MemoryError" not in out.stderr, (args, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) <= 1, (args, out.stderr)
        if hook:  # a hook never breaks the harness: exit 0 and an answer in its shape
            assert out.returncode == 0 and isinstance(json.loads(out.stdout), dict), out.stderr
        elif args[0] == "doctor":  # a check, not a verb: exit 1 is "found problems", and it names this one
            if what == "config":
                config = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "config"][0]
                assert config["status"] == "fail" or kind == "link-out", config
        elif out.returncode:
            assert json.loads(out.stdout.splitlines()[-1]).get("error", {}).get("exit_code") == out.returncode, (
                args, out.stdout[-500:])
        assert outside.read_bytes() == OUTSIDE, (args, "written through the link")
        assert sorted(os.listdir(outside.parent)) == around, (args, "created a file outside")


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_bad_files_read_as_invalid_and_are_reported(world, kind):
    ws, sid, outside = world
    _plant(ws.paths.heartbeat("alice"), kind, outside)
    _plant(ws.paths.claims / "job.json", kind, outside)
    out = run_limited(ws.root, "monitor", "--json", memory=MEMORY, timeout=30)
    assert out.returncode == 0, out.stderr
    alice = [a for a in json.loads(out.stdout)["agents"] if a["agent_id"] == "alice"][0]
    assert alice["effective_status"] == "invalid" and "not a regular file" in json.dumps(alice["errors"])
    out = run_limited(ws.root, "claims", "--json", memory=MEMORY, timeout=30)
    assert out.returncode == 0, out.stderr
    job = [c for c in json.loads(out.stdout)["claims"] if c.get("file") == "job.json"][0]
    assert job["state"] == "invalid" and "not a regular file" in job["error"]
    # bob may take over: the claim of an unreadable file is recovered with a token that never goes back
    out = run_limited(ws.root, "claim", "job", "--agent-id", "bob", "--session-id", sid, "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["claim"]["token"] == 2


def test_appends_refuse_a_symbolic_link_even_to_a_file_that_does_not_exist_yet(world, tmp_path):
    ws, sid, _outside = world
    target = tmp_path / "created-outside.jsonl"
    os.unlink(ws.paths.session_notes(sid))
    os.symlink(target, ws.paths.session_notes(sid))
    out = run_limited(ws.root, "note", "n", "--agent-id", "alice", "--session-id", sid, timeout=30)
    assert out.returncode == 1 and "is a symbolic link" in out.stderr, out.stderr
    assert not target.exists()
    lock = ws.paths.lock("heartbeat.alice")
    os.unlink(lock)
    os.symlink(tmp_path / "lock-outside", lock)
    out = run_limited(ws.root, "beat", "--agent-id", "alice", "--session-id", sid, timeout=30)
    assert out.returncode == 1 and "symbolic link" in out.stderr, out.stderr
    assert not (tmp_path / "lock-outside").exists()
