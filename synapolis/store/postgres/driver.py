"""The PostgreSQL store's driver: psycopg (imported here alone), URLs without their password, libpq calls."""

from __future__ import annotations

import weakref

from ...errors import UsageError
from .. import base

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import dict_row  # noqa: F401  (the store's row factory, connection.py)
    from psycopg.pq import ConnStatus, DiagnosticField, ExecStatus

    _COMMAND_OK, _CONNECTION_OK, _SQLSTATE = ExecStatus.COMMAND_OK, ConnStatus.OK, DiagnosticField.SQLSTATE
    _TUPLES_OK = ExecStatus.TUPLES_OK
except ImportError:  # pragma: no cover - exercised by a test with the driver hidden
    # the names the other modules import from here exist either way; require_driver() stops every use
    psycopg = pg_errors = conninfo_to_dict = dict_row = None

CONNECT_TIMEOUT_S = 5  # libpq's connect_timeout; with busy_timeout_ms the bound of §12 (at most 10 s)
NOTIFY_CHANNEL = "synapolis_signals"
POOL_MAX = 8  # connections of a long-lived process's pool
CLOCK_ANCHOR_S = 30.0  # how long `now()` runs on the monotonic clock before reading the server's again
INSTALL_HINT = 'pip install "synapolis[postgres]"'

# a send in one call (Transaction.send_signal): session, id, timestamp, sender, recipient, type, content, caller,
# candidates, rate, moment, insert lock key, NOTIFY channel, reserved sequence, idempotency key,
# the live window's two edges (a broadcast's audience judged in the function; schema version 12) and the audience
# epoch the caller holds (version 13, store/postgres/audience.py)
SEND_CALL = ("SELECT synapolis_send(%s, %s, %s, %s, %s, %s, %s, %s, %s::text[], %s::float8, %s::float8, %s, %s, "
             "%s::int8, %s::text, %s::text, %s::text, %s::int8) AS out")
# the same as the statement each connection prepares at its second send (`_execute_send`), parameters $1 to $18
SEND_STATEMENT_NAME = b"synapolis_send"
SEND_STATEMENT = (SEND_CALL % tuple(f"${i}" for i in range(1, 19))).encode()
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_TRY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0)) AS got"


def require_driver() -> None:
    if psycopg is None:
        raise UsageError(f"the store is a PostgreSQL URL, but the driver psycopg is not installed: {INSTALL_HINT}")


def describe_url(url: str) -> str:
    """The URL without its password, rebuilt from its parsed parts: `postgresql://user@host:port/dbname` (what
    messages name); one that does not parse is named as such and nothing of it shown (pgurl.py)."""
    from ...pgurl import describe

    return describe(url)


def split_password(url: str) -> tuple[str, str | None]:
    """(a libpq conninfo without the password, the password or None): connections are made from the two, so
    nothing that holds or logs a conninfo (psycopg-pool's warnings, a connection's repr) ever carries the
    password. UsageError, quoting nothing of the URL, when it does not parse (pgurl.py's strict reading, then
    libpq's own, whose errors quote the text they refuse)."""
    from psycopg.conninfo import make_conninfo

    from ...pgurl import problem

    reason = problem(url)
    if reason is None:
        try:
            parts = conninfo_to_dict(url)
        except Exception:  # noqa: BLE001 - libpq's message quotes the URL: never shown
            reason = "libpq does not accept it (an unknown query parameter, or a value it refuses)"
    if reason is not None:
        raise UsageError(f"the store URL does not parse: {reason}; nothing of it is shown, since it may hold "
                         "a password")
    password = parts.pop("password", None)
    return make_conninfo(**parts), password


def _cause(exc: BaseException) -> str:
    """The useful last line of a libpq error ("password authentication failed ...", "Connection refused")."""
    text = str(exc).strip()
    if "failed: " in text:
        text = text.rsplit("failed: ", 1)[-1]
    first = text.splitlines()[0] if text else type(exc).__name__
    for prefix in ("FATAL:", "ERROR:"):
        first = first.replace(prefix, "")
    return " ".join(first.split()) or type(exc).__name__


