"""The SQLite store's old import path: the local store (store/local/) under the name it always had."""

from __future__ import annotations

from .local.connection import WAL_TRIM_BYTES, SessionStore, changes_path  # noqa: F401
from .local.schema import PRIVATE_DIR, PRIVATE_FILE, SCHEMA_VERSION, create_private, make_private  # noqa: F401
from .local.store import SqliteStore  # noqa: F401
from .local.transaction import SqliteTransaction  # noqa: F401
