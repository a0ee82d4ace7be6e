"""The PostgreSQL store's signals: storing and sending them, who sees which, and their deliveries and reads."""

from __future__ import annotations

import json

from ...names import id_chain
from .. import base
from .audience import PostgresAudience
from .driver import _LOCK, _TRY_LOCK, NOTIFY_CHANNEL, _execute_send, _key, _key_taken, _text_array, psycopg

_COLS = "s.sequence, s.id, s.timestamp, s.sender, s.recipient, s.type, s.content, s.lamport, s.reply_to"
_UNREAD = (" AND NOT EXISTS (SELECT 1 FROM signal_reads r WHERE r.session_id = s.session_id "
           "AND r.signal_id = s.id AND r.agent_id = %s)")
_UNDELIVERED = (" AND NOT EXISTS (SELECT 1 FROM signal_deliveries d WHERE d.session_id = s.session_id "
                "AND d.signal_id = s.id AND d.agent_id = %s)")


def _family(agent_id: str) -> tuple[str, str]:
    return agent_id + ".", agent_id + "/"


# The distinct senders of the session's broadcasts, one index seek each (signals_by_sender), past a reader's
# sub-agents in one seek: an inbox then reads each other sender's broadcasts as an index range in sequence
# order, and never the reader's own family's, which it does not see (issue 31)
_BROADCAST_SENDERS = (
    "WITH RECURSIVE b(sender) AS ((SELECT sender FROM signals WHERE session_id = %(session)s AND recipient = '*' "
    "ORDER BY sender LIMIT 1) UNION ALL SELECT (SELECT s.sender FROM signals s WHERE s.session_id = %(session)s "
    "AND s.recipient = '*' AND s.sender > CASE WHEN b.sender > %(lo)s AND b.sender < %(hi)s THEN %(hi)s "
    "ELSE b.sender END ORDER BY s.sender LIMIT 1) FROM b WHERE b.sender IS NOT NULL) "
    "SELECT sender FROM b WHERE sender IS NOT NULL LIMIT %(cap)s")


