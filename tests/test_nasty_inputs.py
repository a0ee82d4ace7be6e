"""Nasty inputs across the CLI and the library: each case once crashed (exit 1 "unexpected ..."), hung or
corrupted state; now it is a one-line error with the contract's exit code and nothing stored is harmed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from synapolis import actions, atomic, board, config, heartbeat
from synapolis.harness import hooks
from synapolis.errors import UsageError
from synapolis.identity import Who
from synapolis.schemas import validation_errors

from conftest import clean_env, refused, synapolis_cmd, validate_heartbeat_cmd

DEEP = "[" * 100_000  # json nests past the interpreter's stack: RecursionError, not JSONDecodeError


def raw_cli(state_dir, *args, input=None, stdin=None, timeout=60):
    """The CLI with arguments that may be bytes (not UTF-8), as a shell would pass them."""
    cmd = [sys.executable.encode(), b"-m", b"synapolis", b"--state-dir", os.fsencode(str(state_dir)),
           *[a if isinstance(a, bytes) else a.encode() for a in args]]
    return subprocess.run(cmd, input=input, stdin=stdin, capture_output=True, timeout=timeout, env=clean_env())


@pytest.fixture
def pair(ws):
    """alice and bob started in one session (in-process: fast); (session id, options acting as alice)."""
    session = actions.start(ws, agent_id="alice", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=session, env={})
    return session, ["--agent-id", "alice", "--session-id", session]


# -- the heartbeat schema and its mirror: "$" must not accept a trailing newline ---------------------

BASE = {"schema_version": 1, "agent_id": "a", "harness": "h", "status": "active", "beat_at": "2030-01-01T00:00:00Z",
        "seq": 1}


@pytest.mark.parametrize("key, value", [("agent_id", "a\n"), ("agent_id", "a.b\n"), ("session_id", "s\n"),
                                        ("beat_at", "2030-01-01T00:00:00Z\n"),
                                        ("started_at", "2030-01-01T00:00:00.5Z\n")])
def test_a_trailing_newline_breaks_the_heartbeat_schema_and_its_mirror(key, value):
    doc = {**BASE, key: value}
    assert validation_errors("heartbeat", doc) != []
    assert heartbeat.quick_check(doc) is False
    assert heartbeat.quick_check({**BASE, key: value[:-1]}) is True


def test_a_heartbeat_file_with_a_trailing_newline_in_beat_at_is_invalid(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({**BASE, "beat_at": "2030-01-01T00:00:00Z\n"}))
    read = heartbeat.read_heartbeat(path)
    assert not read.valid and read.errors[0]["pointer"] == "/beat_at"


@pytest.mark.parametrize("schema, doc_key, good", [
    ("claim", "item", "src/a.py"), ("claim", "claimed_by", "alice"), ("claim", "claimed_at", "2030-01-01T00:00:00Z"),
    ("escalation", "id", "0123456789abcdef"), ("escalation", "key", "heartbeat:alice"),
    ("ledger", "id", "a" * 64), ("ledger", "session_id", "s1")])
def test_every_anchored_pattern_in_standards_refuses_a_trailing_newline(schema, doc_key, good):
    def errors_at(value):
        return [e for e in validation_errors(schema, {doc_key: value}) if e["pointer"] == f"/{doc_key}"]

    assert errors_at(good) == []
    assert errors_at(good + "\n") != []


def test_no_pattern_in_standards_ends_in_a_bare_dollar():
    from synapolis.schemas import SCHEMA_FILES, standards_dir

    def patterns(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern":
                    yield value
                else:
                    yield from patterns(value)
        elif isinstance(node, list):
            for item in node:
                yield from patterns(item)

    for name in SCHEMA_FILES.values():
        for pattern in patterns(json.loads((standards_dir() / name).read_text())):
            # `(^|/)\.\.(/|$)` sits under "not": a lenient "$" there only refuses more
            assert not pattern.endswith("$") or not pattern.startswith("^"), (name, pattern)


# -- numbers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ttl", ["inf", "1e400", "-inf", "nan", "-1", "0", "1e308", "86401"])
def test_beat_refuses_a_ttl_that_is_not_a_finite_positive_number(cli, state_dir, ttl):
    refused(cli("beat", "--agent-id", "a", "--ttl", ttl))
    assert not (state_dir / "heartbeats" / "a.json").exists()


def test_an_infinite_ttl_is_never_written_nor_carried_over(ws, cli):
    with pytest.raises(UsageError):
        heartbeat.write_heartbeat(ws.paths, "a", ttl_s=float("inf"))
    # Python's reader accepts `Infinity`; a beat must not carry it into the next document
    path = ws.paths.heartbeat("a")
    path.write_text(json.dumps({**BASE, "ttl_s": float("inf")}))
    assert cli("beat", "--agent-id", "a").returncode == 0
    assert "Infinity" not in path.read_text()
    assert heartbeat.read_heartbeat(path).valid
    assert cli("beat", "--agent-id", "a", "--ttl", "86400").returncode == 0  # a day is the longest promise
    assert heartbeat.read_heartbeat(path).valid


def test_a_limit_beyond_sqlite_integers_means_no_limit(cli, pair):
    _session, alice = pair
    assert cli("signal", "alice", "hi", "--agent-id", "bob").returncode == 0
    out = cli("read-signals", *alice, "--limit", str(10 ** 23), "--json")
    assert out.returncode == 0, out.stderr
    assert [s["content"] for s in json.loads(out.stdout)["signals"]] == ["hi"]
    out = cli("read-signals", *alice, "--all", "--limit", str(2 ** 63 - 1), "--json")
    assert out.returncode == 0, out.stderr


def test_a_huge_status_width_is_capped(cli, pair):
    out = cli("status", "--width", str(10 ** 23))
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 1000


@pytest.mark.parametrize("value", ["Infinity", "1e300", "1e12", "-1", "NaN"])
def test_config_durations_must_be_finite_and_on_the_calendar(state_dir, cli, value):
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text(f'{{"stale_after_s": {value}}}')
    msg = refused(cli("tired", "--agent-id", "a"))
    assert "stale_after_s" in msg
    # the schema in standards/ agrees with the loader
    assert config.check_config({"stale_after_s": float(value)}) != []
    assert validation_errors("config", {"stale_after_s": float(value)}) != [] or value == "NaN"  # (not JSON)
    assert config.check_config({"stale_after_s": config.MAX_DURATION_S}) == []
    assert validation_errors("config", {"stale_after_s": config.MAX_DURATION_S}) == []


# -- text that is not UTF-8 ----------------------------------------------------------------------------

def test_arguments_that_are_not_utf8_are_usage_errors(state_dir, cli, pair):
    _session, alice = pair
    for args in (["signal", "bob", b"\xff\xfe"], ["note", b"x\xff"], ["whiteboard-write", b"k\xff", "v"],
                 ["whiteboard-write", "k", b"v\xff"], ["beat", "--task", b"t\xff"], ["beat", "--note", b"n\xff"]):
        out = raw_cli(state_dir, *args, *alice, "--json")
        refused(out)
        assert json.loads(out.stdout)["error"]["type"] == "UsageError"
    beat = heartbeat.read_heartbeat(state_dir / "heartbeats" / "alice.json")
    assert beat.valid and "task" not in beat.doc and "note" not in beat.doc
    assert json.loads(cli("read-notes", "--json").stdout)["notes"] == []
    assert json.loads(cli("whiteboard-read", "--json").stdout)["entries"] == []


def test_start_refuses_text_that_is_not_utf8_before_registering(state_dir, cli, pair):
    for args in (["--agent-id", "c", "--harness", b"h\xff"], ["--agent-id", "c", "--substrate", b"s\xff"],
                 ["--conversation-id", b"c\xff"], ["--agent-id", "c", "--run-token", b"t\xff"]):
        refused(raw_cli(state_dir, "start", *args))
    agents = json.loads(cli("list-agents", "--json").stdout)["agents"]
    assert sorted(a["id"] for a in agents) == ["alice", "bob"]


def test_release_reason_and_run_token_that_are_not_utf8(state_dir, cli, pair):
    _session, alice = pair
    assert cli("claim", "item", *alice).returncode == 0
    refused(raw_cli(state_dir, "release", "item", "--force", "--reason", b"r\xff", "--agent-id", "bob"))
    # a run token that is not UTF-8 is simply the wrong token
    refused(raw_cli(state_dir, "beat", *alice, "--run-token", b"t\xff"), 7, "ForbiddenError")
    assert json.loads(cli("claims", "--json").stdout)["claims"][0]["state"] == "held"


def test_stdin_bytes_that_are_not_utf8_store_nothing(state_dir, cli, pair):
    session, alice = pair
    for verb in (["signal", "bob", "-"], ["note", "-"], ["whiteboard-write", "k", "-"]):
        msg = refused(raw_cli(state_dir, *verb, *alice, input=b"ok \xff\xfe bytes"))
        assert "not UTF-8" in msg
    assert json.loads(cli("read-signals", "--agent-id", "bob", "--all", "--json").stdout)["signals"] == []
    assert json.loads(cli("read-notes", "--json").stdout)["notes"] == []
    assert json.loads(cli("whiteboard-read", "--json").stdout)["entries"] == []
    # valid UTF-8 on stdin still works, its final newline dropped
    assert raw_cli(state_dir, "note", "-", *alice, input="héllo\n".encode()).returncode == 0
    assert json.loads(cli("read-notes", "--json").stdout)["notes"][0]["text"] == "héllo"


def test_stdin_content_is_bounded_by_max_content_bytes(state_dir, cli, pair):
    _session, alice = pair
    (state_dir / "synapolis.json").write_text(json.dumps({"max_content_bytes": 10}))
    assert raw_cli(state_dir, "note", "-", *alice, input=b"0123456789\n").returncode == 0  # exactly 10 + newline
    refused(raw_cli(state_dir, "note", "-", *alice, input=b"0123456789X"))
    refused(raw_cli(state_dir, "note", "-", *alice, input=b"0123456789\n\n"))
    # an endless pipe: read up to the bound, never to the end
    with open(os.devnull if sys.platform == "win32" else "/dev/zero", "rb") as endless:
        msg = refused(raw_cli(state_dir, "signal", "bob", "-", *alice, stdin=endless, timeout=30))
    assert "max_content_bytes=10" in msg


@pytest.mark.skipif(sys.platform == "win32", reason="closes a standard stream of the child")
def test_a_closed_stdin_or_stdout_is_no_crash(state_dir, pair):
    session, alice = pair

    def run_closed(fd, *args):
        cmd = synapolis_cmd(state_dir, *args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env(),
                              preexec_fn=lambda: os.close(fd))

    assert "note is empty" in refused(run_closed(0, "note", "-", *alice))
    out = run_closed(0, "tired", "--memories", "-", *alice, "--json")  # no stdin: zero memories
    assert out.returncode == 0 and "Traceback" not in out.stderr and "unexpected" not in out.stderr, out.stderr
    for args in (["status"], ["doctor"], ["beat", *alice]):
        out = run_closed(1, *args)
        assert out.returncode in (0, 1) and "unexpected" not in out.stderr, (args, out.stderr)


def test_the_library_refuses_lone_surrogates_before_writing(ws, start_agent):
    session = start_agent("alice")["session_id"]
    who = Who("alice", session)
    for call in (lambda: actions.note(ws, who, "x\udcff", env={}),
                 lambda: actions.signal(ws, who, "*", "x\udcff", env={}),
                 lambda: actions.whiteboard_write(ws, who, "k\udcff", "v", env={}),
                 lambda: actions.beat(ws, who, task="t\udcff", env={}),
                 lambda: actions.start(ws, agent_id="bob", substrate="\udcff", env={})):
        with pytest.raises(UsageError, match="not valid UTF-8"):
            call()
    assert board.read_notes(ws, session) == []


# -- the state directory and its files in odd shapes ----------------------------------------------------

def test_an_explicit_empty_state_dir_is_a_usage_error(tmp_path):
    for cmd in ([sys.executable, "-m", "synapolis", "--state-dir", "", "init"],
                validate_heartbeat_cmd("")):
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=clean_env())
        assert "must not be empty" in refused(out)
    assert list(tmp_path.iterdir()) == []  # no ./state was made behind the user's back


def test_a_directory_where_the_heartbeat_belongs_is_named_in_the_error(ws, cli, pair):
    _session, alice = pair
    path = ws.paths.heartbeat("alice")
    path.unlink()
    path.mkdir()
    err = refused(cli("beat", *alice), 1, "InternalError")
    assert f"Is a directory ({path})" in err  # the file meant, not the writer's temporary file
    assert [p.name for p in ws.paths.heartbeats.iterdir() if p.name.startswith(".tmp")] == []
    ws.paths.monitor.mkdir()  # and where a file is read, not written
    assert f"Is a directory ({ws.paths.monitor})" in refused(cli("escalate"), 1, "InternalError")


def test_a_malformed_session_in_identity_json(ws, cli, pair):
    document = json.loads(ws.paths.identity.read_text())
    ws.paths.identity.write_text(json.dumps({**document, "session_id": "../../x"}))
    assert "identity.json session_id" in refused(cli("beat"))  # it names the broken file
    out = cli("list-agents", "--json")  # a read-only verb acts as nobody instead
    assert out.returncode == 0 and len(json.loads(out.stdout)["agents"]) == 2
    assert cli("beat", "--agent-id", "alice").returncode == 0  # naming itself, identity.json is a mere hint


def test_a_file_where_a_state_folder_belongs_is_named(ws, cli):
    ws.paths.claims.rmdir()
    ws.paths.claims.write_text("x")
    assert str(ws.paths.claims) in refused(cli("beat", "--agent-id", "a"))


def test_hand_edited_notes_and_incidents_with_missing_fields_are_skipped(ws, cli, pair):
    session, alice = pair
    with open(ws.paths.session_notes(session), "a") as handle:
        handle.write('{"seq": 1}\n{"seq": 2, "at": 5, "agent_id": "x", "text": "t"}\n')
    assert cli("note", "hello", *alice).returncode == 0
    out = cli("read-notes")
    assert out.returncode == 0, out.stderr
    assert [n["text"] for n in json.loads(cli("read-notes", "--json").stdout)["notes"]] == ["hello"]
    (ws.paths.escalations / "bob.json").write_text('{"id": "abcdef0123456789", "status": "open"}')
    (ws.paths.escalations / "carol.json").write_text(json.dumps({
        "id": "0123456789abcdef", "key": "heartbeat:carol", "agent_id": "carol", "level": "high",
        "condition": "stale", "status": "open", "opened_at": "2030-01-01T00:00:00Z", "notifications": []}))
    ws.paths.escalations_log.write_text('{"incident": {"id": "feedfeedfeedfeed"}}\n')
    for args in (["escalations"], ["escalations", "--all"], ["escalate"], ["status"], ["watchdog", "--json"]):
        out = cli(*args)
        assert out.returncode == 0 and "unexpected" not in out.stderr, (args, out.stderr)
    assert json.loads(cli("escalations", "--all", "--json").stdout)["incidents"] == []


# -- files nested deeper than the interpreter's stack ----------------------------------------------------

def test_deeply_nested_json_is_unparseable_not_a_crash(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        atomic.read_json(path)
    assert atomic.read_json_or(path, "default") == "default"
    (tmp_path / "deep.jsonl").write_text(DEEP + "\n" + json.dumps({"ok": 1}) + "\n")
    assert atomic.read_jsonl(tmp_path / "deep.jsonl") == [{"ok": 1}]
    read = heartbeat.read_heartbeat(path)
    assert not read.valid and "not valid JSON" in read.errors[0]["message"]


def test_a_deeply_nested_config_is_a_usage_error_everywhere(state_dir, cli):
    state_dir.mkdir()
    (state_dir / "synapolis.json").write_text(DEEP)
    for args in (["beat", "--agent-id", "a"], ["monitor"], ["claims"], ["status", "--json"]):
        assert "nested too deeply" in refused(cli(*args))
    out = subprocess.run(validate_heartbeat_cmd(state_dir),
                         capture_output=True, text=True, timeout=60, env=clean_env())
    refused(out)
    doctor = cli("doctor", "--json")
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    assert any(f["check"] == "config" and f["status"] == "fail" for f in json.loads(doctor.stdout)["findings"])


def test_deeply_nested_state_files_never_crash_a_verb(state_dir, cli, pair):
    session, alice = pair
    assert cli("claim", "item", *alice).returncode == 0
    for where in ("identity.json", "heartbeat-monitor.json", "escalations/alice.json", "claims/item.json",
                  "heartbeats/alice.json", "hooks/x.json", f"sessions/{session}/session.json"):
        path = state_dir / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(DEEP)
    for args in (["beat", *alice], ["monitor"], ["escalate"], ["escalations"], ["claims"], ["status"],
                 ["claim", "item", *alice], ["watchdog"], ["list-agents"], ["beat"], ["start", "--agent-id", "c"]):
        out = cli(*args)
        assert "Traceback" not in out.stderr and "unexpected" not in out.stderr, (args, out.stderr)


def test_deep_lines_in_jsonl_logs_are_skipped(ws, cli, pair):
    session, alice = pair
    assert cli("note", "one", *alice).returncode == 0
    with open(ws.paths.session_notes(session), "a") as handle:
        handle.write(DEEP + "\n")
    assert cli("note", "two", *alice).returncode == 0
    notes = json.loads(cli("read-notes", "--json").stdout)["notes"]
    assert [(n["seq"], n["text"]) for n in notes] == [(1, "one"), (2, "two")]
    # the claim log is where a token's high-water mark is recovered from when the claim file is gone
    assert cli("claim", "item", *alice).returncode == 0
    with open(ws.paths.claims_log, "a") as handle:
        handle.write('{"item": "item", "x": ' + DEEP + "\n")
    (ws.paths.claims / "item.json").unlink()
    out = cli("claim", "item", *alice, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["claim"]["token"] == 2


def test_deeply_nested_hook_input_and_settings(state_dir, tmp_path):
    answer = hooks.handle("claude-code", DEEP, state_dir=state_dir, env={})
    assert answer["output"] == {} and "not JSON" in answer["problems"][0]
    from synapolis.harness.install import install

    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(DEEP)
    with pytest.raises(UsageError, match="not valid JSON"):
        install("claude-code", tmp_path)
    assert (tmp_path / ".claude" / "settings.json").read_text() == DEEP  # left untouched


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-5", "abc", "1e9"])
def test_a_hook_deadline_from_the_environment_is_sane(value):
    assert 0 < hooks.deadline_s({"SYNAPOLIS_HOOK_TIMEOUT_S": value}) <= 3600


def test_a_hook_with_an_infinite_deadline_still_answers_without_a_traceback(state_dir):
    env = clean_env(SYNAPOLIS_HOOK_TIMEOUT_S="1e400")
    out = subprocess.run(synapolis_cmd(state_dir, "hook", "claude-code"),
                         input=json.dumps({"session_id": "c1", "hook_event_name": "PostToolUse"}),
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and json.loads(out.stdout) is not None
    assert "Traceback" not in out.stderr, out.stderr
