"""The local store, the default: SQLite per session (`sessions/<id>/session.db`) and the state directory's files.

One database per session (WAL mode, `BEGIN IMMEDIATE` write transactions, so every write transaction is
exclusive and `max(sequence)` is always committed); sessions are `session.json` files; claims, the claims
index, the claim waiters, incidents, notes and the memory ledger are files of the state directory, each
kept by its module here (claims.py, claim_index.py, waits.py, incidents.py, notes.py, ledger.py) and
imported only when a verb touches them.
"""

from __future__ import annotations


def __getattr__(name: str):
    """The package's names, each loaded from its module when first asked for: importing one file family
    (claim_index.py, claims.py, ...) must not load sqlite3 and the session database's modules with it."""
    if name in ("WAL_TRIM_BYTES", "SessionStore", "changes_path"):
        from . import connection as module
    elif name in ("PRIVATE_DIR", "PRIVATE_FILE", "SCHEMA_VERSION", "create_private", "make_private"):
        from . import schema as module
    elif name == "SqliteStore":
        from . import store as module
    elif name == "SqliteTransaction":
        from . import transaction as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)  # kept: the next access is a plain global
    return value
