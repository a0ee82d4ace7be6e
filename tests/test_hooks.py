"""Harness hooks: each harness's documented payloads, identity, honest delivery, redelivery, the size cap,
and the promise that a hook always exits 0 in bounded time (locked store, read-only state, garbage)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from synapolis import actions
from synapolis.harness import hooks, quiet
from conftest import clean_env, configure, synapolis_cmd, wait_until
from synapolis.identity import Who
from synapolis.timeutil import utcnow
from synapolis.workspace import Workspace

CONV = "5f1b2c3d-aaaa-bbbb-cccc-0123456789ab"
BASE = {
    "claude-code": {"session_id": CONV, "transcript_path": "/home/u/.claude/projects/p/t.jsonl",
                    "cwd": "/home/u/p", "permission_mode": "default"},
    "gemini-cli": {"session_id": CONV, "transcript_path": "/home/u/.gemini/tmp/t.json", "cwd": "/home/u/p",
                   "timestamp": "2030-01-01T12:00:00.000Z"},
    "codex": {"session_id": CONV, "transcript_path": None, "cwd": "/home/u/p", "model": "gpt-5-codex",
              "permission_mode": "default"},
}
# event -> its own fields, as each harness documents them
EVENTS = {
    "claude-code": {
        "SessionStart": {"source": "startup", "model": "claude-sonnet-4-6"},
        "UserPromptSubmit": {"prompt": "fix the login bug"},
        "PostToolUse": {"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "toolu_01",
                        "tool_response": {"stdout": "a\nb\n", "stderr": "", "interrupted": False}},
        "Stop": {"stop_hook_active": False},
        "SessionEnd": {"reason": "exit"},
    },
    "gemini-cli": {
        "SessionStart": {"source": "startup"},
        "BeforeAgent": {"prompt": "fix the login bug"},
        "AfterTool": {"tool_name": "run_shell_command", "tool_input": {"command": "ls"},
                      "tool_response": {"llmContent": "a\nb\n", "returnDisplay": "a\nb\n"}},
        "AfterAgent": {"prompt": "fix the login bug", "prompt_response": "done", "stop_hook_active": False},
        "SessionEnd": {"reason": "exit"},
    },
    "codex": {
        "SessionStart": {"source": "startup"},
        "UserPromptSubmit": {"prompt": "fix the login bug", "turn_id": "019d036d-c7fa"},
        "PostToolUse": {"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "call_1",
                        "tool_response": "a\nb\n", "turn_id": "019d036d-c7fa"},
        "Stop": {"stop_hook_active": False, "last_assistant_message": "done", "turn_id": "019d036d-c7fa"},
    },
}
DELIVER = {"claude-code": "PostToolUse", "gemini-cli": "AfterTool", "codex": "PostToolUse"}
PROMPT = {"claude-code": "UserPromptSubmit", "gemini-cli": "BeforeAgent", "codex": "UserPromptSubmit"}
IDLE = {"claude-code": "Stop", "gemini-cli": "AfterAgent", "codex": "Stop"}
# what each harness's output schema allows at the top level and inside hookSpecificOutput
ALLOWED_TOP = {"continue", "stopReason", "suppressOutput", "systemMessage", "decision", "reason", "hookSpecificOutput"}
ALLOWED_SPECIFIC = {"hookEventName", "additionalContext"}


def event(harness: str, name: str, conversation: str = CONV) -> dict:
    return {**BASE[harness], "session_id": conversation, "hook_event_name": name, **EVENTS[harness][name]}


@pytest.fixture
def hws(state_dir):
    """A workspace whose sender may send many signals, with the default redelivery delay."""
    state_dir.mkdir(parents=True)
    (state_dir / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 100000}))
    return Workspace.open(state_dir).ensure()


def run(ws, harness, name, conversation=CONV, now=None):
    result = hooks.handle(harness, json.dumps(event(harness, name, conversation)), state_dir=ws.root, env={},
                          now=now)
    assert result["problems"] == [], result["problems"]
    return result


def context(result) -> str:
    return (result["output"].get("hookSpecificOutput") or {}).get("additionalContext", "")


def deliveries(ws, agent_id):
    session = json.loads(ws.paths.hook_state(agent_id).read_text())["session_id"]
    conn = sqlite3.connect(ws.paths.session_db(session))
    try:
        return conn.execute("SELECT signal_id, delivery_method, offers FROM signal_deliveries WHERE agent_id = ? "
                            "ORDER BY delivered_at", (agent_id,)).fetchall()
    finally:
        conn.close()


def sender(ws, agent_id="bob"):
    actions.start(ws, agent_id=agent_id, env={}, write_identity=False)
    return lambda to, content: actions.signal(ws, Who(agent_id), to, content, env={})["signal"]


# -- identity and shapes --------------------------------------------------------------------------

def test_identity_is_derived_from_the_conversation_as_the_contract_says():
    digest = hashlib.sha256(CONV.encode()).hexdigest()
    assert hooks.agent_id_for("claude-code", CONV, env={}) == f"claude_code_{digest[:8]}_{digest[8:12]}"
    assert hooks.agent_id_for("codex", CONV, env={"SYNAPOLIS_SUBSTRATE": "GPT 5 Codex"}).startswith("gpt_5_codex_")
    # a hostile session id is only ever hashed: it never becomes a path
    assert hooks.agent_id_for("gemini-cli", "../../etc/passwd", env={}).startswith("gemini_cli_")


@pytest.mark.parametrize("harness", sorted(EVENTS))
def test_every_documented_event_keeps_one_identity_and_the_right_status(hws, harness):
    ids, statuses = set(), {}
    for name in EVENTS[harness]:
        result = run(hws, harness, name)
        ids.add(result["agent_id"])
        doc = json.loads(hws.paths.heartbeat(result["agent_id"]).read_text())
        statuses[name] = doc["status"]
        out = result["output"]
        assert set(out) <= ALLOWED_TOP
        if out:
            specific = out["hookSpecificOutput"]
            assert set(specific) <= ALLOWED_SPECIFIC and specific["hookEventName"] == name
        else:
            assert hooks.EVENT_KINDS[harness][name] in ("idle", "end", "deliver")
    assert len(ids) == 1
    (agent_id,) = ids
    assert statuses["SessionStart"] == "active" and statuses[DELIVER[harness]] == "active"
    assert statuses[IDLE[harness]] == "idle"
    if "SessionEnd" in EVENTS[harness]:
        assert statuses["SessionEnd"] == "stopped"
    listed = actions.list_agents(hws, Who(agent_id), env={})["agents"]
    assert [a["harness"] for a in listed if a["id"] == agent_id] == [harness]


def test_session_start_tells_the_agent_who_it_is(hws):
    result = run(hws, "claude-code", "SessionStart")
    text = context(result)
    state = json.loads(hws.paths.hook_state(result["agent_id"]).read_text())
    assert result["agent_id"] in text and state["session_id"] in text
    assert oct(hws.paths.hook_state(result["agent_id"]).stat().st_mode & 0o777) == "0o600"


def test_two_conversations_are_two_agents_in_one_session(hws):
    a = run(hws, "claude-code", "SessionStart", "conv-a")["agent_id"]
    b = run(hws, "gemini-cli", "SessionStart", "conv-b")["agent_id"]
    assert a != b
    sessions = {json.loads(hws.paths.hook_state(x).read_text())["session_id"] for x in (a, b)}
    assert len(sessions) == 1


def test_a_resumed_conversation_takes_its_slot_back_at_once(hws):
    first = run(hws, "claude-code", "SessionStart")
    token = json.loads(hws.paths.hook_state(first["agent_id"]).read_text())["run_token"]
    again = run(hws, "claude-code", "SessionStart")  # source "resume": same id, live slot, same token
    assert again["agent_id"] == first["agent_id"]
    assert json.loads(hws.paths.hook_state(first["agent_id"]).read_text())["run_token"] == token


@pytest.mark.parametrize("damaged", [{"agent_id": "../../x", "session_id": "../y", "run_token": 5},
                                     {"agent_id": 5, "session_id": "s", "run_token": "t"},
                                     {"agent_id": "a", "session_id": "s", "run_token": {"x": 1}},
                                     {"agent_id": "a", "session_id": ["s"], "run_token": " "}])
def test_a_damaged_state_file_is_forgotten_as_an_unparseable_one_is(hws, damaged):
    """A state whose identity breaks the rules failed every later hook call of the conversation (a
    UsageError each time, nothing delivered); now the conversation registers afresh, once."""
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    hws.paths.hook_state(me).write_text(json.dumps(damaged))
    calls = [hooks.handle("claude-code", json.dumps(event("claude-code", PROMPT["claude-code"])), state_dir=hws.root,
                          env={}) for _ in range(2)]
    assert [p for p in calls[0]["problems"] if "registered by someone else" not in p] == []
    assert calls[1]["problems"] == [] and calls[1]["agent_id"] == calls[0]["agent_id"]
    state = json.loads(hws.paths.hook_state(me).read_text())
    assert state["agent_id"] == calls[0]["agent_id"] and isinstance(state["run_token"], str)
    listed = [a["id"] for a in actions.list_agents(hws, Who(None, state["session_id"]), env={})["agents"]]
    assert calls[0]["agent_id"] in listed


def test_a_conversations_index_entry_names_its_state_and_a_planted_one_is_not_followed(hws):
    """harness.quiet's index (hooks/conversations/) saves the hash on later calls; it points at the state
    file, which says whose it is: an entry naming another conversation's state is ignored, and the hook acts
    as its own conversation's agent, as the contract's derived id says."""
    mine = run(hws, "claude-code", "SessionStart", "conv-a")["agent_id"]
    other = run(hws, "claude-code", "SessionStart", "conv-b")["agent_id"]
    entry = hws.files.hook_conversation(quiet.index_name("claude-code", "conv-a", {}))
    assert json.loads(open(entry).read()) == {"key": mine} and oct(os.stat(entry).st_mode & 0o777) == "0o600"
    assert run(hws, "claude-code", "PostToolUse", "conv-a")["agent_id"] == mine
    with open(entry, "w") as f:  # planted: conv-a's hooks pointed at conv-b's state (and run token)
        json.dump({"key": other}, f)
    assert run(hws, "claude-code", "PostToolUse", "conv-a")["agent_id"] == mine
    assert json.loads(open(entry).read()) == {"key": mine}  # rewritten from the hash
    with open(entry, "w") as f:  # not an id at all
        json.dump({"key": "../../identity"}, f)
    assert run(hws, "claude-code", "PostToolUse", "conv-a")["agent_id"] == mine
    assert quiet.index_name("claude-code", "a/../b", {}) is None  # not id characters: no entry, hashed each time


def test_first_event_without_session_start_registers_the_agent(hws):
    send = sender(hws)
    result = run(hws, "codex", "UserPromptSubmit")
    send(result["agent_id"], "late joiner, you are seen")
    assert "late joiner, you are seen" in context(run(hws, "codex", "PostToolUse"))


# -- delivery -----------------------------------------------------------------------------------

@pytest.mark.parametrize("harness", sorted(EVENTS))
def test_a_signal_is_delivered_once_in_the_harness_shape(hws, harness):
    me = run(hws, harness, "SessionStart")["agent_id"]
    signal = sender(hws)(me, "please review src/api/users.py")
    first = run(hws, harness, PROMPT[harness])
    assert first["output"]["hookSpecificOutput"]["hookEventName"] == PROMPT[harness]
    assert "please review src/api/users.py" in context(first) and signal["id"][:12] in context(first)
    assert first["delivered"] == [signal["id"]]
    second = run(hws, harness, DELIVER[harness])
    assert second["delivered"] == [] and "please review" not in context(second)
    assert deliveries(hws, me) == [(signal["id"], "hook", 1)]


def test_unacked_signals_are_offered_again_at_most_three_times(hws):
    wait = hws.config.redeliver_after_s
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    signal = sender(hws)(me, "are you there?")
    start = utcnow()
    # each hook call redeliver_after_s after the one before: the delay itself is what is tested
    offered = [run(hws, "claude-code", "PostToolUse", now=start + timedelta(seconds=i * wait))["delivered"]
               for i in range(5)]
    assert offered == [[signal["id"]]] * 3 + [[], []]
    assert deliveries(hws, me) == [(signal["id"], "hook", 3)]


def test_not_offered_again_before_redeliver_after_s(hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    sender(hws)(me, "once")
    assert len(run(hws, "claude-code", "PostToolUse")["delivered"]) == 1
    assert run(hws, "claude-code", "PostToolUse")["delivered"] == []


def test_an_acked_signal_is_never_offered_again(hws):
    wait = hws.config.redeliver_after_s
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    signal = sender(hws)(me, "handled soon")
    start = utcnow()
    assert run(hws, "claude-code", "PostToolUse", now=start)["delivered"] == [signal["id"]]
    actions.ack_signals(hws, Who(me), [signal["id"][:10]], env={}, now=start)
    for i in range(1, 4):  # each call past redeliver_after_s: it would be offered again if it were unread
        assert run(hws, "claude-code", "PostToolUse", now=start + timedelta(seconds=i * wait))["delivered"] == []


def test_output_stays_under_the_cap_and_never_cuts_a_signal(hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    send = sender(hws)
    # Claude Code counts the parsed context (quotes and newlines once each), in UTF-16 code units
    sent = [send(me, f"signal {i} " + ('"quoted"\n' * 60)) for i in range(25)]
    seen, rounds = [], 0
    while len(seen) < len(sent) and rounds < 10:
        rounds += 1
        result = run(hws, "claude-code", "PostToolUse")
        text = context(result)
        assert len(text.encode("utf-16-le")) // 2 <= 10_000
        for s in sent:
            if s["id"] in result["delivered"]:
                assert s["content"] in text  # whole, never half
        for s in sent:
            if s["id"] not in result["delivered"] and s["id"] not in seen:
                assert s["content"] not in text
        if len(seen) + len(result["delivered"]) < len(sent):
            assert "not shown here" in text and result["withheld"]
        seen += result["delivered"]
    assert sorted(seen) == sorted(s["id"] for s in sent) and rounds > 1


def test_with_run_tokens_required_the_hook_presents_its_own(hws):
    ws = configure(hws, require_run_token=True)
    me = run(ws, "claude-code", "SessionStart")["agent_id"]
    token = json.loads(ws.paths.hook_state(me).read_text())["run_token"]
    actions.start(ws, agent_id="bob", env={}, write_identity=False, run_token="bob-token")
    actions.signal(ws, Who("bob", run_token="bob-token"), me, "tokens everywhere", env={})
    text = context(run(ws, "claude-code", "PostToolUse"))
    assert "tokens everywhere" in text and f"--run-token {token}" in text
    assert json.loads(ws.paths.heartbeat(me).read_text())["status"] == "active"


def test_a_signal_too_big_for_any_answer_is_summarised_not_cut(hws):
    me = run(hws, "gemini-cli", "SessionStart")["agent_id"]
    big = sender(hws)(me, "B" * 30_000)
    result = run(hws, "gemini-cli", "AfterTool")
    text = context(result)
    assert "B" * 100 not in text and big["id"][:12] in text and "read-signals" in text
    assert len(json.dumps(result["output"])) < 10_000
    assert deliveries(hws, me) == []  # only what an answer really carried counts as delivered


def test_events_from_a_subagent_beat_but_carry_no_signals(hws):
    me = run(hws, "codex", "SessionStart")["agent_id"]
    sender(hws)(me, "for the main agent")
    inside = {"agent_id": "019d-child-thread", "agent_type": "explorer"}
    for name in ("PostToolUse", "Stop"):
        result = hooks.handle("codex", json.dumps({**event("codex", name), **inside}), state_dir=hws.root, env={})
        assert result["problems"] == [] and result["output"] == {} and result["agent_id"] == me
    assert json.loads(hws.paths.heartbeat(me).read_text())["status"] == "active"  # a subagent's Stop is not ours
    assert "for the main agent" in context(run(hws, "codex", "PostToolUse"))


def test_text_in_any_script_reaches_the_harness_whatever_the_locale(cli, hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    sender(hws)(me, "prüfe bitte 日本語 — ✓")
    done = cli("hook", "claude-code", input=json.dumps(event("claude-code", "PostToolUse")),
               env={"PYTHONIOENCODING": "ascii", "LC_ALL": "C", "PYTHONUTF8": "0"})
    assert done.returncode == 0, done.stderr
    assert "prüfe bitte 日本語 — ✓" in json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]


# -- never breaking the harness -------------------------------------------------------------------

def _hook(cli, harness, payload, env=None, timeout=30):
    started = time.monotonic()
    done = cli("hook", harness, input=payload, env=env, timeout=timeout)
    return done, time.monotonic() - started


@pytest.mark.parametrize("payload", [
    "", "not json at all", "[1, 2, 3]", '{"hook_event_name": "PostToolUse"}', '{"session_id": 5}',
    '{"session_id": "x"}', "\udcff".encode("utf-8", "surrogateescape").decode("latin-1"), "{" * 5000,
])
def test_garbage_input_exits_0_with_an_empty_answer(cli, payload):
    done, _ = _hook(cli, "claude-code", payload)
    assert done.returncode == 0 and json.loads(done.stdout) == {}
    assert done.stderr.startswith("synapolis hook claude-code:") and "Traceback" not in done.stderr


def test_unknown_harness_and_unknown_event_still_exit_0(cli, state_dir):
    done, _ = _hook(cli, "cursor", json.dumps(event("codex", "Stop")))
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "unknown harness" in done.stderr
    done, _ = _hook(cli, "claude-code", json.dumps({**BASE["claude-code"], "hook_event_name": "PreCompact"}))
    assert done.returncode == 0 and json.loads(done.stdout) == {} and done.stderr == ""


LOCKER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
open(sys.argv[2], "w").close()
time.sleep(60)
"""


