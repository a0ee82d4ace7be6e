"""One session's SQLite store (`sessions/<id>/session.db`): schema, connections, locked transactions.

Everything else talks to the database through `SessionStore.write()` / `.read()`, so a Postgres
backend for agents on several machines can replace this class without touching the protocol code.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading

from .errors import BusyError, InternalError, NotFoundError

# 2: run tokens are kept as their SHA-256 (identity.hash_token), and the files are private (0600/0700)
SCHEMA_VERSION = 2
# session.db, its -wal and -shm hold every agent's signals and (hashed) run token: only their owner may
# read them, from the moment they exist (SQLite gives -wal and -shm the mode of the database file)
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

# EP-0118 §3's five tables exactly as written (names, columns, CHECKs), then our additions.
# Timestamps we write are RFC 3339 UTC with microseconds (`2026-06-02T10:09:24.123456Z`): fixed
# width, so comparing them as strings orders them in time.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents
(
    id             TEXT PRIMARY KEY,
    harness        TEXT NOT NULL,
    substrate      TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('active', 'idle', 'sleeping', 'stale')),
    last_heartbeat TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    run_token      TEXT NOT NULL,
    joined_at      TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    -- additions: the last signal sequence when the agent first joined (older broadcasts are history),
    -- its Lamport clock, and two watermarks: every signal it can see up to `read_upto` is read (or
    -- history), up to `delivered_upto` delivered, read or history; they keep inbox queries short.
    joined_seq     INTEGER NOT NULL DEFAULT 0,
    lamport        INTEGER NOT NULL DEFAULT 0,
    read_upto      INTEGER NOT NULL DEFAULT 0,
    delivered_upto INTEGER NOT NULL DEFAULT 0,
    started_at     TIMESTAMP
);

CREATE TABLE IF NOT EXISTS signals
(
    id        TEXT NOT NULL UNIQUE,
    sequence  INTEGER PRIMARY KEY AUTOINCREMENT,
    timestamp TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    sender    TEXT NOT NULL,
    recipient TEXT NOT NULL,
    type      TEXT NOT NULL CHECK (type IN
                                   ('inform', 'query', 'delegate', 'ack', 'warn', 'sleep_event', 'sleep_request')),
    content   TEXT NOT NULL,
    lamport   INTEGER NOT NULL DEFAULT 0,
    reply_to  TEXT
);

CREATE TABLE IF NOT EXISTS signal_reads
(
    signal_id TEXT NOT NULL,
    agent_id  TEXT NOT NULL,
    read_at   TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (signal_id, agent_id),
    FOREIGN KEY (signal_id) REFERENCES signals (id) ON DELETE CASCADE,
    FOREIGN KEY (agent_id) REFERENCES agents (id) ON DELETE CASCADE
);

CREATE TABLE IF NOT EXISTS session_state
(
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE IF NOT EXISTS staged_memories
(
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL,
    memory_data TEXT NOT NULL,
    created_at  TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

-- SPEC-037: a row only in the transaction that put the signal's content into a response to agent_id.
CREATE TABLE IF NOT EXISTS signal_deliveries
(
    signal_id       TEXT NOT NULL,
    agent_id        TEXT NOT NULL,
    delivered_at    TIMESTAMP NOT NULL,
    delivery_method TEXT NOT NULL CHECK (delivery_method IN
                                         ('startup_drain', 'piggyback', 'poll', 'push', 'hook')),
    offers          INTEGER NOT NULL DEFAULT 1,
    last_offered_at TIMESTAMP NOT NULL,
    PRIMARY KEY (signal_id, agent_id),
    FOREIGN KEY (signal_id) REFERENCES signals (id) ON DELETE CASCADE
);

-- one token bucket per sending agent (rate_limit_per_min)
CREATE TABLE IF NOT EXISTS rate_buckets
(
    agent_id   TEXT PRIMARY KEY,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS signals_by_recipient ON signals (recipient, sequence);
CREATE INDEX IF NOT EXISTS signal_reads_by_agent ON signal_reads (agent_id, signal_id);
CREATE INDEX IF NOT EXISTS deliveries_by_agent ON signal_deliveries (agent_id, delivery_method, offers);
"""


def create_private(path: str) -> None:
    """Create the folder (0700) and an empty database file (0600) before SQLite opens it, so the file is
    private from its first moment whatever the umask; SQLite then creates -wal and -shm with its mode."""
    os.makedirs(os.path.dirname(path), mode=PRIVATE_DIR, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE))
    except FileExistsError:  # a racing creator made it (the same way)
        pass


def make_private(path: str) -> None:
    """Take a store made by an older synapolis private: its folder 0700; the file, -wal and -shm 0600.
    Only the owner may change a mode; for anyone else this quietly does nothing (doctor reports it)."""
    if os.name == "nt":  # pragma: no cover - no POSIX modes
        return
    for target, mode in ((os.path.dirname(path), PRIVATE_DIR), (path, PRIVATE_FILE),
                         (path + "-wal", PRIVATE_FILE), (path + "-shm", PRIVATE_FILE)):
        try:
            if os.stat(target).st_mode & 0o777 & ~mode:
                os.chmod(target, mode)
        except OSError:
            continue


