"""The SQLite store, the embedded default: `sessions/<id>/session.db` per session, the rest as files.

One database per session (WAL mode, `BEGIN IMMEDIATE` write transactions, so every write
transaction is exclusive and `max(sequence)` is always committed); sessions are `session.json`
files, claims, incidents and the ledger stay the files their modules write.
"""

from __future__ import annotations

import _thread  # documented (its own page in the library reference); threading is ~1 ms of every CLI call
import os
import sqlite3

from ..atomic import bump_counter, read_counter
from ..errors import BusyError, InternalError, NotFoundError
from ..paths import SESSION_CHANGES
from . import base
from .sqlite_audience import broadcast_audience

# 2: run tokens are kept as their SHA-256 (identity.hash_token), and the files are private (0600/0700)
# 3: the broadcasts' index by sender (signals_broadcasts_by_sender), or idempotency keys (_IDEMPOTENCY_SCHEMA): two
#    branches each made a version 3; 4: both, each step idempotent, so a store either one left at 3 is completed
SCHEMA_VERSION = 5
# session.db, its -wal and -shm hold every agent's signals and (hashed) run token: only their owner may
# read them, from the moment they exist (SQLite gives -wal and -shm the mode of the database file)
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700

# Schema 3: a reader's inbox takes the broadcasts of each other sender from this index, in sequence order, so
# it never walks the broadcasts of its own family (its own and its sub-agents', which it does not see)
_BROADCASTS_INDEX = ("CREATE INDEX IF NOT EXISTS signals_broadcasts_by_sender ON signals (sender, sequence) "
                     "WHERE recipient = '*'")

