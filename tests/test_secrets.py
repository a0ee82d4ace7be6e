"""Secrets on disk (issue 11, family 2): the files that hold a secret are private from their first moment,
whatever the umask; the store keeps run tokens only as hashes; stores an older synapolis wrote are migrated.
Checked by file modes, by the bytes on disk, and as another user of the machine where the test can be one."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import sqlite3
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import clean_env, NOW, WAL_OUTLIVES_CLOSE, synapolis_cmd
from synapolis import actions
from synapolis.errors import ForbiddenError
from synapolis.identity import Who, hash_token
from synapolis.store import SessionStore
from synapolis.store import sqlite as store
from synapolis.workspace import Workspace

CONVERSATION = "7d1c0a52-aaaa-bbbb-cccc-0123456789ab"


def synapolis(state_dir, *args, umask=0o022, input=None, env=None):
    """The CLI as a real process with the given umask; its CompletedProcess (exit 0 required)."""
    out = subprocess.run(synapolis_cmd(state_dir, *args),
                         input=input, capture_output=True, text=True, timeout=60, env=clean_env(env), umask=umask)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out


def a_working_day(state_dir, umask=0o022) -> dict:
    """Every kind of file the program makes: sessions, signals, notes, whiteboard, claims, a consolidation,
    a monitor pass and the watchdog, and a harness hook's state."""
    alice = json.loads(synapolis(state_dir, "start", "--agent-id", "alice", "--json", umask=umask).stdout)
    sid = alice["session_id"]
    bob = json.loads(synapolis(state_dir, "start", "--agent-id", "bob", "--session-id", sid, "--json",
                               umask=umask).stdout)
    as_bob = ["--agent-id", "bob", "--session-id", sid]
    synapolis(state_dir, "signal", "alice", "review src/a.py", *as_bob, umask=umask)
    synapolis(state_dir, "note", "starting", *as_bob, umask=umask)
    synapolis(state_dir, "whiteboard-write", "branch", "main", *as_bob, umask=umask)
    synapolis(state_dir, "claim", "src/a.py", *as_bob, umask=umask)
    synapolis(state_dir, "release", "src/a.py", *as_bob, umask=umask)
    synapolis(state_dir, "tired", "--memories", "-", *as_bob, input='["use uv"]', umask=umask)
    synapolis(state_dir, "monitor", umask=umask)
    synapolis(state_dir, "watchdog", umask=umask)
    hook = json.dumps({"session_id": CONVERSATION, "hook_event_name": "SessionStart", "source": "startup",
                       "cwd": str(state_dir.parent)})
    synapolis(state_dir, "hook", "claude-code", input=hook, umask=umask)
    return {"session_id": sid, "alice": alice["run_token"], "bob": bob["run_token"]}


def secrets_in(root: Path, session_id: str) -> dict[Path, int]:
    """Every path that holds (or leads only to) a secret, with the mode it must have: the WAL and its index
    when they are there (see WAL_OUTLIVES_CLOSE)."""
    session = root / "sessions" / session_id
    found = {root: 0o700, session: 0o700, root / "identity.json": 0o600, session / "session.db": 0o600}
    for name in ("session.db-wal", "session.db-shm"):
        if (session / name).exists():
            found[session / name] = 0o600
    for path in (root / "hooks").glob("*.json"):
        found[path] = 0o600
    return found


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_every_secret_is_private_whatever_the_umask(state_dir, umask):
    day = a_working_day(state_dir, umask)
    secret = secrets_in(state_dir, day["session_id"])
    folder = state_dir / "sessions" / day["session_id"]
    # 3.12+: the WAL and its index outlive the calls, so all three are checked here; 3.10/3.11: the last
    # closer normally folds the WAL into the database and removes both (not when it cannot get the database
    # to itself: then they stay, and are checked); their modes while they live: the next test
    for name in ("session.db-wal", "session.db-shm"):
        assert (folder / name).exists() or not WAL_OUTLIVES_CLOSE, name
    assert list((state_dir / "hooks").glob("*.json")), "the hook kept no state"
    for path, wanted in secret.items():
        assert mode(path) == wanted, f"{path.relative_to(state_dir.parent)} is {oct(mode(path))}"
    if umask == 0o022:
        # the rest is not secret (heartbeats, claims, the monitor, config, logs): readable, never writable
        # by others, and inside a state directory only its owner may enter
        for folder, dirs, files in os.walk(state_dir):
            for name in dirs + files:
                path = Path(folder) / name
                assert mode(path) & 0o022 == 0, f"{path} is {oct(mode(path))}"


def test_the_database_is_private_from_its_first_byte(ws, tmp_path):
    """No window: the file exists 0600 in a 0700 folder before SQLite opens it, and SQLite gives the -wal
    and -shm it creates the database's mode (checked while they are live)."""
    path = str(tmp_path / "s" / "x" / "session.db")
    old = os.umask(0)
    try:
        store.create_private(path)
        assert (mode(Path(path)), mode(Path(path).parent), os.path.getsize(path)) == (0o600, 0o700, 0)
        live = SessionStore.open(ws, "born_private", create=True)
        try:
            with live.write() as conn:
                conn.execute("INSERT INTO session_state (key, value, updated_by) VALUES ('k', 'v', 'a')")
            db = Path(live.path)
            assert {p.name: mode(p) for p in db.parent.iterdir()} == \
                {"session.db": 0o600, "session.db-wal": 0o600, "session.db-shm": 0o600}
            assert mode(db.parent) == 0o700
        finally:
            live.close()
    finally:
        os.umask(old)


