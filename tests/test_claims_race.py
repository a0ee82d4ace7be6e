"""Claims under real concurrency: racing processes, SIGKILLed claimers, a killed lock holder."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from conftest import configure, wait_until
from synapolis import claims
from synapolis.atomic import read_jsonl
from synapolis.errors import ConflictError, StaleToken
from synapolis.heartbeat import write_heartbeat
from synapolis.schemas import validation_errors
from synapolis.workspace import Workspace

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and SIGKILL")

N_PROCS, N_ITEMS, ROUNDS = 8, 20, 3
ITEMS = [f"ticket:{i:03d}" for i in range(N_ITEMS)]
DEADLINE_S = 60


def _racer(state_dir: str, index: int, barrier, out_dir: str) -> None:
    """One racing process: each round, claim every item in its own order at the same moment."""
    ws = Workspace.open(state_dir)
    agent = f"racer{index}"
    rng = random.Random(index)
    for rnd in range(ROUNDS):
        order = ITEMS[:]
        rng.shuffle(order)
        won, lost, other = {}, [], []
        barrier.wait(timeout=DEADLINE_S)  # everyone starts the round together
        for item in order:
            try:
                won[item] = claims.claim(ws, item, agent).token
            except ConflictError:
                lost.append(item)
            except Exception as exc:  # noqa: BLE001 - reported, and the test fails on it
                other.append(repr(exc))
        with open(os.path.join(out_dir, f"r{rnd}_{index}.json"), "w") as handle:
            json.dump({"won": won, "lost": lost, "other": other}, handle)
        barrier.wait(timeout=DEADLINE_S)  # every attempt is over before anyone releases
        for item in won:
            claims.release(ws, item, agent)
        barrier.wait(timeout=DEADLINE_S)  # all released before the next race


def _race(tmp_path, racer):
    """N_PROCS processes running `racer` at once (a barrier starts each round) against one state directory
    whose racers all have live heartbeats (nobody may take over from a winner); every one must exit 0 by
    the deadline. Returns (the workspace, the folder of the racers' per-round results)."""
    state_dir = tmp_path / "state"
    ws = Workspace.open(state_dir).ensure()
    for i in range(N_PROCS):
        write_heartbeat(ws.paths, f"racer{i}")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(N_PROCS)
    procs = [ctx.Process(target=racer, args=(str(state_dir), i, barrier, str(out_dir))) for i in range(N_PROCS)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + DEADLINE_S
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert [p.exitcode for p in procs] == [0] * N_PROCS
    return ws, out_dir


def test_eight_processes_race_for_twenty_items(tmp_path):
    ws, out_dir = _race(tmp_path, _racer)

    tokens = defaultdict(list)
    for rnd in range(ROUNDS):
        winners = defaultdict(list)
        for i in range(N_PROCS):
            result = json.loads((out_dir / f"r{rnd}_{i}.json").read_text())
            assert result["other"] == []
            assert len(result["won"]) + len(result["lost"]) == N_ITEMS
            for item, token in result["won"].items():
                winners[item].append((i, token))
        assert sorted(winners) == ITEMS
        for item, wins in winners.items():
            assert len(wins) == 1, f"round {rnd}: {item} won by {wins}"
            tokens[item].append(wins[0][1])
    for item in ITEMS:
        # a new token each acquisition, never repeated, never back
        assert tokens[item] == list(range(1, ROUNDS + 1)), (item, tokens[item])

    log = read_jsonl(ws.paths.claims_log)
    assert len(log) == 2 * ROUNDS * N_ITEMS  # one claimed and one released event per item and round
    for item in ITEMS:
        claimed = [e["token"] for e in log if e["item"] == item and e["event"] == "claimed"]
        assert sorted(claimed) == list(range(1, ROUNDS + 1))
        doc = json.loads(claims.claim_path(ws, item).read_text())
        assert validation_errors("claim", doc) == [] and doc["released_at"]


def test_cli_processes_race_for_one_item(tmp_path, spawn):
    """Six `synapolis claim` processes fire together: exactly one exits 0, the rest exit 3."""
    state_dir = tmp_path / "state"
    Workspace.open(state_dir).ensure()
    go, ready = tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    script = (
        "import os, sys, time\n"
        "from synapolis.cli import main\n"  # imported before the start line, so nobody lags
        f"open(os.path.join({str(ready)!r}, str(os.getpid())), 'w').close()\n"
        f"deadline = time.monotonic() + {DEADLINE_S}\n"
        f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline: time.sleep(0.001)\n"
        "main(sys.argv[1:])\n")
    procs = [spawn([sys.executable, "-c", script, "--state-dir", state_dir, "claim", "race:1", "--agent-id", f"cli{i}",
                    "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    # every one imported and waiting: correctness does not depend on it, only the overlap does
    wait_until(lambda: len(os.listdir(ready)) == len(procs), DEADLINE_S, "the racers to import synapolis")
    go.touch()
    outs = [(proc.wait(timeout=DEADLINE_S), proc.communicate(timeout=DEADLINE_S)) for proc in procs]
    codes = sorted(code for code, _ in outs)
    assert codes == [0] + [3] * 5, [o[1][1] for o in outs]
    winner = next(json.loads(out) for code, (out, _) in outs if code == 0)["claim"]
    assert winner["token"] == 1
    for code, (out, _) in outs:
        if code == 3:
            assert winner["claimed_by"] in json.loads(out)["error"]["message"]


CRASHER = """
import os, sys
from synapolis import claims
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
while True:
    record = claims.claim(ws, "crash:1", sys.argv[3], ttl_s=3600)
    os.write(fd, b"%d\\n" % record["token"])  # the token is out: it must never be handed out again
    claims.release(ws, "crash:1", sys.argv[3])
"""


def test_sigkilled_claimer_leaves_a_state_where_tokens_still_grow(tmp_path, spawn):
    state_dir = tmp_path / "state"
    ws = Workspace.open(state_dir).ensure()
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 3000}))
    tokens_file = tmp_path / "tokens"
    rng = random.Random(7)
    for k in range(6):
        seen = len(tokens_file.read_text().split()) if tokens_file.exists() else 0
        # a restarted agent has a new id (the same id would renew its own live claim, same token)
        child = spawn([sys.executable, "-c", CRASHER, state_dir, tokens_file, f"crasher{k}"], stderr=subprocess.PIPE)
        wait_until(lambda: tokens_file.exists() and len(tokens_file.read_text().split()) > seen, DEADLINE_S,
                   "the claimer to hand out a token")
        time.sleep(rng.uniform(0.0, 0.15))  # somewhere mid-claim, mid-write or mid-release
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=DEADLINE_S)
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        # whatever the moment, the claim file is whole (atomic replace) and listing works
        doc = json.loads(claims.claim_path(ws, "crash:1").read_text())
        assert validation_errors("claim", doc) == []
        assert [e["item"] for e in claims.list_claims(ws)] == ["crash:1"]
    handed_out = [int(t) for t in tokens_file.read_text().split()]
    assert handed_out == sorted(set(handed_out)), "a token was handed out twice or went back"
    # the crashers have no heartbeat ('missing'), so a claim one still held may be taken over
    record = claims.claim(ws, "crash:1", "survivor")
    assert record["token"] > max(handed_out)
    assert claims.check(ws, "crash:1", record["token"])["claimed_by"] == "survivor"
    for old in set(handed_out):
        with pytest.raises(StaleToken):
            claims.check(ws, "crash:1", old)
    log_tokens = [e["token"] for e in read_jsonl(ws.paths.claims_log) if e["event"] in ("claimed", "taken_over")]
    assert log_tokens == sorted(set(log_tokens))


LOCK_HOLDER = """
import sys, time
from synapolis import claims
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
with claims._item_lock(ws, "crash:2"):
    open(sys.argv[2], "w").close()
    time.sleep(120)
"""


def test_sigkilled_lock_holder_does_not_block_anyone(tmp_path, cli, spawn):
    state_dir = tmp_path / "state"
    ws = Workspace.open(state_dir).ensure()
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 1000}))
    ws = Workspace.open(state_dir)
    ready = tmp_path / "locked"
    child = spawn([sys.executable, "-c", LOCK_HOLDER, state_dir, ready])
    wait_until(ready.exists, DEADLINE_S, "the child to hold the lock")
    busy = cli("claim", "crash:2", "--agent-id", "alice")
    assert busy.returncode == 8 and "BusyError" in busy.stderr  # finite timeout, nobody waits forever
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=DEADLINE_S)
    assert cli("claim", "crash:2", "--agent-id", "alice").returncode == 0
    assert claims.check(ws, "crash:2", 1)["claimed_by"] == "alice"