# Schema 5: a broadcast's audience (every registered agent, live or waiting) from this index alone: the live
# ones are one range of it per live status, the rest the ranges around them, so a broadcast reads ids from the
# index without touching a registration row (issue 31; sqlite_audience.py)
_LIVENESS_INDEX = "CREATE INDEX IF NOT EXISTS agents_by_liveness ON agents (status, last_heartbeat, id)"

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
""" + "\n" + _BROADCASTS_INDEX + ";\n"

# version 3: idempotency keys (docs/SIGNALS.md, "Retries and idempotency keys"): a signal's with the signal, unique
# per sender; a note's beside it (the note itself is in notes.jsonl), unique per agent
_IDEMPOTENCY_SCHEMA = """
ALTER TABLE signals ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS signals_by_key ON signals (sender, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS note_keys
(
    agent_id   TEXT NOT NULL,
    key        TEXT NOT NULL,
    note       TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (agent_id, key)
) WITHOUT ROWID;
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
    Only the owner may change a mode; for anyone else this quietly does nothing."""
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
    from ..identity import hash_token, is_hashed

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
    """Ask SQLite not to checkpoint (and delete the WAL) when this connection closes: Python 3.12+ only.

    Every CLI call opens and closes the store once; closing the last connection otherwise runs a
    checkpoint with fsyncs, and the next writer re-creates the WAL. The WAL is still checkpointed
    automatically every 1000 pages and trimmed by `_trim_wal`, so it stays bounded, and session.db +
    session.db-wal remain one consistent database. Python 3.10/3.11 have no `Connection.setconfig`;
    there SQLite checkpoints on close as it does by default (benchmarks/bench_checkpoint.py measured the
    difference at about 2 ms a call, not worth reaching into the connection through ctypes).
    """
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is None:
        return
    try:
        setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
    except (AttributeError, sqlite3.Error):  # an SQLite older than 3.16 has no such option: it checkpoints
        pass


WAL_TRIM_BYTES = 512 * 1024


def changes_path(db_path: str) -> str:
    """`sessions/<id>/changes` beside the session's database (StateFiles.session_changes): a counter of what a
    quiet hook must not miss (a signal inserted, an agent registered or restarted), bumped before each such
    commit. A hint only."""
    return os.path.join(os.path.dirname(db_path), SESSION_CHANGES)


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


_INSERT_SIGNAL = ("INSERT INTO signals (id, timestamp, sender, recipient, type, content, lamport, reply_to, "
                  "idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
# signals.take_token's arithmetic in SQL (both IEEE doubles): refill at `rate / 60` a second up to `rate`,
# spend one; RETURNING gives no row when the WHERE kept the update out (fewer than one token)
_SPEND_TOKEN = ("INSERT INTO rate_buckets (agent_id, tokens, updated_at) VALUES (?, ?, ?) ON CONFLICT(agent_id) "
                "DO UPDATE SET tokens = min(?, tokens + max(0.0, ? - updated_at) * ?) - 1.0, updated_at = ? "
                "WHERE min(?, tokens + max(0.0, ? - updated_at) * ?) >= 1.0 RETURNING tokens")
_COLS = "s.sequence, s.id, s.timestamp, s.sender, s.recipient, s.type, s.content, s.lamport, s.reply_to"
_UNREAD = " AND NOT EXISTS (SELECT 1 FROM signal_reads r WHERE r.signal_id = s.id AND r.agent_id = ?)"
_UNDELIVERED = " AND NOT EXISTS (SELECT 1 FROM signal_deliveries d WHERE d.signal_id = s.id AND d.agent_id = ?)"


def _family(agent_id: str) -> tuple[str, str]:
    # ids under `a` are exactly the strings between "a." and "a/" ('/' follows '.' in ASCII and is
    # never in an id): a range an index can use, where LIKE would treat '_' as a wildcard.
    return agent_id + ".", agent_id + "/"


def _sql_limit(limit) -> int:
    """SQLite's LIMIT: -1 (none) when unset or beyond its 64-bit integers."""
    if limit is None or int(limit) >= 2 ** 63:
        return -1
    return int(limit)


class SqliteTransaction(base.Transaction):
    """A transaction on one session.db; `execute`/`executemany` reach the connection itself (tests and
    tools that inspect the SQLite file; the protocol code uses only the interface)."""

    __slots__ = ("conn", "session_id", "changes", "_senders")

    def __init__(self, conn, session_id: str, changes: str | None = None):
        self.conn = conn
        self.session_id = session_id
        self.changes = changes  # the session's change counter (changes_path); None in a read transaction
        self._senders = {}  # _broadcast_senders by reader, for this transaction (an insert forgets them)

    def execute(self, sql, args=()):
        return self.conn.execute(sql, args)

    def executemany(self, sql, rows):
        return self.conn.executemany(sql, rows)

    # -- the registry --------------------------------------------------------------------------------
    def agent(self, agent_id):
        return self.conn.execute("SELECT * FROM agents WHERE id = ?", (agent_id,)).fetchone()

    def agents(self, ids=None):
        if ids is None:
            return self.conn.execute("SELECT * FROM agents ORDER BY id").fetchall()
        ids = list(ids)
        marks = ",".join("?" * len(ids))
        return self.conn.execute(f"SELECT * FROM agents WHERE id IN ({marks}) ORDER BY id", ids).fetchall()

    def register_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.conn.execute("INSERT INTO agents (id, harness, substrate, status, last_heartbeat, run_token, joined_at, "
                          "joined_seq, read_upto, delivered_upto, started_at) "
                          "VALUES (?, ?, ?, 'active', ?, ?, ?, ?, 0, 0, ?)",
                          (agent_id, harness, substrate, stamp, run_token, stamp, self.max_sequence(), stamp))
        if self.changes is not None:
            self._count_change()  # a slot a quiet hook may hold (synapolis.harness.quiet)

    def restart_agent(self, agent_id, *, harness, substrate, stamp, run_token):
        self.conn.execute("UPDATE agents SET harness = ?, substrate = ?, status = 'active', last_heartbeat = ?, "
                          "run_token = ?, started_at = ? WHERE id = ?",
                          (harness, substrate, stamp, run_token, stamp, agent_id))
        if self.changes is not None:
            self._count_change()  # maybe taken over from a quiet hook (synapolis.harness.quiet)

    def refresh_agent(self, agent_id, stamp, status):
        self.conn.execute("UPDATE agents SET last_heartbeat = ?, status = ? WHERE id = ?", (stamp, status, agent_id))

    def count_live(self, cutoff, exclude=None, *, ceiling):
        row = self.conn.execute("SELECT COUNT(*) FROM agents WHERE status = 'active' AND last_heartbeat >= ? "
                                "AND last_heartbeat <= ? AND id IS NOT ?", (cutoff, ceiling, exclude)).fetchone()
        return int(row[0])

    def flag_stale(self, cutoff, *, ceiling):
        where = ("status IN ('active', 'idle') AND (last_heartbeat IS NULL OR last_heartbeat < ? "
                 "OR last_heartbeat > ?)")
        rows = self.conn.execute(f"SELECT id, status, last_heartbeat FROM agents WHERE {where}",
                                 (cutoff, ceiling)).fetchall()
        if rows:
            self.conn.execute(f"UPDATE agents SET status = 'stale' WHERE {where}", (cutoff, ceiling))
        return rows

    def raise_lamport(self, agent_id, value):
        self.conn.execute("UPDATE agents SET lamport = ? WHERE id = ? AND lamport < ?", (value, agent_id, value))

    def set_delivered_upto(self, agent_id, mark):
        self.conn.execute("UPDATE agents SET delivered_upto = ? WHERE id = ? AND delivered_upto < ?",
                          (mark, agent_id, mark))

    def set_read_upto(self, agent_id, mark):
        self.conn.execute("UPDATE agents SET read_upto = ?, delivered_upto = max(delivered_upto, ?) WHERE id = ?",
                          (mark, mark, agent_id))

    # -- signals -------------------------------------------------------------------------------------
    def max_sequence(self):
        # BEGIN IMMEDIATE: no other writer is between its insert and its commit while we read
        return int(self.conn.execute("SELECT COALESCE(max(sequence), 0) FROM signals").fetchone()[0])

    def max_lamport(self):
        return int(self.conn.execute("SELECT COALESCE(max(lamport), 0) FROM signals").fetchone()[0])

    def insert_signal(self, signal, caller=None):
        # one statement: a stored id is found by the unique index itself, and the failed statement is rolled
        # back whole, its AUTOINCREMENT number with it (an ignored INSERT, OR IGNORE or ON CONFLICT DO NOTHING,
        # would use that number up: a gap in the sequence)
        key = signal.get("idempotency_key")
        try:
            cursor = self.conn.execute(_INSERT_SIGNAL, (signal["id"], signal["timestamp"], signal["sender"],
                                                        signal["recipient"], signal["type"], signal["content"],
                                                        signal["lamport"], signal["reply_to"], key))
        except sqlite3.IntegrityError as exc:
            # "UNIQUE constraint failed: signals.id": that id is stored already (compared whole: the key's index
            # fails as "... signals.sender, signals.idempotency_key", which also holds "signals.id")
            if str(exc) == "UNIQUE constraint failed: signals.id":
                return None
            if key is not None and self.signal_by_key(signal["sender"], key) is not None:
                raise base.KeyTaken(key) from None  # signals_by_key: this sender stored it already
            raise
        self._senders.clear()
        if caller is not None:
            self.raise_lamport(caller, signal["lamport"])
        if self.changes is not None:
            self._count_change()
        return cursor.lastrowid

    # signals.send in the fewest statements (the checks and the id stay in signals.py): the audience and
    # the caller's row, the token, the insert, the caller's clock; a refusal before anything is written
    offers_send_signal = sqlite3.sqlite_version_info >= (3, 35, 0)  # RETURNING; older: one operation each

    judges_audience = True  # send_signal takes the live window and answers a broadcast's audience itself

    def send_signal(self, signal, *, caller, candidates, rate, moment, window=None):
        conn = self.conn
        heard = None
        # plain tuples, not sqlite3.Row, for every row read here: what signals.audience reads as it is
        cursor = conn.cursor()
        cursor.row_factory = None
        if candidates is None:
            # a broadcast reaches everyone but the sender and the agents it is a sub-agent of: its own
            # chain of ids, excluded by the primary key; only the three fields the audience reads
            parts = signal["sender"].split(".")
            chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            rows = None
            heard = broadcast_audience(cursor, chain, window) if window is not None else None
            if heard is None:
                rows = cursor.execute(f"SELECT id, status, last_heartbeat FROM agents WHERE id NOT IN "
                                      f"({','.join('?' * len(chain))}) ORDER BY id", chain).fetchall()
            mine = cursor.execute("SELECT lamport FROM agents WHERE id = ?", (caller,)).fetchone() if caller else None
        else:
            wanted = candidates if caller is None or caller in candidates else [*candidates, caller]
            found = cursor.execute("SELECT id, status, last_heartbeat, lamport FROM agents WHERE id IN "
                                   f"({','.join('?' * len(wanted))}) ORDER BY id", wanted).fetchall()
            rows = [r[:3] for r in found if r[0] in candidates]
            if not rows:
                return {"refused": "recipient"}
            mine = next((r for r in found if r[0] == caller), None)
        if caller is not None and mine is None:
            return {"refused": "caller"}
        if rate is not None:
            # the bucket refilled to `moment` and one token spent in one statement; none returned: empty
            spent = None
            if rate >= 1.0:  # a smaller rate never holds a whole token (the config's is a whole number >= 1)
                spent = cursor.execute(_SPEND_TOKEN, (caller, rate - 1.0, moment, rate, moment, rate / 60.0, moment,
                                                      rate, moment, rate / 60.0)).fetchone()
            if spent is None:
                row = self.rate_bucket(caller)
                tokens = rate if row is None else min(rate, row["tokens"] + max(0.0, moment - row["updated_at"])
                                                      * rate / 60.0)
                return {"refused": "rate", "tokens": tokens}
        lamport = (int(mine[-1]) if caller is not None else self.max_lamport()) + 1  # the row's last field
        signal = dict(signal, lamport=lamport)
        return {"sequence": self.insert_signal(signal, caller), "lamport": lamport, "rows": rows, "audience": heard}

    def _count_change(self) -> None:
        """Bump the change counter before the commit, under the write lock: whoever reads the counter and then
        takes the lock sees this change (or its rollback). A hook skips the store while it is unchanged
        (synapolis.harness.quiet), so a counter that cannot be bumped must not stay readable either. No
        counter yet means no hook remembers one (change_mark makes it, under this same lock): nothing to do,
        and a session without hooks pays nothing."""
        try:
            bump_counter(self.changes, create=False)
        except FileNotFoundError:
            return
        except OSError:
            try:
                os.unlink(self.changes)
            except OSError:
                pass
            if read_counter(self.changes) is not None:
                raise InternalError(f"cannot update {self.changes}, nor remove it") from None

    def change_mark(self):
        if self.changes is None:
            return None
        mark = read_counter(self.changes)
        if mark is None:  # never sent in, or lost: start it (under the write lock, like every bump)
            try:
                mark = bump_counter(self.changes)
            except OSError:
                return None
        return mark

    def signals_above(self, floor, limit):
        # a walk down the rowid from the end: at most limit + 1 rows, whatever the session holds
        return self.conn.execute("SELECT sequence, sender, recipient FROM signals WHERE sequence > ? "
                                 "ORDER BY sequence DESC LIMIT ?", (int(floor), int(limit) + 1)).fetchall()

    def recent_signals(self, limit):
        return self.conn.execute(f"SELECT {_COLS} FROM signals s ORDER BY s.sequence DESC LIMIT ?",
                                 (int(limit),)).fetchall()

    def find_signals(self, ref, limit=100):
        if len(ref) == 64:
            return self.conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.id = ?", (ref,)).fetchall()
        return self.conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.id >= ? AND s.id < ? LIMIT ?",
                                 (ref, ref + "g", limit)).fetchall()

    MAX_FAMILY_SEEKS = 64  # sub-agent recipients served by one index seek each; more: one range scan

    def _family_recipients(self, agent_id):
        """The distinct sub-agent recipients (`a.x`, `a.x.y`) signals were sent to, each found by one seek
        of the recipient index; None when there are more than MAX_FAMILY_SEEKS (the caller scans the range)."""
        lo, hi = _family(agent_id)
        found, last = [], lo
        while len(found) <= self.MAX_FAMILY_SEEKS:
            row = self.conn.execute("SELECT recipient FROM signals WHERE recipient > ? AND recipient < ? "
                                    "ORDER BY recipient LIMIT 1", (last, hi)).fetchone()
            if row is None:
                return found
            found.append(row[0])
            last = row[0] + "\x00"  # the next recipient after this one (ids never hold NUL)
        return None

    MAX_BROADCAST_SEEKS = 64  # senders of broadcasts served by one branch each; more: one walk of them all

    def _broadcast_senders(self, agent_id):
        """The distinct senders of broadcasts the reader sees (all but itself and its sub-agents), each found by
        one seek of signals_broadcasts_by_sender; None when there are more than MAX_BROADCAST_SEEKS."""
        if agent_id in self._senders:
            return self._senders[agent_id]
        lo, hi = _family(agent_id)
        found, last = [], ""
        while found is not None:
            row = self.conn.execute("SELECT sender FROM signals INDEXED BY signals_broadcasts_by_sender "
                                    "WHERE recipient = '*' AND sender > ? ORDER BY sender LIMIT 1", (last,)).fetchone()
            if row is None:
                break
            last = row[0]
            if lo < last < hi:
                last = hi  # the reader's sub-agents: past all of them in one seek
            elif last != agent_id:
                found.append(last)
                if len(found) > self.MAX_BROADCAST_SEEKS:
                    found = None
        self._senders[agent_id] = found
        return found

    def _broadcast_branches(self, agent_id, bfloor):
        """The broadcast part of `_visible_select`: one branch per other sender (each an index range in sequence
        order), or, past MAX_BROADCAST_SEEKS senders, one walk of every broadcast skipping the reader's family
        (then a small share of them: the reader is one of that many senders)."""
        senders = self._broadcast_senders(agent_id)
        if senders is None:
            lo, hi = _family(agent_id)
            return [("s.recipient = '*' AND s.sequence > ? AND s.sender != ? AND NOT (s.sender > ? AND s.sender < ?)",
                     [bfloor, agent_id, lo, hi])]
        return [("s.recipient = '*' AND s.sender = ? AND s.sequence > ?", [who, bfloor]) for who in senders]

    def _visible_select(self, agent_id, bfloor, dfloor, unread, undelivered, below=None):
        """The visible signals after the floors (and before `below`), as a UNION ALL each branch of which
        an index serves.

        Each branch is an equality on the recipient and a range on the sequence of `signals_by_recipient`,
        so it comes out ordered by sequence and `ORDER BY sequence LIMIT n` stops after n rows: a page costs
        the same whatever the session holds. Sub-agents get one branch each (found by index seeks); a range
        on the recipient could not keep that order, and SQLite would rather walk the whole table by rowid.
        """
        lo, hi = _family(agent_id)
        extra, extra_args = "", []
        if below is not None:
            extra, extra_args = " AND s.sequence < ?", [below]
        if unread:
            extra, extra_args = extra + _UNREAD, extra_args + [agent_id]
        if undelivered:
            extra, extra_args = extra + _UNDELIVERED, extra_args + [agent_id]
        branches = self._broadcast_branches(agent_id, bfloor)
        branches.append(("s.recipient = ? AND s.sequence > ?", [agent_id, dfloor]))
        family = self._family_recipients(agent_id)
        if family is None:
            branches.append(("s.recipient > ? AND s.recipient < ? AND s.sequence > ?", [lo, hi, dfloor]))
        else:
            branches += [("s.recipient = ? AND s.sequence > ?", [who, dfloor]) for who in family]
        sql, args = [], []
        for where, params in branches:
            if where.startswith("s.recipient >"):
                source = "signals s INDEXED BY signals_by_recipient"
            elif where.startswith("s.recipient = '*' AND s.sender ="):
                source = "signals s INDEXED BY signals_broadcasts_by_sender"
            else:
                source = "signals s"
            sql.append(f"SELECT {_COLS} FROM {source} WHERE {where}{extra}")
            args += params + extra_args
        return " UNION ALL ".join(sql), args

    def visible_signals(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, newest_first=False,
                        limit=None, reader_fields=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        inner += f" ORDER BY sequence {'DESC' if newest_first else 'ASC'} LIMIT ?"
        args.append(_sql_limit(limit))
        if not reader_fields:
            rows = self.conn.execute(inner, args).fetchall()
            return rows[::-1] if newest_first else rows
        sql = (f"SELECT v.*, r.read_at, d.delivered_at, d.delivery_method FROM ({inner}) v "
               "LEFT JOIN signal_reads r ON r.signal_id = v.id AND r.agent_id = ? "
               "LEFT JOIN signal_deliveries d ON d.signal_id = v.id AND d.agent_id = ? ORDER BY v.sequence")
        return self.conn.execute(sql, [*args, agent_id, agent_id]).fetchall()

    def count_visible(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, below=None, cap=1000):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered, below)
        return int(self.conn.execute(f"SELECT count(*) FROM ({inner} LIMIT ?)", [*args, cap]).fetchone()[0])

    def first_visible_sequence(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        # ORDER BY + LIMIT merges the ordered branches and stops at once; min() would read them all
        row = self.conn.execute(f"{inner} ORDER BY sequence LIMIT 1", args).fetchone()
        return int(row["sequence"]) if row is not None else None

    def latest_visible_sequence(self, agent_id):
        lo, hi = _family(agent_id)
        family = self._family_recipients(agent_id)
        senders = self._broadcast_senders(agent_id)
        if senders is None:
            queries = [("SELECT sequence FROM signals WHERE recipient = '*' AND sender != ? "
                        "AND NOT (sender > ? AND sender < ?) ORDER BY sequence DESC LIMIT 1", (agent_id, lo, hi))]
        else:
            queries = [("SELECT max(sequence) FROM signals INDEXED BY signals_broadcasts_by_sender "
                        "WHERE recipient = '*' AND sender = ?", (who,)) for who in senders]
        queries += [("SELECT max(sequence) FROM signals WHERE recipient = ?", (who,))
                    for who in [agent_id, *(family or [])]]
        if family is None:
            queries.append(("SELECT max(sequence) FROM signals INDEXED BY signals_by_recipient "
                            "WHERE recipient > ? AND recipient < ?", (lo, hi)))
        best = 0
        for sql, args in queries:
            row = self.conn.execute(sql, args).fetchone()
            if row is not None and row[0] is not None:
                best = max(best, int(row[0]))
        return best

    def hook_redeliveries(self, agent_id, max_offers, cutoff):
        return self.conn.execute(
            f"SELECT {_COLS}, d.offers FROM signal_deliveries d JOIN signals s ON s.id = d.signal_id "
            "WHERE d.agent_id = ? AND d.delivery_method = 'hook' AND d.offers < ? AND d.last_offered_at <= ?"
            + _UNREAD + " ORDER BY s.sequence", (agent_id, max_offers, cutoff, agent_id)).fetchall()

    def add_deliveries(self, agent_id, signal_ids, stamp, method):
        self.conn.executemany("INSERT INTO signal_deliveries (signal_id, agent_id, delivered_at, delivery_method, "
                              "offers, last_offered_at) VALUES (?, ?, ?, ?, 1, ?)",
                              [(i, agent_id, stamp, method, stamp) for i in signal_ids])

    def reoffer(self, agent_id, signal_ids, stamp):
        self.conn.executemany("UPDATE signal_deliveries SET offers = offers + 1, last_offered_at = ? "
                              "WHERE signal_id = ? AND agent_id = ?", [(stamp, i, agent_id) for i in signal_ids])

    def add_reads(self, agent_id, signal_ids, stamp):
        self.conn.executemany("INSERT OR IGNORE INTO signal_reads (signal_id, agent_id, read_at) VALUES (?, ?, ?)",
                              [(i, agent_id, stamp) for i in signal_ids])

    # -- the rate limit ------------------------------------------------------------------------------
    def rate_bucket(self, agent_id):
        return self.conn.execute("SELECT tokens, updated_at FROM rate_buckets WHERE agent_id = ?",
                                 (agent_id,)).fetchone()

    def set_rate_bucket(self, agent_id, tokens, updated_at):
        self.conn.execute("INSERT INTO rate_buckets (agent_id, tokens, updated_at) VALUES (?, ?, ?) "
                          "ON CONFLICT(agent_id) DO UPDATE SET tokens = excluded.tokens, "
                          "updated_at = excluded.updated_at", (agent_id, tokens, updated_at))

    # -- the whiteboard ------------------------------------------------------------------------------
    def whiteboard_set(self, key, value, agent_id, stamp):
        self.conn.execute("INSERT INTO session_state (key, value, updated_by, updated_at) VALUES (?, ?, ?, ?) "
                          "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_by = excluded.updated_by, "
                          "updated_at = excluded.updated_at", (key, value, agent_id, stamp))

    def whiteboard_get(self, key):
        return self.conn.execute("SELECT * FROM session_state WHERE key = ?", (key,)).fetchone()

    def whiteboard_all(self):
        return self.conn.execute("SELECT * FROM session_state ORDER BY key").fetchall()

    # -- staged memories -----------------------------------------------------------------------------
    def stage_memory(self, memory_id, agent_id, data, stamp):
        cursor = self.conn.execute("INSERT OR IGNORE INTO staged_memories (id, agent_id, memory_data, created_at) "
                                   "VALUES (?, ?, ?, ?)", (memory_id, agent_id, data, stamp))
        return cursor.rowcount > 0

    def staged_memories(self):
        return self.conn.execute("SELECT id, agent_id, memory_data, created_at FROM staged_memories "
                                 "ORDER BY created_at, rowid").fetchall()

    def unstage(self, memory_ids):
        self.conn.executemany("DELETE FROM staged_memories WHERE id = ?", [(i,) for i in memory_ids])

    def count_staged(self):
        return int(self.conn.execute("SELECT COUNT(*) FROM staged_memories").fetchone()[0])

    # -- idempotency keys ----------------------------------------------------------------------------
    def signal_by_key(self, sender, key):
        return self.conn.execute(f"SELECT {_COLS} FROM signals s WHERE s.sender = ? AND s.idempotency_key = ?",
                                 (sender, key)).fetchone()

    def remember_note(self, agent_id, key, record, stamp):
        """A note's key (its line is in notes.jsonl, outside this database): KeyTaken when stored already."""
        import json

        cursor = self.conn.execute("INSERT INTO note_keys (agent_id, key, note, created_at) VALUES (?, ?, ?, ?) "
                                   "ON CONFLICT DO NOTHING", (agent_id, key, json.dumps(record, ensure_ascii=False),
                                                              stamp))
        if cursor.rowcount == 0:
            raise base.KeyTaken(key)

    def note_by_key(self, agent_id, key):
        import json

        row = self.conn.execute("SELECT note FROM note_keys WHERE agent_id = ? AND key = ?", (agent_id, key)).fetchone()
        return None if row is None else json.loads(row["note"])


class SessionStore(base.SessionStore):
    """An open connection to one session's database; use `write()` and `read()` for transactions."""

    def __init__(self, path: str | os.PathLike, session_id: str, busy_timeout_ms: int):
        self.path = os.fspath(path)  # a str: the hot paths never load pathlib (paths.StateFiles)
        self.session_id = session_id
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = _thread.RLock()  # what threading.RLock() builds, without importing threading
        self._wrote = False
        self._changes = changes_path(self.path)  # worked out once, not on every write transaction
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
                # said whole: a plain `start` keeps choosing a session whose database was removed, and the
                # way on is a new session
                raise NotFoundError(f"unknown session {session_id!r}: no {path} (its database is gone: "
                                    "`synapolis start --new-session` begins another)")
            create_private(path)
        store = cls(path, session_id, int(ws.config.busy_timeout_ms))
        try:
            store._prepare()
        except BaseException:
            store.close()
            raise
        return store

    def _prepare(self) -> None:
        # WAL commits are durable against a killed process without an fsync per commit; a power cut may
        # lose the newest transactions (documented in docs/SIGNALS.md).
        version = self._pragma("PRAGMA foreign_keys = ON", "PRAGMA synchronous = NORMAL", "PRAGMA user_version")[0]
        if version >= SCHEMA_VERSION:
            return
        if version >= 1:
            make_private(self.path)  # a store an older synapolis made, maybe readable by everyone
        mode = self._pragma("PRAGMA journal_mode = WAL")[0]
        if str(mode).lower() != "wal":
            raise InternalError(f"session store {self.path} cannot use WAL mode (got {mode})")
        migrating = version == 1
        if migrating:
            # the clear tokens the update below replaces must not linger in freed space of the file
            self._pragma("PRAGMA secure_delete = ON")
        with self.write() as tx:
            conn = tx.conn
            # re-checked under the write lock: a racing creator may have done it already
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version < 1:
                for statement in _statements(_SCHEMA):
                    conn.execute(statement)
            if version < 2:
                _hash_clear_tokens(conn)
            if version < 4:
                conn.execute(_BROADCASTS_INDEX)
                has_key = any(row[1] == "idempotency_key" for row in conn.execute("PRAGMA table_info(signals)"))
                for statement in _statements(_IDEMPOTENCY_SCHEMA):
                    if not (has_key and statement.lstrip().startswith("ALTER TABLE")):
                        conn.execute(statement)  # (has_key: a store marked older than it is)
            if version < 5:
                conn.execute(_LIVENESS_INDEX)
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if migrating:
            # nor in the pages the WAL has not yet copied over them: copy now (best effort: a busy store
            # is checkpointed by a later writer, and the files are private by now either way)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                conn.execute("PRAGMA secure_delete = OFF")
            except sqlite3.Error:
                pass

    def _pragma(self, *statements: str):
        """Run `statements` in turn and answer the last one's first row; sqlite3's errors as ours (`_raise`)."""
        try:
            for statement in statements:
                row = self._conn.execute(statement).fetchone()
            return row
        except sqlite3.Error as exc:
            self._raise(exc)

    # -- transactions ---------------------------------------------------------------------------

    def _raise(self, exc: BaseException):
        """Raise `exc` as a synapolis error: locked past the timeout -> BusyError (exit 8), another sqlite3
        error InternalError; an IntegrityError, or anything that is not sqlite3's, as it is."""
        if isinstance(exc, sqlite3.OperationalError):
            if _is_busy(exc):
                raise BusyError(f"session store {self.path} stayed locked past busy_timeout_ms="
                                f"{self.busy_timeout_ms}: another process holds a write transaction") from None
            raise InternalError(f"session store {self.path}: {exc}") from None
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.IntegrityError):
            raise InternalError(f"session store {self.path} is damaged or not a database: {exc}") from None
        raise exc

    def write(self) -> "_InTransaction":
        """A `BEGIN IMMEDIATE` transaction: committed on success, rolled back on any error."""
        return _InTransaction(self, writes=True)

    def read(self) -> "_InTransaction":
        """A read transaction: one consistent snapshot for every query in the body."""
        return _InTransaction(self, writes=False)

    def close(self) -> None:
        try:
            if self._wrote:
                self._trim_wal()
            self._conn.close()
        except sqlite3.Error:
            pass

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


