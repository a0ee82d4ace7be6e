"""The SQLite store's connection to one session.db: opening (and migrating) it, and its transactions."""

from __future__ import annotations

import _thread  # documented (its own page in the library reference); threading is ~1 ms of every CLI call
import os
import sqlite3

from ...errors import BusyError, InternalError, NotFoundError
from ...paths import SESSION_CHANGES
from .. import base
from .audience import AudienceCache
from .schema import (_BROADCASTS_INDEX, _BUCKET_COLUMNS, _IDEMPOTENCY_SCHEMA, _LIVENESS_INDEX, _SCHEMA,
                     SCHEMA_VERSION, _hash_clear_tokens, _statements, create_private, make_private)
from .transaction import SqliteTransaction


def _skip_checkpoint_on_close(conn) -> None:
    """Ask SQLite not to checkpoint (and delete the WAL) when this connection closes: Python 3.12+ only.

    Every CLI call opens and closes the store once; closing the last connection otherwise runs a
    checkpoint with fsyncs, and the next writer re-creates the WAL. The WAL is still checkpointed
    automatically every 1000 pages and trimmed by `_trim_wal`, so it stays bounded, and session.db +
    session.db-wal remain one consistent database. Python 3.10/3.11 have no `Connection.setconfig`;
    there SQLite checkpoints on close as it does by default (benchmarks/bench_checkpoint.py measured the
    difference at about 2 ms a call, not worth reaching into the connection through ctypes).
    """
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is None:
        return
    try:
        setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
    except (AttributeError, sqlite3.Error):  # an SQLite older than 3.16 has no such option: it checkpoints
        pass


WAL_TRIM_BYTES = 512 * 1024


