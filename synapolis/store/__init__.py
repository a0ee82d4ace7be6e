"""The store: where agents' shared state lives, chosen per state directory (contract §12).

`store_for(ws)` gives the state directory's `Store` (base.py is the interface): SQLite in the
state directory unless `SYNAPOLIS_STORE_URL` or the config key `store` names a `postgresql://`
URL. The PostgreSQL driver (psycopg) is imported only when that store is in use.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from ..config import POSTGRES_SCHEMES, STORE_RULE, is_store_url, store_url_problem
from ..errors import UsageError

# name -> (the submodule that holds it, its name there), for __getattr__
_LAZY = {"SCHEMA_VERSION": ("local.schema", "SCHEMA_VERSION"), "SessionStore": ("local.connection", "SessionStore"),
         "SqliteStore": ("local.store", "SqliteStore"), "Store": ("base", "Store"),
         "Transaction": ("base", "Transaction"), "SessionStoreBase": ("base", "SessionStore")}


def __getattr__(name: str):
    """The SQLite store's names (SCHEMA_VERSION, SessionStore, SqliteStore) and the interface's (Store,
    Transaction, SessionStoreBase), loaded when first asked for: a module that needs only a piece of the store
    (run_tokens, claim_keys) must not load sqlite3, the SQLite store or the interface's classes with it (the
    pre-tool hook and the remote hook never open a store)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where, there = _LAZY[name]
    module = __import__(f"{__name__}.{where}", fromlist=(there,))
    value = globals()[name] = getattr(module, there)  # kept: the next access is a plain global
    return value


ENV_STORE_URL = "SYNAPOLIS_STORE_URL"
_KEPT = None  # the process's SessionPool (lend_session), made by the first verb that borrows a store
_OPEN: dict = {}  # (root, url) -> Store: one per state directory and URL in a process
_LONG_LIVED = False  # keep_connections() was called: a server store uses a pool


def keep_connections() -> None:
    """This process lives long and serves many calls at once (`synapolis mcp`, `synapolis serve`): a
    database store keeps a pool of connections instead of one connection per call (contract §12)."""
    global _LONG_LIVED
    _LONG_LIVED = True


def store_url(ws, env=None) -> str:
    """The configured store: "sqlite" or a postgresql:// URL (the environment first, then the config)."""
    env = os.environ if env is None else env
    named = (env.get(ENV_STORE_URL) or "").strip()
    if named and not is_store_url(named):
        # the config's `store` is checked when it loads; the variable must be too, or a typo in the
        # scheme ("postgresq://", "mysql://") would quietly give this machine a swarm of its own.
        # Only the scheme is echoed: the rest may hold a password
        scheme = named.partition("://")[0] if "://" in named else ""
        raise UsageError(f"{ENV_STORE_URL} must be {STORE_RULE}"
                         + (f", not a {scheme[:20]!r} URL" if scheme.isalnum() else ""))
    if named and named != "sqlite":
        reason = store_url_problem(named)
        if reason:  # the config's `store` was checked when it loaded (check_config)
            raise UsageError(f"{ENV_STORE_URL}: {reason}")
    url = named or ws.config.values.get("store") or "sqlite"
    return url.strip() if isinstance(url, str) else "sqlite"


def is_postgres_url(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def store_for(ws) -> Store:
    """The Store of this state directory (made once per process and URL)."""
    url = store_url(ws)
    if not is_postgres_url(url):
        from .local.store import SqliteStore

        return SqliteStore(ws)
    # the process is part of the key: a forked child (multiprocessing) must not talk over its parent's
    # connection; it makes its own and leaves the parent's alone (close_all never closes another's)
    key = (os.getpid(), ws.files.root, url, int(ws.config.busy_timeout_ms))
    store = _OPEN.get(key)
    if store is None:
        from .postgres import PostgresStore

        store = _OPEN[key] = PostgresStore(ws, url, pooled=_LONG_LIVED)
    else:
        store.ws = ws
    return store




def clock(ws, now: datetime | None = None) -> datetime:
    """Every verb's `now`: the one the caller fixed (a naive one taken as UTC), else the store's clock,
    the database server's on a shared store (§12); without a state directory, this machine's."""
    if now is not None:
        return now if now.tzinfo is not None else now.replace(tzinfo=timezone.utc)
    if ws is None:
        return datetime.now(timezone.utc)
    # the workspace's own store (Workspace.store, kept for the workspace's life): not looked up again on
    # every verb's clock
    kept = getattr(ws, "store", None)
    return (kept if kept is not None else store_for(ws)).now()


def open_session(ws, session_id: str, create: bool = False) -> SessionStoreBase:
    """The store of one session: NotFoundError when it does not exist (and not `create`)."""
    return store_for(ws).open_session(session_id, create=create)


def lend_session(ws, session_id: str):
    """`with lend_session(ws, sid) as store:` the session's store for one verb, from the process's pool
    (store/pool.py): a second verb of this process in the same session reuses its connection and its prepared
    statements instead of opening the database again. Closed at the process's exit."""
    global _KEPT
    if _KEPT is None:
        import atexit

        from .pool import SessionPool

        _KEPT = SessionPool()
        atexit.register(_KEPT.close)
    return _KEPT.lend(ws, session_id)


def close_all() -> None:
    """Close every store this process opened (connections to a database server, pooled session stores)."""
    if _KEPT is not None:
        _KEPT.close()
    pid = os.getpid()
    for key in [key for key in _OPEN if key[0] == pid]:
        _OPEN.pop(key).close()