def _command(conn, command: bytes) -> None:
    """BEGIN or COMMIT through libpq itself (`pgconn.exec_`, psycopg's documented low-level interface): a
    cursor's execute spends about 80,000 instructions on a command without parameters or rows, as much as the
    send between them (docs/STORE.md, "Round trips")."""
    result = conn.pgconn.exec_(command)
    if result.status != _COMMAND_OK:
        _raise_failure(conn, result, command.decode())


# How far each connection is with SEND_STATEMENT: absent, never run; ONCE, run once unprepared (a process that
# sends one signal, a CLI call, pays no round trip to prepare it); PREPARED. A prepared statement lasts as long as
# its connection, whatever becomes of the transaction that prepared it, unless DEALLOCATE ALL drops it: psycopg
# sends that when a ROLLBACK, DROP, ALTER or DISCARD runs through its cursor or `rollback()`, so the store rolls
# back through `_command` and changes the schema only on a new connection (`_ensure_schema`), before any send.
_SEND_STATE = weakref.WeakKeyDictionary()
_ONCE, _PREPARED = 1, 2
_NO_SUCH_STATEMENT = b"26000"  # SQLSTATE invalid_sql_statement_name


def _execute_send(conn, params) -> bytes | None:
    """The one value SEND_STATEMENT returns for `params`, through libpq itself (`pgconn.exec_params`, and from
    the connection's second send on, prepared, `exec_prepared`). A cursor's execute of it spent 45,000
    instructions more, adapting 14 parameters and loading the row (docs/STORE.md, "Round trips"). Parameters go
    as text: str as UTF-8 (every connection's client_encoding), numbers as their repr, None as NULL."""
    pgconn = conn.pgconn
    values = [_text_param(value) for value in params]
    state = _SEND_STATE.get(conn)
    if state is None:
        result = pgconn.exec_params(SEND_STATEMENT, values)
        _SEND_STATE[conn] = _ONCE
    else:
        if state == _ONCE:
            prepared = pgconn.prepare(SEND_STATEMENT_NAME, SEND_STATEMENT)
            if prepared.status != _COMMAND_OK:
                _raise_failure(conn, prepared, "PREPARE")
            _SEND_STATE[conn] = _PREPARED
        result = pgconn.exec_prepared(SEND_STATEMENT_NAME, values)
    if result.status != _TUPLES_OK:
        if result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            _SEND_STATE[conn] = _ONCE  # dropped after all: this send fails, the connection's next prepares again
        _raise_failure(conn, result, "EXECUTE")
    return result.get_value(0, 0)


def _text_param(value) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return repr(value).encode()
    if "\x00" in value:
        # libpq ends a text parameter at its first NUL, which would store the text cut short; psycopg's own
        # adaptation refuses it with this error, which `_translate` turns into the user's one-line refusal
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value.encode()


def _raise_failure(conn, result, what: str) -> None:
    """A failed libpq call raised as psycopg raises it: the class of its SQLSTATE, or OperationalError when
    the connection is lost (the transaction's retry and error translation depend on that)."""
    message = (result.error_message or conn.pgconn.error_message or b"").decode("utf-8", "replace").strip()
    message = message or f"{what} failed"
    if conn.pgconn.status != _CONNECTION_OK:
        raise psycopg.OperationalError(message)
    state = result.error_field(_SQLSTATE)
    raise (pg_errors.lookup(state.decode()) if state else psycopg.DatabaseError)(message)


def _text_array(items) -> str | None:
    """A text[] literal of `items` (None stays NULL), each quoted and escaped, so that every string is itself
    (a quoted NULL is the text 'NULL'): psycopg's own list adaptation spends about 56,000 instructions a call
    finding the element type, a third of a send's statement."""
    if items is None:
        return None
    return "{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items) + "}"


def _key(*parts: str) -> str:
    return "synapolis." + ".".join(parts)


def _key_taken(exc, index: str, key) -> None:
    """KeyTaken for a unique violation of `index` (signals_by_key, notes_by_key: the key is stored already)."""
    if key is not None and isinstance(exc, pg_errors.UniqueViolation) and index in str(exc):
        raise base.KeyTaken(key) from None


def _dump(value) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
