"""The CLI attacked from outside, as a careless or hostile user or agent would: each case here once gave a
wrong exit code, a traceback or a wrong answer; now it is the contract's one-line error and nothing is harmed.
Every call is a real process of this install's console script."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

from synapolis.harness.hooks import agent_id_for

from conftest import clean_env, console_script, refused, validate_heartbeat_cmd


def synapolis(state_dir, *args, env=None, input=None, timeout=60):
    cmd = [console_script("synapolis"), "--state-dir", str(state_dir), *map(str, args)]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=clean_env(env))


# -- SYNAPOLIS_STORE_URL -----------------------------------------------------------------------------

def test_a_store_url_that_is_neither_sqlite_nor_postgresql_is_a_usage_error(tmp_path):
    state = tmp_path / "state"
    assert synapolis(state, "start", "--agent-id", "alice").returncode == 0
    session = json.loads((state / "identity.json").read_text())["session_id"]
    bad = {"SYNAPOLIS_STORE_URL": "postgresq://swarm:s3cret@db.example/swarm"}  # a typo in the scheme
    for args in (["beat", "--agent-id", "alice"], ["signal", "*", "hello", "--agent-id", "alice"],
                 ["note", "hello", "--agent-id", "alice"], ["list-agents"], ["claim", "src/a.py", "--agent-id", "alice"]):
        line = refused(synapolis(state, *args, env=bad), 2, "UsageError")
        assert "SYNAPOLIS_STORE_URL" in line and "s3cret" not in line, line
    # nothing went into the local store that the variable meant to replace
    out = synapolis(state, "read-signals", "--all", "--agent-id", "alice", "--json")
    assert json.loads(out.stdout)["signals"] == []
    assert not (state / "sessions" / session / "notes.jsonl").exists()
    assert list((state / "claims").iterdir()) == []
    # the config's `store` key was already held to the same rule
    assert synapolis(state, "beat", "--agent-id", "alice", env={"SYNAPOLIS_STORE_URL": "sqlite"}).returncode == 0
    # doctor names it as a finding; a hook still exits 0 and says why on stderr
    report = synapolis(state, "doctor", "--json", env=bad)
    store = [f for f in json.loads(report.stdout)["findings"] if f["check"] == "store"]
    assert store[0]["status"] == "fail" and "SYNAPOLIS_STORE_URL" in store[0]["message"], report.stdout
    hook = synapolis(state, "hook", "claude-code", env=bad,
                     input=json.dumps({"hook_event_name": "PostToolUse", "session_id": "conversation-1"}))
    assert hook.returncode == 0 and "SYNAPOLIS_STORE_URL" in hook.stderr and "s3cret" not in hook.stderr


# -- errors are one line ---------------------------------------------------------------------------------

def test_every_usage_error_is_one_line_on_stderr(tmp_path):
    """A path with a newline in it must not split the error (or forge a second `synapolis: ...` line), and
    click's own messages (a choice's list, a group called bare) are folded onto the one line too."""
    forged = tmp_path / "f\nsynapolis: ForbiddenError: forged"
    forged.write_text("")
    state = tmp_path / "state"
    cases = [
        (["--state-dir", str(forged), "status"], {}),
        (["status"], {"SYNAPOLIS_STATE_DIR": str(forged)}),
        (["--state-dir", str(state), "tired", "--agent-id", "a", "--memories", str(tmp_path / "no\nsuch")], {}),
        (["--state-dir", str(state), "hooks", "install"], {}),  # a Choice argument missing
        (["--state-dir", str(state), "tokens"], {}),  # a group without its command
        (["--state-dir", str(state), "hooks"], {}),
        ([], {}),
    ]
    for args, env in cases:
        out = subprocess.run([console_script("synapolis"), *args], capture_output=True, text=True, timeout=60,
                             env=clean_env(env), cwd=tmp_path)
        refused(out, 2, "UsageError")


# -- a session folder whose session.json names another session ---------------------------------------------

def test_a_copy_of_a_session_folder_is_not_a_second_session(tmp_path):
    """`cp -a sessions/S sessions/S.bak` (a backup before an experiment) left two session.json files naming S:
    the listing counted S twice, so `start` refused with "2 sessions are active (S, S)" (exit 4)."""
    state = tmp_path / "state"
    assert synapolis(state, "start", "--agent-id", "alice").returncode == 0
    session = json.loads((state / "identity.json").read_text())["session_id"]
    shutil.copytree(state / "sessions" / session, state / "sessions" / f"{session}.bak")
    out = synapolis(state, "start", "--agent-id", "bob", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["session_id"] == session
    agents = json.loads(synapolis(state, "list-agents", "--json").stdout)["agents"]
    assert sorted((a["id"], a.get("session_id")) for a in agents) == [("alice", session), ("bob", session)]
    # the copy itself is untouched
    copy = json.loads((state / "sessions" / f"{session}.bak" / "session.json").read_text())
    assert copy["session_id"] == session and copy["status"] == "active"


def test_a_session_whose_database_was_removed_says_how_to_go_on(tmp_path):
    """A removed session.db left its session.json active: every plain `start` chose that session and was exit 6
    naming the missing file, without saying that a new session is the way on. It says so now, and that way works."""
    state = tmp_path / "state"
    assert synapolis(state, "start", "--agent-id", "alice").returncode == 0
    session = json.loads((state / "identity.json").read_text())["session_id"]
    (state / "sessions" / session / "session.db").unlink()
    line = refused(synapolis(state, "start", "--agent-id", "bob"), 6, "NotFoundError")
    assert "session.db" in line and "start --new-session" in line
    out = synapolis(state, "start", "--agent-id", "bob", "--new-session", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["session_id"] != session
    assert (state / "sessions" / json.loads(out.stdout)["session_id"] / "session.db").is_file()


# -- validate-heartbeat on a heartbeats folder it cannot list -----------------------------------------------

def test_validate_heartbeat_on_an_unlistable_heartbeats_folder_is_one_line_not_a_traceback(tmp_path):
    """`synapolis status` already said InternalError (exit 1) here; validate-heartbeat printed a traceback."""
    state = tmp_path / "state"
    assert synapolis(state, "init").returncode == 0
    (state / "heartbeats").rmdir()
    for make in ("loop", "file"):
        target = state / "heartbeats"
        if target.is_symlink() or target.exists():
            target.unlink()
        if make == "loop":  # a symbolic link that points at itself
            target.symlink_to(target)
        else:
            target.write_text("not a folder")
        for extra in ([], ["--json"]):
            out = subprocess.run(validate_heartbeat_cmd(state, *extra),
                                 capture_output=True, text=True, timeout=60, env=clean_env())
            assert "heartbeats" in refused(out, 1, "InternalError")
            if extra:
                assert json.loads(out.stdout)["error"]["exit_code"] == 1


# -- start that cannot write identity.json -------------------------------------------------------------------

def test_a_start_that_cannot_write_identity_json_registers_nothing_and_drains_nothing(tmp_path):
    """start committed the registration (and its startup drain) before writing identity.json: when that write
    failed it exited 1 without the run token, so the id was locked out (exit 3 on a retry, until stale) and
    the signals it had marked delivered never reached anyone."""
    state = tmp_path / "state"
    assert synapolis(state, "start", "--agent-id", "alice").returncode == 0
    dave = json.loads(synapolis(state, "start", "--agent-id", "dave", "--json").stdout)
    assert synapolis(state, "signal", "dave", "hello dave", "--agent-id", "alice").returncode == 0
    identity = state / "identity.json"
    identity.unlink()
    identity.mkdir()  # something in the way of identity.json
    for args in (["--agent-id", "erin"], ["--agent-id", "dave", "--run-token", dave["run_token"]]):
        line = refused(synapolis(state, "start", *args), 1, "InternalError")
        assert "identity.json" in line
    agents = json.loads(synapolis(state, "list-agents", "--json").stdout)["agents"]
    assert sorted(a["id"] for a in agents) == ["alice", "dave"]  # erin was not registered
    identity.rmdir()
    erin = synapolis(state, "start", "--agent-id", "erin", "--json")
    assert erin.returncode == 0 and json.loads(erin.stdout)["registration"] == "joined", erin.stderr
    again = json.loads(synapolis(state, "start", "--agent-id", "dave", "--run-token", dave["run_token"], "--json").stdout)
    assert [s["content"] for s in again["pending_signals"]] == ["hello dave"]  # still undelivered
    assert json.loads(identity.read_text())["agent_id"] == "dave"


# -- a hook that cannot remember its registration ----------------------------------------------------------------

def test_a_hook_that_cannot_save_its_state_registers_no_phantom_agents(tmp_path):
    """The hook registered the conversation, then failed to save hooks/<id>.json (its run token): the next call
    found the id taken by "someone else" and registered another one, so every tool call added a live agent
    (each one counted as an active other by everyone's `tired` for stale_after_s)."""
    state = tmp_path / "state"
    assert synapolis(state, "init").returncode == 0
    key = agent_id_for("claude-code", "conversation-1", env={})
    (state / "hooks" / f"{key}.json").mkdir(parents=True)  # in the way of the hook's state file
    event = json.dumps({"hook_event_name": "PostToolUse", "session_id": "conversation-1"})
    for _ in range(3):
        out = synapolis(state, "hook", "claude-code", input=event)
        assert out.returncode == 0 and out.stderr.strip() and "Traceback" not in out.stderr, out.stderr
    agents = json.loads(synapolis(state, "list-agents", "--json").stdout)["agents"]
    assert agents == []
    (state / "hooks" / f"{key}.json").rmdir()
    for _ in range(2):
        assert synapolis(state, "hook", "claude-code", input=event).returncode == 0
    agents = json.loads(synapolis(state, "list-agents", "--json").stdout)["agents"]
    assert [a["id"] for a in agents] == [key]


# -- a working directory that no longer exists ------------------------------------------------------------------

def test_an_absolute_state_dir_works_from_a_working_directory_that_was_removed(tmp_path):
    """An agent's shell in a worktree someone removed: with an absolute --state-dir or $SYNAPOLIS_STATE_DIR
    every verb (and hook) failed with 'InternalError: No such file or directory', because the path was joined
    to os.getcwd() even when it was absolute. Only finding the state directory from the working directory
    needs it, and then the error says so (exit 2)."""
    state = tmp_path / "state"
    assert synapolis(state, "start", "--agent-id", "alice").returncode == 0
    gone = tmp_path / "worktree"

    def from_gone(*args, env=None, input=None):
        gone.mkdir()
        line = f"cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && exec " + \
            " ".join(shlex.quote(str(a)) for a in [console_script("synapolis"), *args])
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60, env=clean_env(env),
                              input=input)

    out = from_gone("--state-dir", state, "beat", "--agent-id", "alice", "--task", "still here")
    assert out.returncode == 0, out.stderr
    assert json.loads((state / "heartbeats" / "alice.json").read_text())["task"] == "still here"
    out = from_gone("status", "--json", env={"SYNAPOLIS_STATE_DIR": str(state)})
    assert out.returncode == 0 and json.loads(out.stdout)["agents"][0]["agent_id"] == "alice", out.stderr
    hook = from_gone("--state-dir", state, "hook", "claude-code",
                     input=json.dumps({"hook_event_name": "SessionStart", "session_id": "conversation-1"}))
    assert hook.returncode == 0 and "additionalContext" in hook.stdout, hook.stderr
    line = refused(from_gone("status"), 2, "UsageError")  # nothing names the state directory
    assert "working directory" in line
    # doctor checks the harnesses' project, by default the working directory: gone, it says so (it was exit 1,
    # 'InternalError: No such file or directory'); with --project-dir it runs
    line = refused(from_gone("--state-dir", state, "doctor"), 2, "UsageError")
    assert "working directory" in line
    doctor = from_gone("--state-dir", state, "doctor", "--project-dir", tmp_path, "--json")
    assert json.loads(doctor.stdout)["project_dir"] == str(tmp_path), doctor.stderr
