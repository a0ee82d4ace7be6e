"""The SQLite store's signals: storing and sending them, who sees which, and their deliveries and reads."""

from __future__ import annotations

import os
import sqlite3

from ...atomic import bump_counter, read_counter
from ...errors import InternalError
from ...names import id_chain
from .. import base
from .audience import AudienceCache

_INSERT_SIGNAL = ("INSERT INTO signals (id, timestamp, sender, recipient, type, content, lamport, reply_to, "
                  "idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
# The caller's part of a send, one statement on its registry row (schema 6): its token bucket refilled at
# `rate / 60` a second up to `rate` (NULL: full) and one token spent, signals.take_token's arithmetic in the same
# IEEE doubles, and its Lamport clock raised by one, the value the signal carries. No row back: no such agent, or
# fewer than one token (the WHERE kept the update out, nothing written). Parameters: rate, moment, rate / 60, id.
_SPEND_AND_TICK = ("UPDATE agents SET tokens = min(?1, coalesce(tokens + max(0.0, ?2 - bucket_at) * ?3, ?1)) - 1.0, "
                   "bucket_at = ?2, lamport = lamport + 1 "
                   "WHERE id = ?4 AND min(?1, coalesce(tokens + max(0.0, ?2 - bucket_at) * ?3, ?1)) >= 1.0 "
                   "RETURNING lamport")
_TICK = "UPDATE agents SET lamport = lamport + 1 WHERE id = ? RETURNING lamport"  # unlimited, or a retry's
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


class SqliteSignalTransaction(base.Transaction):
    """A transaction on one session.db: its connection and its signals (SqliteTransaction adds the rest).
    `execute`/`executemany` reach the connection itself (tests and tools that inspect the SQLite file; the
    protocol code uses only the interface)."""

    __slots__ = ("conn", "session_id", "changes", "_senders", "audiences", "_ticked")

    def __init__(self, conn, session_id: str, changes: str | None = None, audiences: AudienceCache | None = None):
        self.conn = conn
        self.session_id = session_id
        self.changes = changes  # the session's change counter (changes_path); None in a read transaction
        self._senders = {}  # _broadcast_senders by reader, for this transaction (an insert forgets them)
        self.audiences = audiences  # the connection's kept broadcast audience (SessionStore), or None
        self._ticked = None  # (caller, lamport) of a send whose id was stored already: its retry's value

    def execute(self, sql, args=()):
        return self.conn.execute(sql, args)

    def executemany(self, sql, rows):
        return self.conn.executemany(sql, rows)

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
        heard = rows = None
        audiences = self.audiences
        unchanged = conn.total_changes  # before this send writes: the kept audience's mark, if it still holds
        # plain tuples, not sqlite3.Row, for every row read here: what signals.audience reads as it is
        cursor = conn.cursor()
        cursor.row_factory = None
        if candidates is None:
            # a broadcast (always with `window`: judges_audience) reaches everyone but the sender's chain
            heard = (audiences or AudienceCache()).audience(cursor, id_chain(signal["sender"]), window)
            unchanged = conn.total_changes
        else:
            rows = cursor.execute("SELECT id, status, last_heartbeat FROM agents WHERE id IN "
                                  f"({','.join('?' * len(candidates))}) ORDER BY id", candidates).fetchall()
            if not rows:
                return {"refused": "recipient"}
        if caller is None:
            lamport = self.max_lamport() + 1
        elif self._ticked is not None and self._ticked[0] == caller:
            lamport = self._ticked[1]  # the retry of a send whose id was stored: its clock went up already
        else:
            if rate is None:
                ticked = cursor.execute(_TICK, (caller,)).fetchone()
            elif rate >= 1.0:  # a smaller rate never holds a whole token (the config's is a whole number >= 1)
                ticked = cursor.execute(_SPEND_AND_TICK, (rate, moment, rate / 60.0, caller)).fetchone()
            else:
                ticked = None
            if ticked is None:
                if self.agent(caller) is None:
                    return {"refused": "caller"}
                row = self.rate_bucket(caller)
                tokens = rate if row is None else min(rate, row["tokens"] + max(0.0, moment - row["updated_at"])
                                                      * rate / 60.0)
                return {"refused": "rate", "tokens": tokens}
            lamport = ticked[0]
        signal["lamport"] = lamport  # (the caller's own row, made for this attempt)
        sequence = self.insert_signal(signal)  # (the caller's clock is at `lamport` already)
        self._ticked = (caller, lamport) if sequence is None and caller is not None else None
        if audiences is not None:
            audiences.sent(unchanged, conn.total_changes)
        return {"sequence": sequence, "lamport": lamport, "rows": rows, "audience": heard}

    def _count_change(self) -> None:
        """Bump the change counter before the commit, under the write lock: whoever reads the counter and then
        takes the lock sees this change (or its rollback). A hook skips the store while it is unchanged
        (synapolis.harness.quiet), so a counter that cannot be bumped must not stay readable either. No
        counter yet means no hook remembers one (change_mark makes it, under this same lock): nothing to do,
        and a session without hooks pays nothing."""
        if not os.access(self.changes, os.F_OK):
            # no counter (the usual case without hooks): a check that raises nothing, where a failed open builds
            # an exception on every send; it cannot appear meanwhile: it is made under the write lock we hold
            return
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
