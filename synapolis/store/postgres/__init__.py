"""The PostgreSQL store (contract §12): one database shared by the state directories of many machines.

Imported only when `store` is a postgresql:// URL; of its modules, driver.py alone imports psycopg. A CLI call opens one
connection; a long-lived process (`store.keep_connections()`: `synapolis mcp`, `serve`) keeps a pool
(psycopg-pool, imported only then). Every connection has `lock_timeout` and `statement_timeout` at
busy_timeout_ms, so nothing waits forever.

How the guarantees hold with many writers on several machines (docs/STORE.md has the reasoning):
- Total order: every signal insert first takes a per-session advisory transaction lock, then draws
  its `sequence`, and keeps the lock until it commits; so within a session sequence order is commit
  order, and once a reader sees sequence N committed, every lower number of that session is
  committed too (or rolled back for good).
- Watermarks: a write transaction fixes its horizon (the highest committed sequence of the session)
  before its first signal query and reads only up to it; a watermark never moves past the horizon,
  so it never passes a number whose transaction has not committed yet.
- Delivery: a drain takes a per-agent advisory lock without waiting (`pg_try_advisory_xact_lock`);
  a second drain of the same agent at the same moment returns nothing rather than waiting or
  delivering twice, and delivery rows commit with the transaction that returns the signals.
- Consensus sleep: `tired` serialises its count on a per-session advisory lock.
- Time: decisions that compare agents use the server's clock (`Store.now()`).

Its modules, by record family: schema.py (tables, migrations), driver.py (psycopg, URLs, libpq calls),
signals.py and transaction.py (one session's transaction: its locks and signals, deliveries, reads; the
registry, rates, whiteboard, staged memories), audience.py (a broadcast's audience kept by the session's
epoch), claims.py (slots, the path index, waiters), incidents.py, events.py (the guard's refusals),
connection.py (connections, pool, transactions, clock) and store.py (PostgresStore: sessions, heartbeat
copies, notes, the ledger, cross-machine passes). What other modules import from the package is named below.
"""

from __future__ import annotations

from .driver import NOTIFY_CHANNEL, SEND_CALL, _command, _execute_send, _key, _text_array  # noqa: F401
from .schema import SCHEMA_VERSION  # noqa: F401
from .store import PostgresStore  # noqa: F401
from .transaction import PostgresTransaction  # noqa: F401