class PostgresSignalTransaction(base.Transaction):
    """A transaction on one session's rows: its cursor, its locks and its signals (PostgresTransaction adds
    the rest)."""

    offers_send_signal = True

    def __init__(self, cur, session_id: str, writing: bool, store=None):
        self.cur = cur
        self.session_id = session_id
        self.writing = writing
        self.store = store  # the PostgresSessionStore, which keeps a broadcast's audience (audience.py), or None
        self._horizon = None
        self._reserved = None  # a sequence number drawn by an insert whose id was stored already
        self._senders = {}  # _broadcast_senders by reader, for this transaction (an insert forgets them)

    def _all(self, sql, args=()):
        self.cur.execute(sql, args)
        return self.cur.fetchall()

    def _one(self, sql, args=()):
        self.cur.execute(sql, args)
        return self.cur.fetchone()

    # -- locking -----------------------------------------------------------------------------------
    def exclusive(self, topic):
        self.cur.execute(_LOCK, (_key(self.session_id, topic),))

    def try_exclusive(self, topic):
        return bool(self._one(_TRY_LOCK, (_key(self.session_id, topic),))["got"])

    # -- signals -----------------------------------------------------------------------------------
    def max_sequence(self):
        """The horizon: fixed at the first signal query of the transaction. Inserts hold the session's
        insert lock from drawing a number to committing, so every sequence up to it is committed."""
        if self._horizon is None:
            row = self._one("SELECT COALESCE(max(sequence), 0) AS m FROM signals WHERE session_id = %s",
                            (self.session_id,))
            self._horizon = int(row["m"])
        return self._horizon

    def max_lamport(self):
        row = self._one("SELECT COALESCE(max(lamport), 0) AS m FROM signals WHERE session_id = %s",
                        (self.session_id,))
        return int(row["m"])

    def insert_signal(self, signal, caller=None):
        # the session's insert lock first, held to commit, and only then the sequence: sequence order is
        # commit order (see the module doc). One statement: the lock's row feeds the INSERT, so the lock
        # is taken before nextval() runs. A stored id is found by the unique index itself (ON CONFLICT), not
        # by a planned lookup (docs/STORE.md, "Round trips"); the number such an attempt drew is kept and the
        # retry (signals.send: the next microsecond's id, this transaction, this lock) inserts with it, so a
        # duplicate leaves no gap.
        reserved, self._reserved = self._reserved, None
        columns = "session_id, id, timestamp, sender, recipient, type, content, lamport, reply_to, idempotency_key"
        if reserved is None:
            into, values = f"({columns})", ""
        else:
            into, values = f"(sequence, {columns}) OVERRIDING SYSTEM VALUE", "%s::int8, "
        try:
            row = self._one(
                "WITH locked AS (SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))), "
                f"stored AS (INSERT INTO signals {into} SELECT {values}%s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
                "FROM locked ON CONFLICT (session_id, id) DO NOTHING RETURNING sequence), "
                "clock AS (UPDATE agents SET lamport = %s WHERE session_id = %s AND id = %s AND lamport < %s) "
                "SELECT s.sequence, CASE WHEN s.sequence IS NULL THEN "
                "currval(pg_get_serial_sequence('signals', 'sequence')) END AS drawn, "
                "CASE WHEN s.sequence IS NOT NULL THEN pg_notify(%s, %s) END AS notified "
                # the LEFT JOIN gives a row either way, read after the INSERT ran (so currval has its number)
                "FROM (SELECT 1) AS one LEFT JOIN stored s ON true",
                (_key(self.session_id, "signals"), *([] if reserved is None else [reserved]), self.session_id,
                 signal["id"], signal["timestamp"], signal["sender"], signal["recipient"], signal["type"],
                 signal["content"], signal["lamport"], signal["reply_to"], signal.get("idempotency_key"),
                 signal["lamport"], self.session_id, caller, signal["lamport"], NOTIFY_CHANNEL, self.session_id))
        except psycopg.Error as exc:
            _key_taken(exc, "signals_by_key", signal.get("idempotency_key"))  # this sender stored it already
            raise
        if row["sequence"] is None:
            self._reserved = reserved if reserved is not None else int(row["drawn"])
            return None  # that id is stored already
        sequence = int(row["sequence"])
        self._senders.clear()
        if self._horizon is not None:
            self._horizon = max(self._horizon, sequence)  # our own insert is ours to see
        return sequence

    judges_audience = True  # send_signal takes the live window and answers a broadcast's audience itself

    def send_signal(self, signal, *, caller, candidates, rate, moment, window=None):
        key = signal.get("idempotency_key")
        cutoff, ceiling = window if window is not None else (None, None)
        store = self.store
        kept = store.audience if store is not None and candidates is None else None  # (a broadcast: `window`)
        epoch = kept.epoch_for(window) if kept is not None else None
        try:
            sent = _execute_send(
                self.cur.connection,
                (self.session_id, signal["id"], signal["timestamp"], signal["sender"], signal["recipient"],
                 signal["type"], signal["content"], caller, _text_array(candidates), rate, moment,
                 _key(self.session_id, "signals"), NOTIFY_CHANNEL, self._reserved, key, cutoff, ceiling, epoch))
        except psycopg.Error as exc:
            _key_taken(exc, "signals_by_key", key)
            raise
        out = json.loads(sent)
        # an id stored already: signals.send retries with the next microsecond's id, which takes the number
        # this attempt drew (see synapolis_send)
        self._reserved = out.get("reserved")
        self._senders.clear()
        if out.get("sequence") is not None and self._horizon is not None:
            self._horizon = max(self._horizon, int(out["sequence"]))  # our own insert is ours to see
        if out.get("epoch") is not None:  # judged by the function: signals.audience's answer
            if out["waiting"] is not None:  # read: kept for the next broadcast
                kept = PostgresAudience(out["epoch"], window, out["live"].split("\n") if out["live"] else [],
                                        out["leaves"], out["top"], [tuple(row) for row in out["waiting"]])
                # unless this transaction changed the registry (not committed: another thread's broadcast must
                # not answer from it)
                if store is not None and not out["moved"]:
                    store.audience = kept
            # (else the session's epoch is still `epoch`: what is kept holds)
            out["audience"] = kept.answer(id_chain(signal["sender"]))
        return out

    def recent_signals(self, limit):
        return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s ORDER BY s.sequence DESC LIMIT %s",
                         (self.session_id, int(limit)))

    def find_signals(self, ref, limit=100):
        if len(ref) == 64:
            return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.id = %s",
                             (self.session_id, ref))
        return self._all(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.id >= %s AND s.id < %s "
                         "ORDER BY s.id LIMIT %s", (self.session_id, ref, ref + "g", limit))

    MAX_BROADCAST_SEEKS = 64  # senders of broadcasts served by one branch each; more: one walk of them all

    def _broadcast_senders(self, agent_id):
        """The senders of broadcasts the reader sees (all but itself and its sub-agents) up to the horizon, or
        None past MAX_BROADCAST_SEEKS. Taken after the horizon is fixed: every broadcast below it is committed."""
        if agent_id not in self._senders:
            lo, hi = _family(agent_id)
            rows = self._all(_BROADCAST_SENDERS, {"session": self.session_id, "lo": lo, "hi": hi,
                                                  "cap": self.MAX_BROADCAST_SEEKS + 3})
            found = [r["sender"] for r in rows if r["sender"] != agent_id and not lo < r["sender"] < hi]
            self._senders[agent_id] = found if len(found) <= self.MAX_BROADCAST_SEEKS else None
        return self._senders[agent_id]

    def _visible_select(self, agent_id, bfloor, dfloor, unread, undelivered):
        lo, hi = _family(agent_id)
        top = self.max_sequence()
        senders = self._broadcast_senders(agent_id)
        extra, extra_args = "", []
        if unread:
            extra, extra_args = extra + _UNREAD, extra_args + [agent_id]
        if undelivered:
            extra, extra_args = extra + _UNDELIVERED, extra_args + [agent_id]
        if senders is None:  # many senders: the reader's own broadcasts are then a small share of them all
            branches = [("s.recipient = '*' AND s.sequence > %s AND s.sender <> %s AND NOT (s.sender > %s AND "
                         "s.sender < %s)", [bfloor, agent_id, lo, hi])]
        else:
            branches = [("s.recipient = '*' AND s.sender = %s AND s.sequence > %s", [who, bfloor]) for who in senders]
        branches += [
            ("s.recipient = %s AND s.sequence > %s", [agent_id, dfloor]),
            ("s.recipient > %s AND s.recipient < %s AND s.sequence > %s", [lo, hi, dfloor]),
        ]
        sql, args = [], []
        for where, params in branches:
            sql.append(f"SELECT {_COLS} FROM signals s WHERE s.session_id = %s AND s.sequence <= %s AND {where}{extra}")
            args += [self.session_id, top] + params + extra_args
        return " UNION ALL ".join(f"({q})" for q in sql), args

    def visible_signals(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, newest_first=False,
                        limit=None, reader_fields=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        inner += f" ORDER BY sequence {'DESC' if newest_first else 'ASC'}"
        if limit is not None:
            inner += " LIMIT %s"
            args.append(min(int(limit), 2 ** 63 - 1))
        if not reader_fields:
            rows = self._all(inner, args)
            return rows[::-1] if newest_first else rows
        sql = (f"SELECT v.*, r.read_at, d.delivered_at, d.delivery_method FROM ({inner}) v "
               "LEFT JOIN signal_reads r ON r.session_id = %s AND r.signal_id = v.id AND r.agent_id = %s "
               "LEFT JOIN signal_deliveries d ON d.session_id = %s AND d.signal_id = v.id AND d.agent_id = %s "
               "ORDER BY v.sequence")
        return self._all(sql, [*args, self.session_id, agent_id, self.session_id, agent_id])

    def count_visible(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False, below=None, cap=1000):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        where = ""
        if below is not None:
            where, args = " WHERE v.sequence < %s", [*args, below]
        row = self._one(f"SELECT count(*) AS n FROM (SELECT 1 FROM ({inner}) v{where} LIMIT %s) c", [*args, cap])
        return int(row["n"])

    def first_visible_sequence(self, agent_id, bfloor, dfloor, *, unread=False, undelivered=False):
        inner, args = self._visible_select(agent_id, bfloor, dfloor, unread, undelivered)
        row = self._one(f"SELECT min(sequence) AS m FROM ({inner}) v", args)
        return int(row["m"]) if row and row["m"] is not None else None

    def latest_visible_sequence(self, agent_id):
        inner, args = self._visible_select(agent_id, 0, 0, False, False)
        row = self._one(f"SELECT max(sequence) AS m FROM ({inner}) v", args)
        return int(row["m"]) if row and row["m"] is not None else 0

    def hook_redeliveries(self, agent_id, max_offers, cutoff):
        return self._all(
            f"SELECT {_COLS}, d.offers FROM signal_deliveries d JOIN signals s "
            "ON s.session_id = d.session_id AND s.id = d.signal_id "
            "WHERE d.session_id = %s AND d.agent_id = %s AND d.delivery_method = 'hook' AND d.offers < %s "
            "AND d.last_offered_at <= %s" + _UNREAD + " ORDER BY s.sequence",
            (self.session_id, agent_id, max_offers, cutoff, agent_id))

    def add_deliveries(self, agent_id, signal_ids, stamp, method):
        self.cur.executemany("INSERT INTO signal_deliveries (session_id, signal_id, agent_id, delivered_at, "
                             "delivery_method, offers, last_offered_at) VALUES (%s, %s, %s, %s, %s, 1, %s)",
                             [(self.session_id, i, agent_id, stamp, method, stamp) for i in signal_ids])

    def reoffer(self, agent_id, signal_ids, stamp):
        self.cur.execute("UPDATE signal_deliveries SET offers = offers + 1, last_offered_at = %s "
                         "WHERE session_id = %s AND agent_id = %s AND signal_id = ANY(%s)",
                         (stamp, self.session_id, agent_id, list(signal_ids)))

    def add_reads(self, agent_id, signal_ids, stamp):
        self.cur.executemany("INSERT INTO signal_reads (session_id, signal_id, agent_id, read_at) "
                             "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                             [(self.session_id, i, agent_id, stamp) for i in signal_ids])
