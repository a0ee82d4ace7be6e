"""The PostgreSQL store's connections: one per process or a pool, its transactions, the schema check and the clock."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta, timezone

from ...errors import BusyError, InternalError, UsageError
from .. import base
from .driver import (_LOCK, CLOCK_ANCHOR_S, CONNECT_TIMEOUT_S, POOL_MAX, _cause, _command, describe_url, dict_row,
                     _key, pg_errors, psycopg, require_driver, split_password)
from .schema import SCHEMA, SCHEMA_VERSION


class PostgresConnection(base.Store):
    """The connection half of PostgresStore (store.py): one connection per process made on first use, or a
    pool of them in a long-lived process, and the transactions every record family runs in."""

    kind = "postgresql"

    def __init__(self, ws, url: str, pooled: bool = False):
        require_driver()
        self.ws = ws
        self.url = url
        # every connection is made from these two, never from the URL (split_password says why)
        self.conninfo, self._password = split_password(url)
        self.pooled = pooled  # a long-lived process: a pool of connections (store.keep_connections)
        self._pool = None
        self.where = describe_url(url)
        self.busy_timeout_ms = int(ws.config.busy_timeout_ms)
        self._lock = threading.RLock()
        self._conn = None
        self._cursor = None  # the cursor of `_conn` (_cursor_for)
        # the server's clock as last read (free with the schema check at connect) and this process's monotonic
        # clock at that moment: `now()` runs on from it, see there
        self._clock_anchor = None

    # -- connections and errors --------------------------------------------------------------------
    def _connect_options(self) -> dict:
        timeout = self.busy_timeout_ms
        secret = {} if self._password is None else {"password": self._password}
        return {**secret, "autocommit": True, "row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": "synapolis", "client_encoding": "UTF8",
                "options": f"-c lock_timeout={timeout} -c statement_timeout={timeout} "
                           "-c idle_in_transaction_session_timeout=60000 -c TimeZone=UTC"}

    def _connect(self):
        try:
            conn = psycopg.connect(self.conninfo, **self._connect_options())
        except psycopg.Error as exc:
            raise self._unreachable(exc) from None
        try:
            self._ensure_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _scrub(self, text: str) -> str:
        """libpq's message without the password, should it ever quote it (it does not: the password never
        rides in the conninfo it is given with the other parts; this is the second line of defence)."""
        password = self._password
        return text.replace(password, "***") if password else text

    def _unreachable(self, exc) -> BusyError:
        return BusyError(f"store {self.where} cannot be reached: {self._scrub(_cause(exc))}")

    def _drop(self) -> None:
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _translate(self, exc) -> Exception:
        """A psycopg error as a synapolis one; a connection that may be broken is dropped (the next call
        reconnects)."""
        if isinstance(exc, (pg_errors.LockNotAvailable, pg_errors.QueryCanceled, pg_errors.DeadlockDetected,
                            pg_errors.SerializationFailure)):
            return BusyError(f"store {self.where} stayed locked past busy_timeout_ms={self.busy_timeout_ms}: "
                             f"{self._scrub(_cause(exc))}")
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            self._drop()
            return BusyError(f"store {self.where} failed: {self._scrub(_cause(exc))}")
        if isinstance(exc, psycopg.DataError) and "NUL (0x00)" in str(exc):
            # PostgreSQL's text cannot hold U+0000 (SQLite's can): bad input, refused whole, nothing stored
            return UsageError(f"store {self.where}: text with a NUL character (U+0000) cannot be stored in "
                              "PostgreSQL; remove it and try again")
        if isinstance(exc, psycopg.IntegrityError):
            return InternalError(f"store {self.where}: {self._scrub(_cause(exc))}")
        return InternalError(f"store {self.where}: {self._scrub(_cause(exc))}")

    def connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _open_pool(self):
        """The pool of a long-lived process (psycopg-pool, imported only here): up to POOL_MAX connections,
        each checked against the schema when made, so threads (the MCP server's tools, the HTTP server's
        requests) no longer wait for each other's transactions."""
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(self.conninfo, min_size=1, max_size=POOL_MAX, kwargs=self._connect_options(),
                              configure=self._ensure_schema, open=False, name="synapolis",
                              # a failed attempt is given up at once and the next call asking for a
                              # connection tries again: a backoff could leave a server that came back
                              # unused for minutes
                              reconnect_timeout=0)
        pool.open(wait=False)
        return pool

    @contextlib.contextmanager
    def _checkout(self):
        """A connection for one transaction: the process's own (threads take turns), or one of the pool."""
        if not self.pooled:
            with self._lock:
                yield self.connection()
            return
        from psycopg_pool import PoolTimeout

        with self._lock:
            if self._pool is None:
                self._pool = self._open_pool()
        if self._pool.get_stats().get("pool_size", 1) == 0:
            # no connection and none being made: the last attempt failed (reconnect_timeout=0). Waiting for the
            # pool would only time out after CONNECT_TIMEOUT_S, for every part of every request of a server whose
            # store is away; a connection of our own names the cause at once (and the pool grows when it works)
            self._connect().close()
        try:
            ctx = self._pool.connection(timeout=CONNECT_TIMEOUT_S)
            conn = ctx.__enter__()
        except PoolTimeout:
            # no connection within the bound: name the cause (what a connection of our own meets), or busy
            self._connect().close()
            raise BusyError(f"store {self.where}: all {POOL_MAX} connections stayed busy for "
                            f"{CONNECT_TIMEOUT_S} s") from None
        try:
            yield conn
        except BaseException as exc:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            ctx.__exit__(None, None, None)

    def _discard(self, conn) -> None:
        """A connection found broken: closed, so that neither the process nor the pool uses it again."""
        with contextlib.suppress(Exception):
            conn.close()
        if conn is self._conn:
            self._conn = self._cursor = None

    @contextlib.contextmanager
    def transaction(self, begin: str = "BEGIN"):
        """A transaction on a connection of the process (`_checkout`): committed on success, rolled back on
        any error; psycopg errors become BusyError / InternalError. A connection that died while idle (the
        server restarted between two calls of a long-lived process) fails at BEGIN, before anything ran:
        the transaction starts again once on a new connection, so the caller never sees it.

        (libpq's pipeline mode was measured: on a local server its client-side cost outweighs the round
        trips it saves, benchmarks/RESULTS.md; statements that belong together are fused instead.)
        """
        begin = begin.encode()
        for attempt in (1, 2):
            with self._checkout() as conn:
                cur = self._cursor_for(conn)
                try:
                    _command(conn, begin)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    self._discard(conn)
                    if attempt == 2:
                        raise self._translate(exc) from None
                    if self._pool is not None:
                        self._pool.check()  # the pool's other idle connections died with it: replaced
                    continue
                except psycopg.Error as exc:
                    self._rollback(conn)
                    raise self._translate(exc) from None
                try:
                    yield cur
                    _command(conn, b"COMMIT")
                except psycopg.Error as exc:
                    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                        self._discard(conn)
                    self._rollback(conn)
                    raise self._translate(exc) from None
                except BaseException:
                    self._rollback(conn)
                    raise
                return

    def _cursor_for(self, conn):
        """The cursor a transaction runs on. The process's own connection keeps one (its transactions take turns,
        and making a cursor costs a tenth of a send's client time); a pooled connection's is made per transaction."""
        if self.pooled:
            return conn.cursor()
        cur = self._cursor
        if cur is None or cur.connection is not conn:
            cur = self._cursor = conn.cursor()
        return cur

    def _rollback(self, conn) -> None:
        if conn.closed:
            return
        try:
            _command(conn, b"ROLLBACK")  # past psycopg, which would deallocate every prepared statement (_SEND_STATE)
        except Exception:  # noqa: BLE001 - a connection that cannot even roll back is not reused
            self._discard(conn)

    def _ensure_schema(self, conn) -> None:
        """Create or upgrade the schema once; two machines doing it at once wait on one advisory lock."""
        try:
            row = conn.execute("SELECT version, clock_timestamp() AS now FROM synapolis_schema").fetchone()
        except pg_errors.UndefinedTable:
            row = None
        except psycopg.Error as exc:
            raise self._translate(exc) from None
        if row is not None and row["version"] >= SCHEMA_VERSION:
            self._clock_anchor = (row["now"], time.monotonic())
            return
        try:
            with conn.transaction():
                conn.execute(_LOCK, (_key("schema"),))
                conn.execute("CREATE TABLE IF NOT EXISTS synapolis_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
                             "version INTEGER NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                             "upgraded_at TIMESTAMPTZ NOT NULL DEFAULT now())")
                found = conn.execute("SELECT version FROM synapolis_schema").fetchone()
                if found is None or found["version"] < SCHEMA_VERSION:
                    conn.execute(SCHEMA)
                    conn.execute("INSERT INTO synapolis_schema (id, version) VALUES (1, %s) ON CONFLICT (id) "
                                 "DO UPDATE SET version = excluded.version, upgraded_at = now()", (SCHEMA_VERSION,))
        except psycopg.Error as exc:
            raise self._translate(exc) from None

    def schema_version(self) -> int:
        with self.transaction() as cur:
            cur.execute("SELECT version FROM synapolis_schema")
            return int(cur.fetchone()["version"])

    def now(self):
        """The server's clock: read from the server (free with the first query of a connection), then run
        on with this process's monotonic clock, which a change of the local wall clock does not move, and
        read again after CLOCK_ANCHOR_S. Within one process that saves a round trip per verb; two clocks
        drift apart by a few parts per million, microseconds over CLOCK_ANCHOR_S."""
        anchor = self._clock_anchor
        if anchor is None or time.monotonic() - anchor[1] > CLOCK_ANCHOR_S:
            with self._checkout() as conn:  # a new connection reads the clock for free (_ensure_schema)
                anchor = self._clock_anchor
                if anchor is None or time.monotonic() - anchor[1] > CLOCK_ANCHOR_S:
                    try:
                        moment = conn.execute("SELECT clock_timestamp() AS now").fetchone()["now"]
                    except psycopg.Error as exc:
                        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                            self._discard(conn)
                        raise self._translate(exc) from None
                    anchor = self._clock_anchor = (moment, time.monotonic())
        moment, at = anchor
        return (moment + timedelta(seconds=time.monotonic() - at)).astimezone(timezone.utc)

    def close(self) -> None:
        with self._lock:
            self._drop()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