def _quietly(conn, statement: str) -> None:
    """Run `statement` (a ROLLBACK, a read's COMMIT) where its failure changes nothing for the caller."""
    try:
        conn.execute(statement)
    except sqlite3.Error:
        pass


class _InTransaction:
    """`store.write()` / `store.read()`: the store's lock and BEGIN IMMEDIATE (a write) or BEGIN (a read); on
    leaving, a write commits, or rolls back after an error (or when its COMMIT fails), and a read commits
    either way. sqlite3's errors, the body's too, are raised as synapolis errors (SessionStore._raise).
    A class, as atomic.locked: contextlib stays off the hot verbs' imports."""

    __slots__ = ("store", "writes")

    def __init__(self, store: SessionStore, writes: bool):
        self.store, self.writes = store, writes

    def __enter__(self) -> SqliteTransaction:
        store = self.store
        store._lock.acquire()
        try:
            store._conn.execute("BEGIN IMMEDIATE" if self.writes else "BEGIN")
        except BaseException as exc:
            store._lock.release()
            store._raise(exc)
        if not self.writes:
            return SqliteTransaction(store._conn, store.session_id)
        store._wrote = True
        return SqliteTransaction(store._conn, store.session_id, store._changes)

    def __exit__(self, kind, value, traceback) -> None:
        store = self.store
        try:
            if kind is None and self.writes:
                try:
                    store._conn.execute("COMMIT")
                except BaseException as exc:
                    _quietly(store._conn, "ROLLBACK")
                    store._raise(exc)
            else:
                _quietly(store._conn, "ROLLBACK" if self.writes else "COMMIT")
        finally:
            store._lock.release()
        if kind is not None and issubclass(kind, sqlite3.Error):
            store._raise(value)