def _hash_clear_tokens(conn) -> None:
    """Schema 2: replace run tokens an older synapolis kept in clear with their hash (identity.hash_token)."""
    from .identity import hash_token, is_hashed

    rows = conn.execute("SELECT id, run_token FROM agents").fetchall()
    conn.executemany("UPDATE agents SET run_token = ? WHERE id = ?",
                     [(hash_token(r["run_token"]), r["id"]) for r in rows if not is_hashed(r["run_token"])])


def _statements(script: str):
    """Split a script into statements (executescript would commit our transaction first)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""


def _skip_checkpoint_on_close(conn) -> None:
    """Ask SQLite not to checkpoint (and delete the WAL) when this connection closes.

    Every CLI call opens and closes the store once; closing the last connection otherwise runs a
    checkpoint with two fsyncs and the next writer re-creates the WAL with another: about 20 ms of a
    ~60 ms call on a VM disk. The WAL is still checkpointed automatically every 1000 pages, so it
    stays bounded, and session.db + session.db-wal remain one consistent database.
    """
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is not None:  # Python 3.12+
        try:
            setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
        except (AttributeError, sqlite3.Error):
            pass
        return
    # Python 3.10/3.11 have no setconfig: call sqlite3_db_config on the connection's handle, which
    # CPython keeps as the first field after the object header. Only on builds where that holds.
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 10), (3, 11)) \
            or hasattr(sys, "gettotalrefcount"):
        return
    # The bare `_ctypes` (0.7 ms to import) rather than `ctypes` (3 ms, every CLI call): two C types
    # and a plain call are all this needs.
    global _DB_CONFIG
    if _DB_CONFIG is False:
        return
    try:
        import _ctypes

        if _DB_CONFIG is None:
            import _sqlite3

            class VoidP(_ctypes._SimpleCData):
                _type_ = "P"

            class Int(_ctypes._SimpleCData):
                _type_ = "i"

            address = _ctypes.dlsym(_ctypes.dlopen(_sqlite3.__file__, _ctypes.RTLD_LOCAL), "sqlite3_db_config")
            _DB_CONFIG = (address, VoidP, Int)
        address, VoidP, Int = _DB_CONFIG
        handle = VoidP.from_address(id(conn) + object.__basicsize__).value
        if handle:
            _ctypes.call_function(address, (VoidP(handle), Int(_NO_CKPT_ON_CLOSE), Int(1), VoidP(None)))
    except (ImportError, OSError, AttributeError, ValueError, TypeError):
        _DB_CONFIG = False  # not available here: closing simply checkpoints, as SQLite does by default


_DB_CONFIG = None
_NO_CKPT_ON_CLOSE = 1006  # SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE
WAL_TRIM_BYTES = 512 * 1024


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SessionStore:
    """An open connection to one session's database; use `write()` and `read()` for transactions."""

    def __init__(self, path: str | os.PathLike, session_id: str, busy_timeout_ms: int):
        self.path = os.fspath(path)  # a str: the hot paths never load pathlib (paths.StateFiles)
        self.session_id = session_id
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.RLock()
        self._wrote = False
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
                raise NotFoundError(f"unknown session {session_id!r}: no {path}")
            create_private(path)
        store = cls(path, session_id, int(ws.config.busy_timeout_ms))
        try:
            store._prepare()
        except BaseException:
            store.close()
            raise
        return store

    def _prepare(self) -> None:
        conn = self._conn
        with self._translate():
            conn.execute("PRAGMA foreign_keys = ON")
            # WAL commits are durable against a killed process without an fsync per commit; a power
            # cut may lose the newest transactions (documented in docs/SIGNALS.md).
            conn.execute("PRAGMA synchronous = NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version >= SCHEMA_VERSION:
            return
        if version >= 1:
            make_private(self.path)  # a store an older synapolis made, maybe readable by everyone
        with self._translate():
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise InternalError(f"session store {self.path} cannot use WAL mode (got {mode})")
        migrating = version == 1
        if migrating:
            # the clear tokens the update below replaces must not linger in freed space of the file
            with self._translate():
                conn.execute("PRAGMA secure_delete = ON")
        with self.write() as conn:
            # re-checked under the write lock: a racing creator may have done it already
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < 1:
                for statement in _statements(_SCHEMA):
                    conn.execute(statement)
            if version < 2:
                _hash_clear_tokens(conn)
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if migrating:
            # and not in the pages the WAL has not yet copied over them: copy now (best effort: a busy
            # store is checkpointed by the next writer, and the file is private by now either way)
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                conn.execute("PRAGMA secure_delete = OFF")

    # -- transactions ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self):
        """sqlite3 errors become synapolis errors: locked past the timeout -> BusyError (exit 8)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise BusyError(f"session store {self.path} stayed locked past busy_timeout_ms="
                                f"{self.busy_timeout_ms}: another process holds a write transaction") from None
            raise InternalError(f"session store {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise InternalError(f"session store {self.path} is damaged or not a database: {exc}") from None

    @contextlib.contextmanager
    def write(self):
        """A `BEGIN IMMEDIATE` transaction: committed on success, rolled back on any error."""
        with self._lock, self._translate():
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            self._wrote = True
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def read(self):
        """A read transaction: one consistent snapshot for every query in the body."""
        with self._lock, self._translate():
            conn = self._conn
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("COMMIT")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._wrote:
                self._trim_wal()
            self._conn.close()

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