def lock_store(spawn, ws, session: str, tmp_path) -> None:
    """Another process takes the session store's write lock and holds it until the test ends (spawn stops it)."""
    ready = tmp_path / "locked"
    spawn([sys.executable, "-c", LOCKER, ws.paths.session_db(session), ready])
    wait_until(ready.exists, 20, "the child to take the lock")


def test_a_locked_store_answers_within_the_bound(cli, hws, tmp_path, spawn):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    session = json.loads(hws.paths.hook_state(me).read_text())["session_id"]
    sender(hws)(me, "news: the hook must open the store for this")  # no quiet path: something new
    lock_store(spawn, hws, session, tmp_path)
    done, took = _hook(cli, "claude-code", json.dumps(event("claude-code", "PostToolUse")))
    assert done.returncode == 0 and json.loads(done.stdout) == {}
    assert "locked" in done.stderr and took < hooks.HOOK_DEADLINE_S + 5


HEARTBEAT_LOCKER = r"""
import sys, time
from pathlib import Path
from synapolis.atomic import locked
with locked(Path(sys.argv[1])):
    open(sys.argv[2], "w").close()
    time.sleep(60)
"""


def test_a_lock_that_never_comes_free_hits_the_deadline_not_the_harness(cli, hws, tmp_path, spawn):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    ready = tmp_path / "held"
    spawn([sys.executable, "-c", HEARTBEAT_LOCKER, hws.paths.lock(f"heartbeat.{me}"), ready])
    wait_until(ready.exists, 20, "the child to take the lock")
    done, took = _hook(cli, "claude-code", json.dumps(event("claude-code", "PostToolUse")),
                       env={"SYNAPOLIS_HOOK_TIMEOUT_S": "1.5"})
    assert done.returncode == 0 and json.loads(done.stdout) == {}
    assert "gave up after 1.5s" in done.stderr and took < 1.5 + 4