class SqliteStore(base.Store):
    """The embedded default: one session.db per session, session.json beside it, the rest in files."""

    kind = "sqlite"

    def __init__(self, ws):
        self.ws = ws

    def open_session(self, session_id: str, create: bool = False) -> SessionStore:
        return SessionStore.open(self.ws, session_id, create=create)

    def note_appender(self, session_id):
        from ..board import note_appender

        # notes.jsonl under its lock; a note whose transaction fails is taken back (board.note_appender)
        return note_appender(self.ws, session_id)

    def read_notes(self, session_id, limit):
        from ..board import read_notes

        return read_notes(self.ws, session_id, limit)

    def notes_version(self, session_id):
        try:
            return os.stat(self.ws.files.session_notes(session_id)).st_size  # the bus grows by appends only
        except OSError:
            return 0

    def append_ledger(self, tx, merged, *, session_id, merged_by, reader=None):
        from ..sleep import append_to_ledger

        # the file, under its own lock; a crash before the database commits is made safe by skipping
        # what the ledger holds on the retry (sleep.consolidate)
        return append_to_ledger(self.ws.paths, merged, session_id=session_id, merged_by=merged_by, reader=reader)

    def read_ledger(self):
        from ..sleep import read_ledger

        return read_ledger(self.ws.paths)

    def ledger_location(self):
        return str(self.ws.paths.memory_ledger)

    def session_signature(self, session_id: str):
        try:
            st = os.stat(self.ws.files.session_db(session_id))
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def session_exists(self, session_id: str) -> bool:
        return os.path.exists(self.ws.files.session_json(session_id))

    def create_session(self, session_id: str, created_at: str) -> bool:
        from ..atomic import atomic_write_json, locked

        path = self.ws.files.session_json(session_id)
        with locked(self.ws.paths.lock(f"session.{session_id}")):
            SessionStore.open(self.ws, session_id, create=True).close()
            if os.path.exists(path):
                return False
            atomic_write_json(path, {"session_id": session_id, "status": "active",
                                     "created_at": created_at, "ended_at": None})
        return True

    def read_session(self, session_id: str) -> dict:
        from ..atomic import read_json

        path = self.ws.files.session_json(session_id)  # a str: hooks read this on every call, without pathlib
        try:
            document = read_json(path)
        except FileNotFoundError:
            raise NotFoundError(f"unknown session {session_id!r}") from None
        except (OSError, ValueError) as exc:
            raise NotFoundError(f"session {session_id!r} has an unreadable session.json ({exc})") from None
        if not isinstance(document, dict):
            raise NotFoundError(f"session {session_id!r} has a malformed session.json")
        named = document.get("session_id")
        if isinstance(named, str) and named != session_id:
            # a session is its folder: a copy of one (`cp -a sessions/S sessions/S.bak`) still says S, and
            # counting it as S would list S twice and make every `start` ambiguous
            raise NotFoundError(f"session {session_id!r} has a session.json naming another session {named!r}")
        return document

    def list_sessions(self) -> list[dict]:
        from ..atomic import is_temp_name
        from ..errors import UsageError

        folder = self.ws.files.sessions  # plain strings: a beat that names no session looks here, without pathlib
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for name in names:
            # a session id may start with a dot (§2): only temp names and what is not a folder are skipped
            if is_temp_name(name) or not os.path.isdir(os.path.join(folder, name)):
                continue
            try:
                document = self.read_session(name)
            except (NotFoundError, UsageError):  # a stray folder or broken file is simply not a session
                continue
            found.append(document)
        return found

    def set_session_status(self, session_id: str, status: str, stamp: str) -> dict:
        from ..atomic import atomic_write_json, locked

        with locked(self.ws.paths.lock(f"session.{session_id}")):
            document = self.read_session(session_id)
            document["status"] = status
            if status == "ended":
                document["ended_at"] = stamp
            else:
                document["ended_at"] = None
                document["reopened_at"] = stamp
            atomic_write_json(self.ws.files.session_json(session_id), document)
        return document