def test_crash_leftovers_are_ignored(tmp_path):
    """What a writer killed mid-write leaves (a temp file, a torn log line) breaks nobody."""
    ws = Workspace.open(tmp_path / "state").ensure()
    claims.claim(ws, "t:1", "alice")
    leftover = ws.paths.claims / f".tmp-{claims.claim_path(ws, 't:1').name}.999.dead.tmp"
    leftover.write_text('{"item": "t:1", "token": 99')
    with ws.paths.claims_log.open("a") as log:
        log.write('{"at": "2030-01-01T00:00:00Z", "item": "t:1", "ev')
    assert [e["item"] for e in claims.list_claims(ws)] == ["t:1"]
    assert claims.release(ws, "t:1", "alice")["released_at"]
    assert claims.claim(ws, "t:1", "bob")["token"] == 2
    events = read_jsonl(ws.paths.claims_log)
    assert [e["event"] for e in events] == ["claimed", "released", "claimed"]


# -- the item lock's two sides (docs/CLAIMS.md, "The lock"): atomic.locked's try and filelock's wait ---------

FILELOCK_HOLDER = """
import os, sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
open(sys.argv[2], "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
    time.sleep(0.01)
lock.release()
"""

# a claimer that says when it falls back to filelock's wait: filelock is imported only then
WATCHED_CLAIMER = """
import sys


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "filelock":
            open(sys.argv[1], "w").close()
        return None


sys.meta_path.insert(0, Watch())
from synapolis.cli import main

main(sys.argv[2:])
"""


