"""Session stores kept open between the verbs of one process (`SessionPool`): a verb borrows one and gives
it back, so the next verb in that session opens no connection and prepares no statement again."""

from __future__ import annotations

import _thread  # what threading.Lock() builds, without importing threading (the CLI's hot path)
import os

from ..errors import SynapolisError


class SessionPool:
    """Idle session stores of one process, at most `idle_per_session` for each of the `max_sessions` sessions
    used last (least recently used given up first). A store is lent to one verb at a time, so threads never
    share one. It is reused only while its database is the same one (`Store.session_signature`: SQLite, the
    file's device and inode, so a replaced or removed session.db is reopened or reported missing) with the same
    busy timeout; a forked child keeps none of its parent's connections (SQLite forbids using them)."""

    def __init__(self, max_sessions: int = 4, idle_per_session: int = 1):
        self.max_sessions = max_sessions
        self.idle_per_session = idle_per_session
        self._lock = _thread.allocate_lock()
        self._idle: dict = {}  # (root, session_id) -> [(store, signature)]; dict order: least recently used first
        self._pid = os.getpid()
        self._inherited: list = []  # a parent's stores, seen in a forked child: kept from being closed, never used

    def lend(self, ws, session_id: str) -> "Loan":
        """`with pool.lend(ws, sid) as store:` an idle store of the session, else a new one (NotFoundError for
        a missing session, as open_session). Given back after the body, or after a SynapolisError (a verb's
        refusal: its transaction has ended and the connection is sound); closed after anything else."""
        return Loan(self, ws, session_id)

    def holds(self, ws, session_id: str) -> bool:
        """Whether an idle store of the session is kept."""
        self._own()
        with self._lock:
            return bool(self._idle.get((ws.files.root, session_id)))

    def _own(self) -> None:
        """Forget (without closing) stores a parent process opened, the first time a forked child gets here
        (called before taking the lock: one a parent's thread held at the fork would never be released)."""
        if self._pid != os.getpid():
            self._inherited.append(self._idle)
            self._lock = _thread.allocate_lock()
            self._idle, self._pid = {}, os.getpid()

    def _take(self, key, signature, wait_ms: int):
        """An idle store of `key` still on `signature` with `wait_ms`, or None; the stale ones are closed."""
        store, stale = None, []
        self._own()
        with self._lock:
            idle = self._idle.pop(key, None)
            if idle is not None:
                for index in range(len(idle) - 1, -1, -1):
                    candidate, kept_on = idle[index]
                    if kept_on != signature:
                        stale.append(idle.pop(index)[0])
                    elif store is None and candidate.busy_timeout_ms == wait_ms:
                        store = idle.pop(index)[0]
                self._idle[key] = idle  # to the end: used last
        for candidate in stale:
            candidate.close()
        return store

    def _give_back(self, key, store, signature) -> None:
        evicted = []
        self._own()
        with self._lock:
            idle = self._idle.get(key)
            if idle is None:
                while len(self._idle) >= self.max_sessions and self._idle:
                    oldest = next(iter(self._idle))
                    evicted.extend(kept for kept, _sig in self._idle.pop(oldest))
                idle = self._idle[key] = [] if self.max_sessions > 0 else None
            if idle is not None and len(idle) < self.idle_per_session:
                idle.append((store, signature))
                store = None
        for kept in evicted:
            kept.close()
        if store is not None:
            store.close()

    def close(self) -> None:
        """Close every idle store (a process's exit; a server's shutdown)."""
        self._own()
        with self._lock:
            pools, self._idle = list(self._idle.values()), {}
        for idle in pools:
            for store, _sig in idle:
                store.close()


class Loan:
    """One verb's use of a pooled store (a class, not contextlib: the hot verbs' imports stay small)."""

    __slots__ = ("pool", "ws", "session_id", "key", "signature", "store")

    def __init__(self, pool: SessionPool, ws, session_id: str):
        self.pool, self.ws, self.session_id = pool, ws, session_id
        self.key = self.signature = self.store = None

    def __enter__(self):
        ws, session_id = self.ws, self.session_id
        backend = ws.store  # the workspace's own Store (Workspace.store)
        self.key = (ws.files.root, session_id)
        # read before opening: a file replaced in between is kept under the old signature, which the next
        # verb finds changed (a reopen), never the other way round
        self.signature = backend.session_signature(session_id)
        store = self.pool._take(self.key, self.signature, int(ws.config.busy_timeout_ms))
        self.store = store if store is not None else backend.open_session(session_id)
        return self.store

    def __exit__(self, kind, value, traceback) -> None:
        store, self.store = self.store, None
        if store is None:
            return
        if kind is None or issubclass(kind, SynapolisError):
            self.pool._give_back(self.key, store, self.signature)
        else:
            store.close()  # anything else (a crash, an interrupt): the next verb gets a fresh connection
