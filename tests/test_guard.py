"""Claims that guard the code (contract §14): path claims refused on overlap, `guard`, and waits that never deadlock,
on both stores, with real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from conftest import NOW, clean_env, configure, synapolis_cmd, use_store, wait_until
from synapolis import claims
from synapolis.claim_index import INDEX_FILE, holders_of
from synapolis.errors import ConflictError, ForbiddenError, UsageError
from synapolis.guard import guard
from synapolis.heartbeat import write_heartbeat
from synapolis.identity import Who
from synapolis.schemas import validation_errors
from synapolis.workspace import Workspace

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")


@pytest.fixture
def project(tmp_path, ws):
    """A git work tree holding the state directory (`ws`): the project whose paths are guarded."""
    (tmp_path / ".git").mkdir()
    for agent in ("alice", "bob", "carol"):
        write_heartbeat(ws.paths, agent)
    return tmp_path


def run(state_dir, *args, env=None, timeout=60):
    return subprocess.run(synapolis_cmd(state_dir, *args), capture_output=True, text=True, timeout=timeout,
                          env=clean_env(env))


# -- path claims and overlap ------------------------------------------------------------------------------

def test_an_overlapping_claim_is_refused_naming_the_holder_item_and_expiry(project, ws):
    claims.claim(ws, "src/api/**", "alice", ttl_s=600)
    for item in ("src/api/users.py", "src/**", "src/*/users.py", "**/*.py", "src/api/"):
        with pytest.raises(ConflictError) as err:
            claims.claim(ws, item, "bob")
        assert err.value.exit_code == 3
        details = err.value.details
        assert details["holder"] == "alice" and details["holder_item"] == "src/api/**" and details["expires_at"]
        assert "alice" in err.value.message and "src/api/**" in err.value.message
    # what does not overlap is granted; the caller's own overlapping items are reported, never refused
    assert claims.claim(ws, "src/api2/x.py", "bob").event == "claimed"
    assert claims.claim(ws, "docs/**", "bob").event == "claimed"
    own = claims.claim(ws, "src/api/users.py", "alice")
    assert own.event == "claimed" and own.overlaps == ["src/api/**"]
    # names are names: no pattern, and nothing overlaps them but themselves
    assert claims.claim(ws, "ticket:*", "bob").event == "claimed"
    assert claims.claim(ws, "ticket:142", "carol").event == "claimed"


def test_a_dead_or_released_overlapping_holder_does_not_block(project, ws):
    claims.claim(ws, "src/**", "alice")
    write_heartbeat(ws.paths, "alice", status="stopped")
    assert claims.claim(ws, "src/a.py", "bob").event == "claimed"
    write_heartbeat(ws.paths, "alice")
    claims.release(ws, "src/a.py", "bob")
    claims.release(ws, "src/**", "alice")
    assert claims.claim(ws, "src/a.py", "carol").event == "claimed"
    # an expired lease blocks nobody either
    claims.claim(ws, "lib/**", "alice", ttl_s=1, now=NOW)
    assert claims.claim(ws, "lib/x.py", "bob", now=NOW + timedelta(seconds=5)).event == "claimed"


def test_path_items_files_stay_in_the_claims_folder_and_validate(project, ws, cli):
    for item in (".github/workflows/ci.yml", "src/[ab]*.py", "**", "ticket:142"):
        claims.claim(ws, item, "alice")
        doc = claims.claim_path(ws, item)
        assert doc.parent == ws.paths.claims and not doc.name.startswith(".")
        if ws.paths.claims.exists() and doc.exists():  # SQLite keeps files; PostgreSQL rows
            assert validation_errors("claim", json.loads(doc.read_text())) == []
    assert claims.claim_path(ws, "ticket:142").name == "ticket%3A142.json"  # a plain name keeps its old file


def test_the_cli_normalises_a_path_item(project, ws, cli):
    state = ws.root
    out = run(state, "claim", "./src//api/", "--agent-id", "alice", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["claim"]["item"] == "src/api/"
    out = run(state, "claim", str(project / "src" / "api" / "x.py"), "--agent-id", "alice", "--json")
    answer = json.loads(out.stdout)["claim"]
    assert answer["item"] == "src/api/x.py" and answer["overlaps"] == ["src/api/"]
    refused = run(state, "claim", "/etc/passwd", "--agent-id", "alice", "--json")
    assert refused.returncode == 2 and "outside the project" in json.loads(refused.stdout)["error"]["message"]
    blocked = run(state, "claim", "src/api/y.py", "--agent-id", "bob", "--json")
    assert blocked.returncode == 3
    error = json.loads(blocked.stdout)["error"]
    assert error["type"] == "ConflictError" and error["holder"] == "alice" and error["holder_item"] == "src/api/"


def _pair_racer(state_dir, item, agent, barrier, rounds, out_path):
    ws = Workspace.open(state_dir)
    won = []
    for rnd in range(rounds):
        barrier.wait(timeout=60)
        try:
            claims.claim(ws, item, agent)
            won.append(rnd)
        except ConflictError:
            pass
        barrier.wait(timeout=60)  # both tried before anyone releases
        if rnd in won:
            claims.release(ws, item, agent)
        barrier.wait(timeout=60)
    with open(out_path, "w") as handle:
        json.dump(won, handle)


def test_two_processes_claiming_overlapping_patterns_at_once_never_both_win(project, ws, tmp_path):
    rounds = 12
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    racers = [("src/**", "alice"), ("src/a.py", "bob")]
    procs = [ctx.Process(target=_pair_racer, args=(str(ws.root), item, agent, barrier, rounds,
                                                   str(tmp_path / f"{agent}.json")))
             for item, agent in racers]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    alice = set(json.loads((tmp_path / "alice.json").read_text()))
    bob = set(json.loads((tmp_path / "bob.json").read_text()))
    assert not alice & bob, f"both won rounds {sorted(alice & bob)}"
    assert alice | bob == set(range(rounds))  # and somebody won every round


# -- guard -------------------------------------------------------------------------------------------------

def test_guard_blocks_live_others_only(project, ws):
    claims.claim(ws, "src/api/**", "alice")
    write_heartbeat(ws.paths, "alice.helper")
    claims.claim(ws, "docs/a.md", "alice.helper")
    paths = [str(project / "src" / "api" / "users.py"), "src/./api//v2/x.py", "src/other.py", "docs/a.md",
             "/etc/passwd", "../outside.py"]
    answer = guard(ws, Who("bob"), paths)
    assert answer["allowed"] is False and answer["agent_id"] == "bob"
    assert [(b["path"], b["item"], b["claimed_by"]) for b in answer["blocked"]] == [
        (paths[0], "src/api/**", "alice"), (paths[1], "src/api/**", "alice"), ("docs/a.md", "docs/a.md", "alice.helper")]
    assert all(set(b) >= {"path", "item", "claimed_by", "expires_at", "token"} for b in answer["blocked"])
    assert answer["outside"] == ["/etc/passwd", "../outside.py"]
    # the holder, and its sub-agents' claims, do not block the holder
    assert guard(ws, Who("alice"), paths)["allowed"] is True
    assert guard(ws, Who("alice.helper"), paths)["allowed"] is False  # its parent's claim is not its own
    # nobody at all (a person at a terminal): everything a live agent holds
    assert len(guard(ws, None, paths, env={})["blocked"]) == 3
    # the holder gone: nobody is blocked
    write_heartbeat(ws.paths, "alice", status="stopped")
    write_heartbeat(ws.paths, "alice.helper", status="stopped")
    assert guard(ws, Who("bob"), paths)["allowed"] is True


def test_guard_is_a_pure_query(project, ws):
    claims.claim(ws, "src/**", "alice")
    beat = ws.paths.heartbeat("bob")
    before = beat.read_bytes()
    log = ws.paths.claims_log.read_bytes() if ws.paths.claims_log.exists() else b""
    for _ in range(3):
        guard(ws, Who("bob"), ["src/x.py"])
    assert beat.read_bytes() == before
    assert (ws.paths.claims_log.read_bytes() if ws.paths.claims_log.exists() else b"") == log
    assert not ws.paths.heartbeat("nobody-new").exists()


def test_guard_refuses_bad_input(project, ws):
    for bad in ("src/x.py", None, [1], ["x" * 5000]):
        with pytest.raises(UsageError):
            guard(ws, Who("bob"), bad)
    with pytest.raises(UsageError):
        guard(ws, Who("../x"), ["a"])


def test_guard_with_require_run_token(project, ws, cli):
    configure(ws, require_run_token=True)
    ws2 = Workspace.open(ws.root)
    claims.claim(ws2, "src/**", "alice")
    started = run(ws.root, "start", "--agent-id", "alice", "--json")
    token = json.loads(started.stdout)["run_token"]
    assert guard(ws2, Who("alice", run_token=token), ["src/a.py"])["allowed"] is True
    assert guard(ws2, Who("alice"), ["src/a.py"])["agent_id"] is None  # no token: nobody, so blocked
    with pytest.raises(ForbiddenError):
        guard(ws2, Who("alice", run_token="wrong"), ["src/a.py"])


def test_guard_cli_exit_codes_and_lines(project, ws):
    state = ws.root
    claims.claim(ws, "src/api/**", "alice")
    free = run(state, "guard", "src/other.py", "--agent-id", "bob")
    assert free.returncode == 0 and free.stdout.startswith("ok:")
    held = run(state, "guard", "src/api/a.py", "src/api/b.py", "src/c.py", "--agent-id", "bob")
    assert held.returncode == 3
    lines = held.stdout.strip().splitlines()
    assert len(lines) == 2 and all("alice" in line and "synapolis signal alice" in line for line in lines)
    as_json = run(state, "guard", "src/api/a.py", "--json", env={"SYNAPOLIS_AGENT_ID": "bob"})
    assert as_json.returncode == 3
    data = json.loads(as_json.stdout)
    assert data["allowed"] is False and data["blocked"][0]["claimed_by"] == "alice"
    assert run(state, "guard", "src/api/a.py", env={"SYNAPOLIS_AGENT_ID": "alice"}).returncode == 0


def test_guard_staged_takes_both_sides_of_a_rename(tmp_path, ws):
    repo = tmp_path
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "src").mkdir()
    (repo / "src" / "old.py").write_text("x\n")
    (repo / "free.py").write_text("y\n")
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "one"], cwd=repo, check=True)
    subprocess.run(git + ["mv", "src/old.py", "lib.py"], cwd=repo, check=True)
    for agent in ("alice", "bob"):
        write_heartbeat(ws.paths, agent)
    claims.claim(ws, "src/**", "alice")  # the rename takes a file out of alice's folder
    out = subprocess.run(synapolis_cmd(ws.root, "guard", "--staged", "--json", "--agent-id", "bob"), cwd=repo,
                         capture_output=True, text=True, env=clean_env())
    assert out.returncode == 3, out.stderr
    assert [b["path"] for b in json.loads(out.stdout)["blocked"]] == ["src/old.py"]
    subprocess.run(git + ["reset", "-q"], cwd=repo, check=True)
    (repo / "free.py").write_text("z\n")
    subprocess.run(git + ["add", "free.py"], cwd=repo, check=True)
    ok = subprocess.run(synapolis_cmd(ws.root, "guard", "--staged", "--agent-id", "bob"), cwd=repo,
                        capture_output=True, text=True, env=clean_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    outside = subprocess.run(synapolis_cmd(ws.root, "guard", "--staged"), cwd="/", capture_output=True, text=True,
                             env=clean_env())
    assert outside.returncode == 2 and "Traceback" not in outside.stderr


# -- the index: fast, and never the only truth ---------------------------------------------------------------

@pytest.mark.sqlite_only  # the index file is the SQLite store's (PostgreSQL: claim_paths, in the claim's transaction)
def test_the_index_is_only_a_filter_and_is_rebuilt(project, ws):
    claims.claim(ws, "src/**", "alice")
    claims.claim(ws, "lib/a.py", "alice")
    index = ws.root / INDEX_FILE
    assert set(json.loads(index.read_text())["items"]) == {"src/**", "lib/a.py"}
    index.unlink()  # lost (a person cleaned up): guard scans the claim files, the next writer rebuilds it
    assert guard(ws, Who("bob"), ["src/x.py", "lib/a.py"])["allowed"] is False
    with pytest.raises(ConflictError):
        claims.claim(ws, "src/y.py", "bob")
    claims.claim(ws, "docs/**", "bob")
    assert set(json.loads(index.read_text())["items"]) == {"src/**", "lib/a.py", "docs/**"}
    # an index entry whose claim was released (a crash between file and index) blocks nobody
    claims.release(ws, "lib/a.py", "alice")
    doc = json.loads(index.read_text())
    doc["items"]["lib/a.py"] = "lib/a.py"
    index.write_text(json.dumps(doc))
    assert guard(ws, Who("bob"), ["lib/a.py"])["allowed"] is True
    index.write_text("{broken")
    assert guard(ws, Who("bob"), ["src/x.py"])["allowed"] is False


def test_many_claims_answer_exactly(project, ws):
    for i in range(60):
        claims.claim(ws, f"pkg{i}/**" if i % 3 else f"pkg{i}/*.py", "alice" if i % 2 else "carol", now=NOW)
    held = holders_of(ws, ["pkg3/x.py", "pkg3/sub/x.py", "pkg4/deep/x", "pkgx/a.py", "pkg33", "pkg34"], NOW)
    assert set(held) == {"pkg3/x.py", "pkg4/deep/x", "pkg34"}
    assert [r["item"] for r in held["pkg3/x.py"]] == ["pkg3/*.py"]


# -- waiting never deadlocks ------------------------------------------------------------------------------------

def test_two_waits_in_a_cycle_one_refused_at_once_the_other_served(project, ws, spawn):
    state = ws.root
    claims.claim(ws, "src/a/**", "alice")
    claims.claim(ws, "src/b/**", "bob")
    alice = spawn(synapolis_cmd(state, "claim", "src/b/x.py", "--agent-id", "alice", "--wait", "60", "--json"),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def alice_waits():
        listed = json.loads(run(state, "claims", "--json").stdout)["waiting"]
        return [w for w in listed if w["agent_id"] == "alice"]
    waits = wait_until(alice_waits, what="alice recorded as a waiter")
    assert waits[0]["item"] == "src/b/x.py" and waits[0]["blocked_by"] == ["bob"] and waits[0]["since"]
    began = time.monotonic()
    bob = run(state, "claim", "src/a/y.py", "--agent-id", "bob", "--wait", "60", "--json")
    assert bob.returncode == 3 and time.monotonic() - began < 20  # at once, not after its 60 s
    error = json.loads(bob.stdout)["error"]
    assert error["type"] == "ConflictError" and "deadlock" in error["message"]
    assert error["cycle"] == [{"agent_id": "bob", "holds": "src/b/**", "waits_for": "src/a/y.py"},
                              {"agent_id": "alice", "holds": "src/a/**", "waits_for": "src/b/x.py"}]
    assert alice.poll() is None  # still waiting
    assert run(state, "release", "src/b/**", "--agent-id", "bob").returncode == 0
    out, err = alice.communicate(timeout=30)
    assert alice.returncode == 0, err
    assert json.loads(out)["claim"]["item"] == "src/b/x.py"
    assert json.loads(run(state, "claims", "--json").stdout)["waiting"] == []


def test_a_dead_waiter_is_no_edge(project, ws):
    from synapolis import claim_waits

    claims.claim(ws, "A", "alice", now=NOW)
    claims.claim(ws, "B", "bob", now=NOW)
    err = ConflictError("held", item="B", holder="bob", holder_item="B")
    claim_waits.wait_for(ws, "alice", "B", err, NOW, NOW + timedelta(seconds=600))
    assert [w["agent_id"] for w in claim_waits.waiting(ws, NOW)] == ["alice"]
    back = ConflictError("held", item="A", holder="alice", holder_item="A")
    with pytest.raises(ConflictError) as cycle:
        claim_waits.wait_for(ws, "bob", "A", back, NOW + timedelta(seconds=1), NOW + timedelta(seconds=60))
    assert [c["agent_id"] for c in cycle.value.details["cycle"]] == ["bob", "alice"]
    # alice's waiting process died a minute ago without withdrawing: her record is stale, no cycle
    later = NOW + timedelta(seconds=60)
    assert claim_waits.waiting(ws, later) == []
    claim_waits.wait_for(ws, "bob", "A", back, later, later + timedelta(seconds=60))
    assert [w["agent_id"] for w in claim_waits.waiting(ws, later)] == ["bob"]


# -- across two state directories on one PostgreSQL ---------------------------------------------------------------

@pytest.mark.postgres
def test_two_state_dirs_on_one_postgres(tmp_path, pg_url, spawn):
    """Two machines, one database: a folder claimed on one is refused on the other, in claim and guard, and a
    wait cycle across them is refused at once."""
    machines = []
    for name in ("one", "two"):
        root = tmp_path / name
        (root / ".git").mkdir(parents=True)
        use_store(root / "state", pg_url)
        machines.append(root / "state")
    one, two = machines
    assert run(one, "beat", "--agent-id", "alice").returncode == 0
    assert run(two, "beat", "--agent-id", "bob").returncode == 0
    assert run(one, "claim", "src/api/", "--agent-id", "alice").returncode == 0
    refused = run(two, "claim", "src/api/users.py", "--agent-id", "bob", "--json")
    assert refused.returncode == 3 and json.loads(refused.stdout)["error"]["holder"] == "alice"
    asked = run(two, "guard", "src/api/users.py", str(tmp_path / "two" / "src" / "api" / "v2.py"), "--json",
                "--agent-id", "bob")
    assert asked.returncode == 3
    assert [b["claimed_by"] for b in json.loads(asked.stdout)["blocked"]] == ["alice", "alice"]
    assert run(two, "guard", "src/web/x.py", "--agent-id", "bob").returncode == 0
    # a deadlock across the two: alice (one) waits for bob's folder; bob (two) waiting for alice's is refused
    assert run(two, "claim", "src/web/**", "--agent-id", "bob").returncode == 0
    alice = spawn(synapolis_cmd(one, "claim", "src/web/a.py", "--agent-id", "alice", "--wait", "60", "--json"),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: json.loads(run(two, "claims", "--json").stdout)["waiting"], what="alice's wait, seen on two")
    bob = run(two, "claim", "src/api/b.py", "--agent-id", "bob", "--wait", "60", "--json")
    assert bob.returncode == 3
    assert [c["agent_id"] for c in json.loads(bob.stdout)["error"]["cycle"]] == ["bob", "alice"]
    assert run(two, "release", "src/web/**", "--agent-id", "bob").returncode == 0
    out, err = alice.communicate(timeout=30)
    assert alice.returncode == 0, err


@pytest.mark.postgres
def test_postgres_keeps_its_index_in_the_claims_transaction(tmp_path, pg_url):
    from synapolis.store import store_for

    ws = use_store(tmp_path / "state", pg_url)
    write_heartbeat(ws.paths, "alice")
    claims.claim(ws, "src/api/**", "alice")
    claims.claim(ws, "ticket:1", "alice")
    with store_for(ws).transaction() as cur:
        cur.execute("SELECT item, prefix FROM claim_paths ORDER BY item")
        rows = [(r["item"], r["prefix"]) for r in cur.fetchall()]
    assert rows == [("src/api/**", "src/api")]  # names are not in it
    claims.release(ws, "src/api/**", "alice")
    with store_for(ws).transaction() as cur:
        cur.execute("SELECT count(*) AS n FROM claim_paths")
        assert cur.fetchone()["n"] == 0


def test_a_claim_of_an_existing_folder_holds_what_is_in_it(project, ws):
    (project / "src" / "api").mkdir(parents=True)
    state = ws.root
    out = run(state, "claim", "src/api", "--agent-id", "alice", "--json")
    assert json.loads(out.stdout)["claim"]["item"] == "src/api/"
    assert run(state, "claim", "src/api/new.py", "--agent-id", "bob").returncode == 3
    # a literal path that is no folder is the one path: a file in a folder of that name is not under it
    assert run(state, "claim", "lib/a.py", "--agent-id", "alice").returncode == 0
    assert run(state, "claim", "**/*.md", "--agent-id", "bob").returncode == 3  # src/api/x.md is alice's
    assert run(state, "claim", "docs/**/*.md", "--agent-id", "bob").returncode == 0
    assert guard(ws, Who("bob"), ["lib/a.py"])["allowed"] is False
    assert guard(ws, Who("alice"), ["docs/x.md", "docs/a/b.md"])["blocked"][1]["item"] == "docs/**/*.md"


def test_nothing_held_is_known_without_the_store(project, ws, store_kind):
    from synapolis.claim_index import nothing_held

    if store_kind == "postgres":
        assert nothing_held(ws) is False  # another store: always ask guard
        return
    assert nothing_held(ws, env={}) is True  # no claim at all
    claims.claim(ws, "ticket:1", "alice")
    assert nothing_held(ws, env={}) is False  # claim files but no index yet: ask
    claims.claim(ws, "src/**", "alice")
    assert nothing_held(ws, env={}) is False
    claims.release(ws, "src/**", "alice")
    assert nothing_held(ws, env={}) is True  # the index lists nothing held
    assert nothing_held(ws, env={"SYNAPOLIS_STORE_URL": "postgresql://x/y"}) is False


def test_case_is_folded_where_the_file_system_ignores_it(project, ws, monkeypatch):
    from synapolis import project as proj

    assert proj.ignores_case(str(project)) is False  # this machine's file system heeds case
    claims.claim(ws, "Src/API/**", "alice")
    assert guard(ws, Who("bob"), ["src/api/x.py"])["allowed"] is True
    claims.claim(ws, "src/api/y.py", "bob")  # a different path where case counts
    # on a file system that ignores case (macOS, Windows) both are the same folder
    monkeypatch.setitem(proj._ROOTS, ws.files.root, (str(project), True))
    assert guard(ws, Who("carol"), ["SRC/api/x.py"])["blocked"][0]["item"] == "Src/API/**"
    with pytest.raises(ConflictError):
        claims.claim(ws, "src/API/z.py", "carol")


def test_reaped_and_force_released_path_claims_leave_the_index(project, ws):
    from synapolis.claim_index import nothing_held

    from synapolis.timeutil import format_ts

    write_heartbeat(ws.paths, "alice", now=format_ts(NOW))  # alive at NOW: only the lapsed lease is reaped
    claims.claim(ws, "src/**", "alice", ttl_s=1, now=NOW)
    claims.claim(ws, "lib/**", "alice", now=NOW)
    reaped = claims.reap(ws, now=NOW + timedelta(seconds=5))
    assert [r["item"] for r in reaped] == ["src/**"]
    claims.release(ws, "lib/**", "bob", force=True, reason="alice left", now=NOW + timedelta(seconds=6))
    assert guard(ws, Who("bob"), ["src/a.py", "lib/b.py"], now=NOW + timedelta(seconds=7))["allowed"] is True
    if ws.config.values.get("store", "sqlite") == "sqlite":
        assert json.loads((ws.root / INDEX_FILE).read_text())["items"] == {}
        assert nothing_held(ws, env={}) is True