def test_the_store_keeps_only_a_hash_of_each_run_token(state_dir):
    day = a_working_day(state_dir)
    folder = state_dir / "sessions" / day["session_id"]
    # the bytes first: closing the last connection (ours, below) folds the WAL into the database
    assert (folder / "session.db-wal").exists() or not WAL_OUTLIVES_CLOSE
    for name in ("session.db", "session.db-wal"):
        if not (folder / name).exists():
            continue  # the WAL, removed by the last closer on Python 3.10/3.11
        raw = (folder / name).read_bytes()
        for agent in ("alice", "bob"):
            assert day[agent].encode() not in raw, f"{agent}'s token is in {name}"
    conn = sqlite3.connect(folder / "session.db")
    stored = dict(conn.execute("SELECT id, run_token FROM agents").fetchall())
    conn.close()
    for agent in ("alice", "bob"):
        assert stored[agent] == "sha256:" + hashlib.sha256(day[agent].encode()).hexdigest()
    # and the tokens still prove who is who
    ws = Workspace.open(state_dir)
    actions.beat(ws, Who("bob", day["session_id"], day["bob"]), env={})
    with pytest.raises(ForbiddenError):
        actions.beat(ws, Who("bob", day["session_id"], day["alice"]), env={})


def _as_older_synapolis(db: Path, tokens: dict) -> None:
    """Turn a store into what synapolis wrote before schema 2: clear tokens, files readable by everyone."""
    conn = sqlite3.connect(db)
    with conn:
        for agent, token in tokens.items():
            conn.execute("UPDATE agents SET run_token = ? WHERE id = ?", (token, agent))
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    for path in (db.parent, db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if path.exists():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)


def test_a_store_with_clear_tokens_is_migrated_on_first_open(ws):
    alice = actions.start(ws, agent_id="alice", env={}, now=NOW)
    sid = alice["session_id"]
    db = Path(ws.paths.session_db(sid))
    _as_older_synapolis(db, {"alice": "old-clear-token-of-alice"})
    assert mode(db) == 0o644 and mode(db.parent) == 0o755

    # the agent keeps working with the token it was given, and the store now keeps only its hash
    actions.beat(ws, Who("alice", sid, "old-clear-token-of-alice"), env={}, now=NOW)
    conn = sqlite3.connect(db)
    row = conn.execute("SELECT run_token FROM agents WHERE id = 'alice'").fetchone()
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    assert row[0] == hash_token("old-clear-token-of-alice") and version == store.SCHEMA_VERSION
    assert (mode(db), mode(db.parent)) == (0o600, 0o700)
    for path in (db, Path(f"{db}-wal")):
        if path.exists():
            assert b"old-clear-token-of-alice" not in path.read_bytes(), path.name
    with pytest.raises(ForbiddenError):
        actions.beat(ws, Who("alice", sid, "guess"), env={}, now=NOW)


def test_a_clear_token_written_by_an_older_synapolis_after_migration_still_matches(ws):
    """Two versions on one state directory: an older one may still write a clear token; it is compared
    (in constant time) rather than locked out."""
    sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]
    conn = sqlite3.connect(ws.paths.session_db(sid))
    with conn:
        conn.execute("UPDATE agents SET run_token = 'written-in-clear' WHERE id = 'alice'")
    conn.close()
    again = actions.start(ws, agent_id="alice", session_id=sid, run_token="written-in-clear", env={}, now=NOW)
    assert again["registration"] == "reclaimed"
    with pytest.raises(ForbiddenError):
        actions.start(ws, agent_id="alice", session_id=sid, run_token="written-in-clea", env={}, now=NOW)


# -- as another user of the machine -------------------------------------------------------------------

def _other_user() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return None
    return "nobody"


def as_user(user: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), user=user, capture_output=True, text=True, timeout=30, cwd="/")


@pytest.mark.skipif(_other_user() is None, reason="needs root to switch to the user `nobody`")
def test_another_user_reads_no_secret(tmp_path):
    """`nobody` on the same machine, with the state directory made readable by its owner on purpose (a
    project folder): the heartbeats are readable (the control: nobody can get there), no secret is."""
    user = _other_user()
    base = Path(tempfile.mkdtemp(prefix="synapolis-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        state_dir = base / "state"
        state_dir.mkdir(mode=0o755)
        os.chmod(state_dir, 0o755)
        day = a_working_day(state_dir)
        control = as_user(user, "cat", str(state_dir / "heartbeats" / "alice.json"))
        assert control.returncode == 0 and json.loads(control.stdout)["agent_id"] == "alice", control.stderr
        for path in secrets_in(state_dir, day["session_id"]):
            if path == state_dir:
                continue
            command = ("ls", str(path)) if path.is_dir() else ("cat", str(path))
            tried = as_user(user, *command)
            assert tried.returncode != 0 and "Permission denied" in tried.stderr, (path, tried.stdout[:200])
            assert day["alice"] not in tried.stdout and day["bob"] not in tried.stdout
    finally:
        subprocess.run(["rm", "-rf", str(base)], timeout=30)


@pytest.mark.skipif(_other_user() is None, reason="needs root to switch to the user `nobody`")
def test_another_user_cannot_enter_a_state_directory_synapolis_made(state_dir):
    a_working_day(state_dir)
    assert mode(state_dir) == 0o700
    base = Path(tempfile.mkdtemp(prefix="synapolis-made-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        made = base / "state"
        a_working_day(made)
        tried = as_user(_other_user(), "cat", str(made / "heartbeats" / "alice.json"))
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
    finally:
        subprocess.run(["rm", "-rf", str(base)], timeout=30)
