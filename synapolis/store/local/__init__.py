"""The local store, the default: SQLite per session (`sessions/<id>/session.db`) and the state directory's files.

One database per session (WAL mode, `BEGIN IMMEDIATE` write transactions, so every write transaction is
exclusive and `max(sequence)` is always committed); sessions are `session.json` files; claims, the claims
index, the claim waiters, incidents, notes and the memory ledger are files of the state directory, each
kept by its module here (claims.py, claim_index.py, waits.py, incidents.py, notes.py, ledger.py) and
imported only when a verb touches them.
"""

from __future__ import annotations

from .connection import WAL_TRIM_BYTES, SessionStore, changes_path  # noqa: F401
from .schema import PRIVATE_DIR, PRIVATE_FILE, SCHEMA_VERSION, create_private, make_private  # noqa: F401
from .store import SqliteStore  # noqa: F401
from .transaction import SqliteTransaction  # noqa: F401
