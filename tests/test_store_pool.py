"""The process's pool of session stores (store/pool.py): plain library verbs reuse one connection per session,
and never one whose database was replaced or removed, a parent's after a fork, or one a crash left behind."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import threading

import pytest

from synapolis import actions
from synapolis.errors import BusyError, NotFoundError
from synapolis.identity import Who
from synapolis.store import lend_session
from synapolis.store.pool import SessionPool
from synapolis.workspace import Workspace

from conftest import configure, store_rows, wait_until


def _session(start_agent, *names):
    sid = start_agent(names[0])["session_id"]
    for name in names[1:]:
        start_agent(name, session_id=sid)
    return sid


def _unread(ws, agent, sid) -> list[str]:
    answer = actions.read_signals(ws, Who(agent, sid), env={})
    return [s["content"] for s in answer["signals"]]


def test_verbs_in_one_session_reuse_one_store(ws, start_agent):
    sid = _session(start_agent, "alice", "bob")
    with lend_session(ws, sid) as first:
        pass
    actions.signal(ws, Who("alice", sid), "bob", "one", env={})
    with lend_session(ws, sid) as again:
        assert again is first  # the verb borrowed it and gave it back
        with lend_session(ws, sid) as second:  # lent to one borrower at a time: a second one opens its own
            assert second is not first
    assert _unread(ws, "bob", sid) == ["one"]


@pytest.mark.sqlite_only
def test_a_replaced_database_is_reopened_not_written_through_the_old_connection(ws, start_agent):
    sid = _session(start_agent, "alice", "bob")
    db = ws.files.session_db(sid)
    saved = db + ".saved"
    with sqlite3.connect(db) as live, sqlite3.connect(saved) as copy:
        live.backup(copy)  # the session before the signal, whole in one file
    live.close()
    copy.close()
    actions.signal(ws, Who("alice", sid), "bob", "before the restore", env={})
    assert _unread(ws, "bob", sid) == ["before the restore"]  # the pool now holds a store on the current file
    for suffix in ("-wal", "-shm"):  # a restore as SQLite asks for one: the old log goes with the old file
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    os.replace(saved, db)  # another process restores the file: a new inode at the same path
    actions.signal(ws, Who("alice", sid), "bob", "after the restore", env={})
    # a store kept on the old inode would show both; the restored file holds only the new one
    assert _unread(ws, "bob", sid) == ["after the restore"]
    assert [r["content"] for r in store_rows(ws, sid, "SELECT content FROM signals")] == ["after the restore"]


@pytest.mark.sqlite_only
def test_a_removed_session_is_missing_not_served_from_the_pool(ws, start_agent):
    sid = _session(start_agent, "alice", "bob")
    actions.signal(ws, Who("alice", sid), "bob", "kept?", env={})
    shutil.rmtree(os.path.dirname(ws.files.session_db(sid)))
    with pytest.raises(NotFoundError):
        actions.signal(ws, Who("alice", sid), "bob", "into nothing", env={})


def test_a_crash_in_the_body_closes_the_store_a_refusal_keeps_it(ws, start_agent):
    sid = _session(start_agent, "alice")
    with pytest.raises(RuntimeError):
        with lend_session(ws, sid) as crashed:
            raise RuntimeError("boom")
    with lend_session(ws, sid) as fresh:
        assert fresh is not crashed
    with pytest.raises(NotFoundError):
        with lend_session(ws, sid) as refused:
            raise NotFoundError("a verb's refusal")
    with lend_session(ws, sid) as kept:
        assert kept is refused is fresh
        with kept.read() as tx:
            assert tx.agent("alice") is not None


@pytest.mark.sqlite_only
def test_the_least_recently_used_session_is_closed_past_the_bound(ws, start_agent):
    pool = SessionPool(max_sessions=2, idle_per_session=1)
    sids = [start_agent("alice", session_id=f"s{i}")["session_id"] for i in range(3)]
    stores = {}
    for sid in sids[:2]:
        with pool.lend(ws, sid) as store:
            stores[sid] = store
    with pool.lend(ws, sids[0]):  # s0 used last: s1 is now the oldest
        pass
    with pool.lend(ws, sids[2]) as store:
        stores[sids[2]] = store
    assert pool.holds(ws, sids[0]) and pool.holds(ws, sids[2]) and not pool.holds(ws, sids[1])
    with pytest.raises(sqlite3.ProgrammingError):  # closed, not leaked
        stores[sids[1]]._conn.execute("SELECT 1")
    pool.close()
    with pytest.raises(sqlite3.ProgrammingError):
        stores[sids[0]]._conn.execute("SELECT 1")


@pytest.mark.sqlite_only
def test_a_changed_busy_timeout_gets_its_own_store(ws, start_agent):
    sid = _session(start_agent, "alice")
    with lend_session(ws, sid) as before:
        pass
    configure(ws, busy_timeout_ms=1234)
    changed = Workspace.open(ws.root)
    with lend_session(changed, sid) as after:
        assert after is not before and after.busy_timeout_ms == 1234


def _child_borrows(ws_root, sid, parent_ids, out):
    from synapolis.store import store_for
    ws = Workspace.open(ws_root)
    with lend_session(ws, sid) as store:
        # the parent's objects, inherited, have the same ids here: the session store, and on PostgreSQL the
        # process's store with its connection
        out.put(id(store) == parent_ids[0] or id(store_for(ws)) == parent_ids[1])
    actions.signal(ws, Who("alice", sid), "bob", "from the child", env={})


@pytest.mark.skipif(sys.platform == "win32" or "fork" not in multiprocessing.get_all_start_methods(),
                    reason="fork is a POSIX start method")
def test_a_forked_child_never_uses_its_parents_connection(ws, start_agent):
    sid = _session(start_agent, "alice", "bob")
    from synapolis.store import store_for

    with lend_session(ws, sid) as parents:
        pass  # idle in the pool as the child is forked
    backend = store_for(ws)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_borrows, args=(str(ws.root), sid, (id(parents), id(backend)), out))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert out.get(timeout=5) is False
    with lend_session(ws, sid) as again:
        assert again is parents  # the parent's own is still its own
    assert _unread(ws, "bob", sid) == ["from the child"]


@pytest.mark.sqlite_only
def test_a_locked_database_is_refused_and_the_pooled_store_works_after(ws, start_agent, tmp_path):
    sid = _session(start_agent, "alice", "bob")
    actions.signal(ws, Who("alice", sid), "bob", "first", env={})  # the pool holds a store now
    configure(ws, busy_timeout_ms=200)
    ws = Workspace.open(ws.root)
    actions.signal(ws, Who("alice", sid), "bob", "second", env={})  # a store with the new timeout, pooled
    ready = tmp_path / "locked"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time, pathlib\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "pathlib.Path(sys.argv[2]).write_text('x')\n"
        "sys.stdin.read()\n"), ws.files.session_db(sid), str(ready)], stdin=subprocess.PIPE)
    try:
        wait_until(ready.exists, what="the lock holder")
        with pytest.raises(BusyError):
            actions.signal(ws, Who("alice", sid), "bob", "while locked", env={})
    finally:
        holder.communicate(b"", timeout=30)
    actions.signal(ws, Who("alice", sid), "bob", "third", env={})
    assert _unread(ws, "bob", sid) == ["first", "second", "third"]


def test_threads_sending_at_once_each_borrow_their_own(ws, start_agent):
    sid = _session(start_agent, "bob", *[f"t{i}" for i in range(6)])
    configure(ws, rate_limit_per_min=10 ** 6)
    ws = Workspace.open(ws.root)
    errors = []

    def send(name):
        try:
            for i in range(20):
                actions.signal(ws, Who(name, sid), "bob", f"{name} {i}", env={}, piggyback=False)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(f"t{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    contents = [r["content"] for r in store_rows(ws, sid, "SELECT content FROM signals")]
    assert sorted(contents) == sorted(f"t{t} {i}" for t in range(6) for i in range(20))