def test_stdin_that_never_closes_hits_the_deadline(state_dir, spawn):
    proc = spawn(synapolis_cmd(state_dir, "hook", "codex"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, env=clean_env(SYNAPOLIS_HOOK_TIMEOUT_S="1"))
    proc.stdin.write(b'{"session_id": "s", ')  # and never the rest, nor EOF
    proc.stdin.flush()
    started = time.monotonic()
    rc = proc.wait(timeout=15)
    took = time.monotonic() - started
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    assert rc == 0 and json.loads(out) == {} and b"gave up" in err and took < 10


def _chattr(flag, path) -> bool:
    try:
        return subprocess.run(["chattr", flag, str(path)], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_read_only_state_directory_exits_0(cli, hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    targets = [hws.paths.heartbeats, hws.root, hws.paths.hook_states]
    frozen = []
    try:
        for target in targets:
            if not _chattr("+i", target):
                pytest.skip("cannot make a directory read-only here (chattr +i needs root and ext4)")
            frozen.append(target)
        if os.access(hws.paths.heartbeats, os.W_OK) and not _writes_fail(hws.paths.heartbeats):
            pytest.skip("the read-only flag does not hold for this user")
        done, took = _hook(cli, "claude-code", json.dumps(event("claude-code", "PostToolUse")))
        assert done.returncode == 0 and json.loads(done.stdout) == {}
        assert done.stderr.startswith("synapolis hook claude-code:") and "Traceback" not in done.stderr
        assert json.loads(hws.paths.heartbeat(me).read_text())["seq"] >= 1  # the old file is intact
    finally:
        for target in frozen:
            _chattr("-i", target)


def _writes_fail(folder) -> bool:
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return True
    (folder / ".probe").unlink()
    return False


def test_state_dir_that_is_a_file_exits_0(tmp_path):
    blocker = tmp_path / "state-file"
    blocker.write_text("not a directory")
    env = clean_env(SYNAPOLIS_STATE_DIR=str(blocker))
    done = subprocess.run([sys.executable, "-m", "synapolis", "hook", "gemini-cli"], capture_output=True, text=True,
                          input=json.dumps(event("gemini-cli", "BeforeAgent")), env=env, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "not a directory" in done.stderr


def test_a_real_process_answers_in_the_harness_shape(cli, hws):
    done, _ = _hook(cli, "codex", json.dumps(event("codex", "SessionStart")))
    assert done.returncode == 0 and done.stderr == ""
    out = json.loads(done.stdout)
    assert out["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    me = hooks.agent_id_for("codex", CONV, env={})
    sender(hws)(me, "from another process")
    done, _ = _hook(cli, "codex", json.dumps(event("codex", "PostToolUse")))
    assert "from another process" in json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    done, _ = _hook(cli, "codex", json.dumps(event("codex", "Stop")))
    assert done.returncode == 0 and json.loads(done.stdout) == {}


# -- each harness's own budget, counted its own way (issue 12 item 4, issue 11 item 7) --------------

def printed_cost(harness: str, result) -> int:
    """What the harness measures: Claude Code the context in UTF-16 code units, Codex its UTF-8 bytes,
    Gemini CLI its UTF-16 code units once it has escaped < and >."""
    text = context(result)
    if harness == "claude-code":
        return len(text.encode("utf-16-le")) // 2
    if harness == "codex":
        return len(text.encode("utf-8"))
    return len(text.replace("<", "&lt;").replace(">", "&gt;").encode("utf-16-le")) // 2


# content that looks short to len() but is long the way one harness counts it
COSTLY = {
    "codex": ("数" * 3400, "数" * 3000),                  # 3 UTF-8 bytes each: 10,200 bytes, then 9,000
    "claude-code": ("\U0001F600" * 5200, "\U0001F600" * 4400),  # 2 UTF-16 units each: 10,400, then 8,800
    "gemini-cli": ("<>" * 4000, "<>" * 3500),             # 8 units a pair once escaped: 32,000, then 28,000
}


@pytest.mark.parametrize("harness", sorted(COSTLY))
def test_a_signal_over_the_harness_budget_is_not_marked_and_one_under_it_is(hws, harness):
    me = run(hws, harness, "SessionStart")["agent_id"]
    too_long, fitting = COSTLY[harness]
    send = sender(hws)
    big = send(me, too_long)
    result = run(hws, harness, DELIVER[harness])
    assert result["delivered"] == [] and big["id"] in result["withheld"]
    assert too_long[:50] not in context(result) and big["id"][:12] in context(result)
    assert printed_cost(harness, result) <= hooks.OUTPUT_BUDGETS[harness]
    assert deliveries(hws, me) == []  # shown nowhere, so delivered nowhere
    # once the big one is read and acked it no longer blocks; one that fits is shown whole and marked
    actions.ack_signals(hws, Who(me, run_token=json.loads(hws.paths.hook_state(me).read_text())["run_token"]),
                        [big["id"]], env={})
    small = send(me, fitting)
    result = run(hws, harness, DELIVER[harness])
    assert result["delivered"] == [small["id"]] and fitting in context(result)
    assert printed_cost(harness, result) <= hooks.OUTPUT_BUDGETS[harness]
    assert deliveries(hws, me) == [(small["id"], "hook", 1)]


@pytest.mark.parametrize("harness", sorted(COSTLY))
def test_many_mixed_signals_fill_the_budget_exactly_as_shown(hws, harness):
    me = run(hws, harness, "SessionStart")["agent_id"]
    send = sender(hws)
    pieces = ["ascii text ", "数据 ", "\U0001F680 ", '"quoted"\n', "<tag> ", "\x01\x02 "]
    sent = [send(me, f"#{i} " + pieces[i % len(pieces)] * (20 + 15 * i)) for i in range(30)]
    seen = []
    for _ in range(30):
        result = run(hws, harness, DELIVER[harness])
        assert printed_cost(harness, result) <= hooks.OUTPUT_BUDGETS[harness]
        text = context(result)
        for s in sent:
            assert (s["content"] in text) == (s["id"] in result["delivered"])  # shown whole ⇔ marked
        marked = {row[0] for row in deliveries(hws, me)}
        assert marked == set(seen) | set(result["delivered"])
        seen += result["delivered"]
        if len(seen) == len(sent):
            break
    assert sorted(seen) == sorted(s["id"] for s in sent)


def test_the_budget_keeps_room_for_the_largest_summary():
    budget = hooks.ContextBudget("codex", hooks.OUTPUT_BUDGETS["codex"], ["preamble"], "ack hint", "read hint")
    signal = {"id": "a" * 64, "sender": "bob", "recipient": "me", "type": "inform", "timestamp": "t", "content": ""}
    worst = hooks.render_context(["preamble"], [signal], [{"id": "f" * 64, "content": "x" * 10 ** 6}] * 5000,
                                 "ack hint", "read hint")
    assert budget.fixed + budget.block_cost(signal) >= budget.cost(worst)


# -- identity at the edges (issue 11 items 1 and 7) --------------------------------------------------

def test_a_model_name_over_128_characters_still_registers_the_agent(hws):
    model = "m" * 300 + "\udcff"
    raw = json.dumps({**event("claude-code", "SessionStart"), "model": model})
    result = hooks.handle("claude-code", raw, state_dir=hws.root, env={})
    assert result["problems"] == [] and result["agent_id"] == hooks.agent_id_for("claude-code", CONV, env={})
    listed = actions.list_agents(hws, Who(result["agent_id"]), env={})["agents"]
    (me,) = [a for a in listed if a["id"] == result["agent_id"]]
    assert len(me["substrate"]) == 128 and me["substrate"] == "m" * 128


def test_a_hook_never_adopts_an_id_someone_else_registered_first(hws):
    derived = hooks.agent_id_for("claude-code", CONV, env={})
    squatter = actions.start(hws, agent_id=derived, env={}, write_identity=False)
    sender(hws)(derived, "for the squatter only")
    result = run_allowing(hws, "claude-code", "SessionStart")
    me = result["agent_id"]
    assert me != derived and me.startswith("claude_code_" + hashlib.sha256(CONV.encode()).hexdigest()[:8])
    assert any(derived in p and "someone else" in p for p in result["problems"])
    # it stays that agent on every later event, and never sees (nor marks) the squatter's signals
    later = run(hws, "claude-code", "PostToolUse")
    assert later["agent_id"] == me and "for the squatter only" not in context(later)
    # the squatter's slot is untouched: its token still works, and its signal still waits for it
    theirs = Who(derived, session_id=squatter["session_id"], run_token=squatter["run_token"])
    pending = actions.signals_pending(hws, theirs, env={})["pending_signals"]
    assert [s["content"] for s in pending] == ["for the squatter only"]


def test_a_stale_squatter_is_not_taken_over_either(hws):
    derived = hooks.agent_id_for("codex", CONV, env={})
    past = datetime.now(timezone.utc) - timedelta(hours=3)
    actions.start(hws, agent_id=derived, env={}, write_identity=False, now=past)
    result = run_allowing(hws, "codex", "SessionStart")
    assert result["agent_id"] != derived


def test_a_slot_taken_over_while_stale_is_not_acted_for(hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    session = json.loads(hws.paths.hook_state(me).read_text())["session_id"]
    later = datetime.now(timezone.utc) + timedelta(hours=3)  # the hook's slot looks stale from then
    taker = actions.start(hws, agent_id=me, session_id=session, env={}, write_identity=False, now=later)
    assert taker["registration"] == "taken_over"
    result = run_allowing(hws, "claude-code", "PostToolUse")
    assert result["agent_id"] != me  # a fresh id of its own, not the taker's slot
    beat = json.loads(hws.paths.heartbeat(result["agent_id"]).read_text())
    assert beat["status"] == "active"


def test_hooks_of_one_conversation_that_fire_together_register_once(hws, tmp_path):
    script = ("import json, sys\nfrom synapolis.harness import hooks\n"
              "r = hooks.handle('claude-code', sys.stdin.read(), state_dir=sys.argv[1], env={})\n"
              "print(json.dumps(r['agent_id']))\n")
    raw = json.dumps(event("claude-code", "PostToolUse"))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(hws.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    for p in procs:
        p.stdin.write(raw)
        p.stdin.close()
    ids = {json.loads(p.stdout.read()) for p in procs}
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert ids == {hooks.agent_id_for("claude-code", CONV, env={})}


def test_session_end_of_a_conversation_never_registered_touches_nobody(hws):
    derived = hooks.agent_id_for("claude-code", CONV, env={})
    actions.start(hws, agent_id=derived, env={}, write_identity=False)
    run(hws, "claude-code", "SessionEnd")
    assert json.loads(hws.paths.heartbeat(derived).read_text())["status"] == "active"


def run_allowing(ws, harness, name, conversation=CONV):
    """Like run(), but problems on stderr are allowed (they are part of what is tested)."""
    return hooks.handle(harness, json.dumps(event(harness, name, conversation)), state_dir=ws.root, env={})


# -- the quiet path (harness.quiet): nothing new since the last drain, so no store is opened ---------------

def _hook_state(ws, agent_id) -> dict:
    return json.loads(ws.paths.hook_state(agent_id).read_text())


def _registry_beat(ws, agent_id) -> str:
    conn = sqlite3.connect(ws.paths.session_db(_hook_state(ws, agent_id)["session_id"]))
    try:
        return conn.execute("SELECT last_heartbeat FROM agents WHERE id = ?", (agent_id,)).fetchone()[0]
    finally:
        conn.close()


def _traces(ws, agent_id) -> tuple:
    """What a hook call leaves: the registry row's stamp and the heartbeat file's seq."""
    return _registry_beat(ws, agent_id), json.loads(ws.paths.heartbeat(agent_id).read_text())["seq"]


def _was_quiet(before: tuple, after: tuple) -> bool:
    """The quiet path refreshes the heartbeat file but never the registry row; the full path refreshes both."""
    return after[0] == before[0] and after[1] == before[1] + 1


def _me(ws, agent_id) -> Who:
    state = _hook_state(ws, agent_id)
    return Who(agent_id, state["session_id"], state["run_token"])


def test_a_hook_with_nothing_new_does_not_open_the_store(cli, hws, tmp_path, spawn):
    """SessionStart drains an empty inbox and remembers it; with the store locked by another process, the
    next tool call still answers at once, refreshes the heartbeat and says nothing about a lock."""
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    assert isinstance(_hook_state(hws, me)["quiet"]["mark"], str)
    before = json.loads(hws.paths.heartbeat(me).read_text())
    lock_store(spawn, hws, _hook_state(hws, me)["session_id"], tmp_path)
    done, _took = _hook(cli, "claude-code", json.dumps(event("claude-code", "PostToolUse")))
    assert done.returncode == 0 and json.loads(done.stdout) == {} and done.stderr == ""
    after = json.loads(hws.paths.heartbeat(me).read_text())
    assert after["seq"] == before["seq"] + 1 and after["status"] == "active" and after["beat_at"] >= before["beat_at"]
    assert (after["harness"], after["session_id"]) == ("claude-code", before["session_id"])


def test_a_signal_sent_after_the_memory_is_shown_once_then_quiet_again_after_its_ack(hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    before = _traces(hws, me)
    run(hws, "claude-code", "PostToolUse")
    assert _was_quiet(before, _traces(hws, me))
    sent = sender(hws)(me, "a fresh signal")
    before = _traces(hws, me)
    shown = run(hws, "claude-code", "PostToolUse")
    assert shown["delivered"] == [sent["id"]] and sent["id"][:12] in context(shown)
    assert not _was_quiet(before, _traces(hws, me))
    assert "quiet" not in _hook_state(hws, me)  # shown but unacked: every call looks at the store (redelivery)
    before = _traces(hws, me)
    again = run(hws, "claude-code", "PostToolUse")
    assert again["delivered"] == [] and context(again) == "" and not _was_quiet(before, _traces(hws, me))
    assert deliveries(hws, me) == [(sent["id"], "hook", 1)]
    actions.ack_signals(hws, _me(hws, me), [sent["id"]], env={}, piggyback=False)
    run(hws, "claude-code", "PostToolUse")  # the full path finds the inbox empty and remembers it
    assert "quiet" in _hook_state(hws, me)
    before = _traces(hws, me)
    run(hws, "claude-code", "PostToolUse")
    assert _was_quiet(before, _traces(hws, me))


def test_the_memory_lasts_at_most_the_window(hws):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    state = _hook_state(hws, me)
    state["quiet"]["at"] -= quiet.QUIET_FOR_S + 1  # remembered longer ago than the window
    hws.paths.hook_state(me).write_text(json.dumps(state))
    before = _traces(hws, me)
    run(hws, "claude-code", "PostToolUse")
    assert not _was_quiet(before, _traces(hws, me))  # the registry row is refreshed at least that often
    assert _hook_state(hws, me)["quiet"]["at"] > state["quiet"]["at"] + quiet.QUIET_FOR_S


@pytest.mark.parametrize("spoil", ["garbage", "missing", "idle", "ended", "postgres"])
def test_anything_unusual_takes_the_full_path(hws, spoil):
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    session = _hook_state(hws, me)["session_id"]
    folder = hws.paths.session_db(session).parent
    env = {}
    if spoil == "garbage":
        (folder / "changes").write_text("0123456789abcdef:not a number\n")
    elif spoil == "missing":
        (folder / "changes").unlink()
    elif spoil == "idle":
        run(hws, "claude-code", "Stop")  # the registry says idle: the next tool call must say active there
        assert "quiet" not in _hook_state(hws, me)
    elif spoil == "ended":
        document = json.loads(hws.paths.session_json(session).read_text())
        hws.paths.session_json(session).write_text(json.dumps({**document, "status": "ended"}))
    else:
        env = {"SYNAPOLIS_STORE_URL": "postgresql://127.0.0.1:1/nowhere"}  # another store keeps no counter
        assert not quiet.still_quiet(hws, _hook_state(hws, me), env, time.time())
        return
    before = _traces(hws, me)
    run_allowing(hws, "claude-code", "PostToolUse")
    assert not _was_quiet(before, _traces(hws, me))


def test_the_counter_moves_before_the_send_commits(hws):
    """A hook that reads the counter while a send is between its insert and its commit sees it changed, and
    its full path then waits for that commit on the write lock: the signal is shown, never skipped."""
    from synapolis import signals as sig
    from synapolis.store import open_session
    from synapolis.timeutil import utcnow

    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    actions.start(hws, agent_id="bob", session_id=_hook_state(hws, me)["session_id"], env={}, write_identity=False)
    assert not quiet.still_quiet(hws, _hook_state(hws, me), {}, time.time())  # bob's registration moved it
    run(hws, "claude-code", "PostToolUse")
    assert quiet.still_quiet(hws, _hook_state(hws, me), {}, time.time())
    store = open_session(hws, _hook_state(hws, me)["session_id"])
    try:
        with store.write() as tx:
            sig.send(tx, caller="bob", recipient=me, content="in flight", now=utcnow(), config=hws.config)
            assert not quiet.still_quiet(hws, _hook_state(hws, me), {}, time.time())
    finally:
        store.close()
    assert "in flight" in context(run(hws, "claude-code", "PostToolUse"))


def test_a_rolled_back_send_leaves_no_false_quiet(hws):
    """A send rolled back after its bump leaves the counter moved: one more full path, nothing else."""
    from synapolis import signals as sig
    from synapolis.store import open_session
    from synapolis.timeutil import utcnow

    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    actions.start(hws, agent_id="bob", session_id=_hook_state(hws, me)["session_id"], env={}, write_identity=False)
    store = open_session(hws, _hook_state(hws, me)["session_id"])
    try:
        with pytest.raises(KeyboardInterrupt):
            with store.write() as tx:
                sig.send(tx, caller="bob", recipient=me, content="never", now=utcnow(), config=hws.config)
                raise KeyboardInterrupt
    finally:
        store.close()
    before = _traces(hws, me)
    assert context(run(hws, "claude-code", "PostToolUse")) == ""
    assert not _was_quiet(before, _traces(hws, me)) and "quiet" in _hook_state(hws, me)
    sent = sender(hws, "carol")(me, "after the rollback")  # may reuse the rolled-back sequence number
    assert sent["id"][:12] in context(run(hws, "claude-code", "PostToolUse"))


RACER = r"""
import random, sys, time
from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
me, to, count, session = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
for i in range(count):
    actions.signal(ws, Who(me, session), to, f"{me} #{i}", env={})
    time.sleep(random.uniform(0.05, 0.6))  # pauses: hooks find the inbox empty and go quiet in between
"""


def test_senders_racing_hooks_every_signal_shown_exactly_once(cli, hws, spawn):
    """Real processes: two senders commit signals while the harness's hook (the console script) runs again
    and again, the agent acknowledging what it was shown. Every signal is shown once, none twice, none
    lost, exactly the shown ones are marked delivered, and the quiet path ran in between."""
    me = run(hws, "claude-code", "SessionStart")["agent_id"]
    session = _hook_state(hws, me)["session_id"]
    for name in ("bob", "carol"):
        actions.start(hws, agent_id=name, session_id=session, env={}, write_identity=False)
    each = 15
    racers = [spawn([sys.executable, "-c", RACER, hws.root, name, me, each, session]) for name in ("bob", "carol")]
    shown: list[str] = []
    quiet_runs = idle_after = 0
    deadline = time.monotonic() + 300
    while idle_after < 3 and time.monotonic() < deadline:
        racing = any(r.poll() is None for r in racers)
        before = _traces(hws, me)
        done = cli("hook", "claude-code", input=json.dumps(event("claude-code", "PostToolUse")))
        assert done.returncode == 0 and done.stderr == "", done.stderr
        text = (json.loads(done.stdout).get("hookSpecificOutput") or {}).get("additionalContext", "")
        ids = [line.split()[1] for line in text.splitlines() if line.startswith("[signal ")]
        shown += ids
        quiet_runs += _was_quiet(before, _traces(hws, me))
        if ids:
            actions.ack_signals(hws, _me(hws, me), ids, env={}, piggyback=False)
        idle_after = 0 if (racing or ids) else idle_after + 1
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    conn = sqlite3.connect(hws.paths.session_db(session))
    try:
        sent = [r[0] for r in conn.execute("SELECT id FROM signals WHERE recipient = ?", (me,))]
        marked = [r[0] for r in conn.execute("SELECT signal_id FROM signal_deliveries WHERE agent_id = ?", (me,))]
    finally:
        conn.close()
    assert len(sent) == 2 * each
    assert sorted(shown) == sorted(s[:12] for s in sent), (len(shown), len(set(shown)), quiet_runs)  # all, once
    assert sorted(marked) == sorted(sent)  # marked delivered: exactly what was shown
    assert quiet_runs >= 1, quiet_runs  # and some of them while the senders were still sending, usually
