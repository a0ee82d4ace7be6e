"""The SQLite store's old import path: the local store (store/local/) under the name it always had."""

from __future__ import annotations

from .local import (PRIVATE_DIR, PRIVATE_FILE, SCHEMA_VERSION, WAL_TRIM_BYTES, SessionStore,  # noqa: F401
                    SqliteStore, SqliteTransaction, changes_path, create_private, make_private)
