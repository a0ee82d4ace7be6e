"""The local store, the default: SQLite per session (`sessions/<id>/session.db`) and the state directory's files.

One database per session (WAL mode, `BEGIN IMMEDIATE` write transactions, so every write transaction is
exclusive and `max(sequence)` is always committed); sessions are `session.json` files; claims, the claims
index, the claim waiters, incidents, notes and the memory ledger are files of the state directory, each
kept by its module here (claims.py, claim_index.py, waits.py, incidents.py, notes.py, ledger.py) and
imported only when a verb touches them: the package itself loads none of them (importing one file family
must not load sqlite3 and the session database's modules with it).
"""

from __future__ import annotations