def test_a_filelock_holder_excludes_the_fast_try_and_the_claimer_waits(tmp_path, cli, spawn):
    """Process A holds the item's lock through filelock.FileLock (as a synapolis from before this lock did):
    `synapolis claim` cannot take it at once, waits through filelock, times out with exit 8, or wins
    once A lets go."""
    state_dir = tmp_path / "state"
    ws = configure(Workspace.open(state_dir).ensure(), busy_timeout_ms=500)
    path = claims._lock_file(ws, "lock:1")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    held, let_go = tmp_path / "held", tmp_path / "let-go"
    holder = spawn([sys.executable, "-c", FILELOCK_HOLDER, path, held, let_go])
    wait_until(held.exists, DEADLINE_S, "A to hold the lock through FileLock")

    busy = cli("claim", "lock:1", "--agent-id", "bob")
    assert busy.returncode == 8 and "BusyError" in busy.stderr, busy.stderr
    assert not claims.claim_path(ws, "lock:1").exists()  # nothing was written without the lock

    configure(ws, busy_timeout_ms=60_000)
    waiting = tmp_path / "waiting"
    claimer = spawn([sys.executable, "-c", WATCHED_CLAIMER, waiting, "--state-dir", state_dir, "claim", "lock:1",
                     "--agent-id", "bob", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(waiting.exists, DEADLINE_S, "B's fast try to fail and B to turn to filelock")
    assert claimer.poll() is None and not claims.claim_path(ws, "lock:1").exists()  # B waits: A holds it
    let_go.touch()
    out, err = claimer.communicate(timeout=DEADLINE_S)
    assert claimer.returncode == 0, err
    assert json.loads(out)["claim"]["token"] == 1
    assert holder.wait(timeout=DEADLINE_S) == 0
    assert claims.check(ws, "lock:1", 1)["claimed_by"] == "bob"


FAST_HOLDER = """
import os, sys, time
from synapolis import claims
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
with claims._item_lock(ws, "lock:2"):
    with open(sys.argv[2], "w") as out:
        out.write(str("filelock" in sys.modules))  # False: the lock was free, taken by atomic.locked's try
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_a_fast_holder_excludes_filelock(tmp_path, spawn):
    """The reverse: process A holds the item's lock through the fast try (no filelock loaded); a FileLock in
    this process cannot take it until A lets go, then takes it at once."""
    from filelock import FileLock, Timeout

    ws = Workspace.open(tmp_path / "state").ensure()
    held, let_go = tmp_path / "held", tmp_path / "let-go"
    holder = spawn([sys.executable, "-c", FAST_HOLDER, ws.root, held, let_go])
    wait_until(lambda: held.exists() and held.read_text(), DEADLINE_S, "A to hold the lock")
    assert held.read_text() == "False"
    lock = FileLock(claims._lock_file(ws, "lock:2"), timeout=0.3)
    with pytest.raises(Timeout):
        lock.acquire()
    let_go.touch()
    assert holder.wait(timeout=DEADLINE_S) == 0
    lock.acquire(timeout=DEADLINE_S)
    try:
        # and while this process holds it through FileLock, A's side of the lock finds it taken
        assert claims._try_item_lock(claims._lock_file(ws, "lock:2")) is None
    finally:
        lock.release()
    assert claims._try_item_lock(claims._lock_file(ws, "lock:2")) is not None


def _old_racer(state_dir: str, index: int, barrier, out_dir: str) -> None:
    """A racer of a synapolis from before the fast try (every lock through FileLock) on odd indexes: an
    old and a new install sharing one state directory still never let two agents win one item."""
    if index % 2:
        from synapolis.store.local import claims as local_claims  # where item_lock finds its fast try

        local_claims.try_item_lock = lambda path: None
    _racer(state_dir, index, barrier, out_dir)


def test_old_and_new_lockers_race_for_twenty_items(tmp_path):
    ws, out_dir = _race(tmp_path, _old_racer)
    for rnd in range(ROUNDS):
        winners = defaultdict(list)
        for i in range(N_PROCS):
            result = json.loads((out_dir / f"r{rnd}_{i}.json").read_text())
            assert result["other"] == []
            for item, token in result["won"].items():
                winners[item].append(i)
        assert sorted(winners) == ITEMS and all(len(w) == 1 for w in winners.values()), winners
    claimed = [e for e in read_jsonl(ws.paths.claims_log) if e["event"] == "claimed"]
    assert sorted((e["item"], e["token"]) for e in claimed) == \
        sorted((item, token) for item in ITEMS for token in range(1, ROUNDS + 1))