def changes_path(db_path: str) -> str:
    """`sessions/<id>/changes` beside the session's database (StateFiles.session_changes): a counter of what a
    quiet hook must not miss (a signal inserted, an agent registered or restarted), bumped before each such
    commit. A hint only."""
    return os.path.join(os.path.dirname(db_path), SESSION_CHANGES)


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SessionStore(base.SessionStore):
    """An open connection to one session's database; use `write()` and `read()` for transactions."""

    def __init__(self, path: str | os.PathLike, session_id: str, busy_timeout_ms: int):
        self.path = os.fspath(path)  # a str: the hot paths never load pathlib (paths.StateFiles)
        self.session_id = session_id
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = _thread.RLock()  # what threading.RLock() builds, without importing threading
        self._wrote = False
        self._changes = changes_path(self.path)  # worked out once, not on every write transaction
        self._audiences = AudienceCache()  # a broadcast's audience, kept while it holds (audience.py)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves; timeout is SQLite's busy timeout.
            self._conn = sqlite3.connect(str(self.path), timeout=busy_timeout_ms / 1000.0,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise InternalError(f"cannot open session store {self.path}: {exc}") from None
        self._conn.row_factory = sqlite3.Row
        _skip_checkpoint_on_close(self._conn)

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def open(cls, ws, session_id: str, create: bool = False) -> "SessionStore":
        """Open `sessions/<session_id>/session.db`; NotFoundError when missing and not `create`."""
        path = ws.files.session_db(session_id)
        if not os.path.exists(path):
            if not create:
                # said whole: a plain `start` keeps choosing a session whose database was removed, and the
                # way on is a new session
                raise NotFoundError(f"unknown session {session_id!r}: no {path} (its database is gone: "
                                    "`synapolis start --new-session` begins another)")
            create_private(path)
        store = cls(path, session_id, int(ws.config.busy_timeout_ms))
        try:
            store._prepare()
        except BaseException:
            store.close()
            raise
        return store

    def _prepare(self) -> None:
        # WAL commits are durable against a killed process without an fsync per commit; a power cut may
        # lose the newest transactions (documented in docs/SIGNALS.md).
        version = self._pragma("PRAGMA foreign_keys = ON", "PRAGMA synchronous = NORMAL", "PRAGMA user_version")[0]
        if version >= SCHEMA_VERSION:
            return
        if version >= 1:
            make_private(self.path)  # a store an older synapolis made, maybe readable by everyone
        mode = self._pragma("PRAGMA journal_mode = WAL")[0]
        if str(mode).lower() != "wal":
            raise InternalError(f"session store {self.path} cannot use WAL mode (got {mode})")
        migrating = version == 1
        if migrating:
            # the clear tokens the update below replaces must not linger in freed space of the file
            self._pragma("PRAGMA secure_delete = ON")
        with self.write() as tx:
            conn = tx.conn
            # re-checked under the write lock: a racing creator may have done it already
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < 1:
                for statement in _statements(_SCHEMA):
                    conn.execute(statement)
            if version < 2:
                _hash_clear_tokens(conn)
            if version < 4:
                conn.execute(_BROADCASTS_INDEX)
                has_key = any(row[1] == "idempotency_key" for row in conn.execute("PRAGMA table_info(signals)"))
                for statement in _statements(_IDEMPOTENCY_SCHEMA):
                    if not (has_key and statement.lstrip().startswith("ALTER TABLE")):
                        conn.execute(statement)  # (has_key: a store marked older than it is)
            if version < 5:
                conn.execute(_LIVENESS_INDEX)
            if version < 6:
                has_bucket = any(row[1] == "tokens" for row in conn.execute("PRAGMA table_info(agents)"))
                for statement in _BUCKET_COLUMNS if not has_bucket else ():
                    conn.execute(statement)
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if migrating:
            # nor in the pages the WAL has not yet copied over them: copy now (best effort: a busy store
            # is checkpointed by a later writer, and the files are private by now either way)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                conn.execute("PRAGMA secure_delete = OFF")
            except sqlite3.Error:
                pass

    def _pragma(self, *statements: str):
        """Run `statements` in turn and answer the last one's first row; sqlite3's errors as ours (`_raise`)."""
        try:
            for statement in statements:
                row = self._conn.execute(statement).fetchone()
            return row
        except sqlite3.Error as exc:
            self._raise(exc)

    # -- transactions ---------------------------------------------------------------------------

    def _raise(self, exc: BaseException):
        """Raise `exc` as a synapolis error: locked past the timeout -> BusyError (exit 8), another sqlite3
        error InternalError; an IntegrityError, or anything that is not sqlite3's, as it is."""
        if isinstance(exc, sqlite3.OperationalError):
            if _is_busy(exc):
                raise BusyError(f"session store {self.path} stayed locked past busy_timeout_ms="
                                f"{self.busy_timeout_ms}: another process holds a write transaction") from None
            raise InternalError(f"session store {self.path}: {exc}") from None
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
            raise InternalError(f"session store {self.path} is damaged or not a database: {exc}") from None
        raise exc

    def write(self) -> "_InTransaction":
        """A `BEGIN IMMEDIATE` transaction: committed on success, rolled back on any error."""
        return _InTransaction(self, writes=True)

    def read(self) -> "_InTransaction":
        """A read transaction: one consistent snapshot for every query in the body."""
        return _InTransaction(self, writes=False)

    def forget_audience(self) -> None:
        self._audiences.forget()

    def close(self) -> None:
        try:
            if self._wrote:
                self._trim_wal()
            self._conn.close()
        except sqlite3.Error:
            pass

    def _trim_wal(self) -> None:
        """Checkpoint and truncate the WAL once it passes WAL_TRIM_BYTES (see _skip_checkpoint_on_close).

        A process that opens the store first rebuilds the WAL index by reading the whole WAL, and
        without a close-time checkpoint nobody resets it, so we keep it short ourselves. Briefly:
        a busy store just skips it, the next closer will do it.
        """
        try:
            size = os.stat(self.path + "-wal").st_size
        except OSError:
            return
        if size < WAL_TRIM_BYTES:
            return
        self._conn.execute("PRAGMA busy_timeout = 50")
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _quietly(conn, statement: str) -> None:
    """Run `statement` (a ROLLBACK, a read's COMMIT) where its failure changes nothing for the caller."""
    try:
        conn.execute(statement)
    except sqlite3.Error:
        pass


class _InTransaction:
    """`store.write()` / `store.read()`: the store's lock and BEGIN IMMEDIATE (a write) or BEGIN (a read); on
    leaving, a write commits, or rolls back after an error (or when its COMMIT fails), and a read commits
    either way. sqlite3's errors, the body's too, are raised as synapolis errors (SessionStore._raise).
    A class, as atomic.locked: contextlib stays off the hot verbs' imports."""

    __slots__ = ("store", "writes")

    def __init__(self, store: SessionStore, writes: bool):
        self.store, self.writes = store, writes

    def __enter__(self) -> SqliteTransaction:
        store = self.store
        store._lock.acquire()
        try:
            store._conn.execute("BEGIN IMMEDIATE" if self.writes else "BEGIN")
        except BaseException as exc:
            store._lock.release()
            store._raise(exc)
        if not self.writes:
            return SqliteTransaction(store._conn, store.session_id)
        store._wrote = True
        return SqliteTransaction(store._conn, store.session_id, store._changes, store._audiences)

    def __exit__(self, kind, value, traceback) -> None:
        store = self.store
        try:
            if kind is None and self.writes:
                try:
                    store._conn.execute("COMMIT")
                except BaseException as exc:
                    store._audiences.forget()  # it may hold what the rollback undoes
                    _quietly(store._conn, "ROLLBACK")
                    store._raise(exc)
            else:
                if self.writes:
                    store._audiences.forget()  # it may hold what the rollback undoes
                _quietly(store._conn, "ROLLBACK" if self.writes else "COMMIT")
        finally:
            store._lock.release()
        if kind is not None and issubclass(kind, sqlite3.Error):
            store._raise(value)
