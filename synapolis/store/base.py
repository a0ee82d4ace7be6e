"""The store interface: every operation the protocol performs on shared state, and nothing else.

Modelled on httpx's transports: one interface here, one implementation per backend beside it
(`local/`, the embedded default: SQLite and the state directory's files; `postgres/`, one database
shared by many machines). The
protocol's decisions (visibility, audience, Lamport values, the token bucket, the memory merge)
are pure functions in signals.py, sessions.py and sleep.py; they call these methods inside the
transaction a verb holds, so a drain marks exactly what it returns in the same transaction.

Rows handed back are mappings (`row["id"]`, `row.keys()`, `dict(row)`). Timestamps are the
fixed-width RFC 3339 strings of `sessions.ts()` on both stores, so comparing them as text
orders them in time.
"""

from __future__ import annotations

import abc

from ..timeutil import utcnow


class Transaction(abc.ABC):
    """One open transaction on one session's shared state (`SessionStore.write()` / `.read()`)."""

    session_id: str

    # -- locking -----------------------------------------------------------------------------------
    def exclusive(self, topic: str) -> None:
        """Serialise this transaction with every other one that asks for `topic` in this session
        (the consensus count of `tired`). SQLite's write transactions are exclusive already."""

    def try_exclusive(self, topic: str) -> bool:
        """Like `exclusive`, without waiting: False when another transaction holds `topic` now."""
        return True

    def change_mark(self) -> str | None:
        """In a write transaction: a text that changes whenever a signal is inserted or an agent registered or
        restarted in this session, readable without opening the store (a hook's quiet path); None when this
        store keeps no such mark."""
        return None

    # -- the registry (EP-0118 `agents`) ------------------------------------------------------------
    @abc.abstractmethod
    def agent(self, agent_id: str):
        """The registry row of `agent_id`, or None."""

    @abc.abstractmethod
    def agents(self, ids=None) -> list:
        """Registry rows ordered by id: all of them, or those whose id is in `ids`."""

    @abc.abstractmethod
    def register_agent(self, agent_id: str, *, harness: str, substrate: str, stamp: str, run_token: str) -> None:
        """A new registry row, `active` and fresh; signals stored before it are its history. `run_token`
        is what is kept of the agent's token: its hash (store/run_tokens.py `hash_token`), never the token itself."""

    @abc.abstractmethod
    def restart_agent(self, agent_id: str, *, harness: str, substrate: str, stamp: str, run_token: str) -> None:
        """An existing row taken back or over: active, fresh, with this token."""

    @abc.abstractmethod
    def refresh_agent(self, agent_id: str, stamp: str, status: str) -> None:
        """The agent was heard from at `stamp` with registry status `status`."""

    @abc.abstractmethod
    def count_live(self, cutoff: str, exclude: str | None = None, *, ceiling: str) -> int:
        """Agents `active` with a last_heartbeat at or after `cutoff` and at or before `ceiling`, other
        than `exclude` (status.registry_window: a stamp beyond the clock skew is no evidence of life)."""

    @abc.abstractmethod
    def flag_stale(self, cutoff: str, *, ceiling: str) -> list:
        """Rows `active`/`idle` heard from before `cutoff`, or stamped after `ceiling`, become `stale`;
        returns (id, status, last_heartbeat) rows of what changed."""

    @abc.abstractmethod
    def raise_lamport(self, agent_id: str, value: int) -> None:
        """The agent's Lamport clock becomes `value` when it is lower."""

    @abc.abstractmethod
    def set_delivered_upto(self, agent_id: str, mark: int) -> None:
        """Raise the agent's delivered watermark to `mark`."""

    @abc.abstractmethod
    def set_read_upto(self, agent_id: str, mark: int) -> None:
        """Raise the agent's read watermark (and the delivered one with it) to `mark`."""

    # -- signals -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def max_sequence(self) -> int:
        """The highest sequence a reader may move a watermark to: every signal numbered up to it
        is committed and visible to this transaction (0 when none)."""

    @abc.abstractmethod
    def max_lamport(self) -> int:
        """The highest Lamport value of any stored signal (0 when none)."""

    @abc.abstractmethod
    def insert_signal(self, signal: dict, caller: str | None = None) -> int | None:
        """Store a signal (id, timestamp, sender, recipient, type, content, lamport, reply_to);
        returns its `sequence`, which orders it after every signal committed before it, or None
        (nothing stored) when a signal with that id exists already. The registered `caller` who sent
        it has its Lamport clock raised to the signal's value (one round trip on a server)."""

    # True where `send_signal` is offered; otherwise signals.send composes it from the operations above
    # (the SQLite store, where a call costs no round trip) and builds no row for it
    offers_send_signal = False

    judges_audience = False  # send_signal answers a broadcast's audience itself, given the live window

    def send_signal(self, signal: dict, *, caller: str | None, candidates: list | None, rate: float | None,
                    moment: float, window: tuple | None = None) -> dict | None:
        """Optional, for a store where round trips cost: `signals.send` in one call. Check the audience
        (`candidates`: the registered ids a directed signal may reach, None for a broadcast), check the
        registered `caller`, spend one token of its bucket (`rate` per minute at `moment`, epoch seconds;
        None: no limit), give `signal` the Lamport value above the caller's clock (or every stored signal's
        for the system sender) and store it as `insert_signal` does. Returns {"refused": "recipient" |
        "caller" | "rate", "tokens"} with nothing stored, or {"sequence" (None when that id is stored
        already), "lamport", "rows": the audience's registry rows, each with at least `id`, `status` and
        `last_heartbeat` (what `signals.audience` reads)}; where `judges_audience`, a broadcast given `window`
        (status.registry_window's cutoff and ceiling) answers "audience" (signals.audience's answer) instead of
        its rows. Called only where `offers_send_signal`."""
        raise NotImplementedError

    def signals_above(self, floor: int, limit: int) -> list | None:
        """Optional, for a store where a call costs no round trip: the newest signals numbered above `floor`
        (`sequence`, `sender`, `recipient`), newest first, at most `limit + 1` of them (so more than `limit`
        means "`limit` or more"). None: not offered (a drain then runs its inbox query at once). A drain
        that finds none of a few of them visible to its reader needs no inbox query (signals.drain_page)."""
        return None

    @abc.abstractmethod
    def recent_signals(self, limit: int) -> list:
        """The newest `limit` signals of the session, newest first, whoever they are for (the dashboard)."""

    @abc.abstractmethod
    def find_signals(self, ref: str, limit: int = 100) -> list:
        """Signals whose id is `ref` (64 hex) or starts with it (a prefix)."""

    @abc.abstractmethod
    def visible_signals(self, agent_id: str, bfloor: int, dfloor: int, *, unread: bool = False,
                        undelivered: bool = False, newest_first: bool = False, limit: int | None = None,
                        reader_fields: bool = False) -> list:
        """The signals `agent_id` sees (broadcasts from others after `bfloor`; to it or its sub-agents
        after `dfloor`), optionally only unread / never delivered to it, ordered by sequence and cut
        to `limit` from the chosen end; with `reader_fields`, each row also carries `read_at`,
        `delivered_at` and `delivery_method` for this reader. Returned oldest first."""

    def count_visible(self, agent_id: str, bfloor: int, dfloor: int, *, unread: bool = False,
                      undelivered: bool = False, below: int | None = None, cap: int = 1000) -> int:
        """How many signals `visible_signals` would return with these filters (and sequence < `below`),
        counted up to `cap`. This fallback reads them; a store should count in its query."""
        rows = self.visible_signals(agent_id, bfloor, dfloor, unread=unread, undelivered=undelivered)
        return min(cap, sum(1 for r in rows if below is None or r["sequence"] < below))

    @abc.abstractmethod
    def first_visible_sequence(self, agent_id: str, bfloor: int, dfloor: int, *, unread: bool = False,
                               undelivered: bool = False) -> int | None:
        """The lowest sequence `visible_signals` would return with these filters, or None."""

    @abc.abstractmethod
    def latest_visible_sequence(self, agent_id: str) -> int:
        """The newest sequence the reader can see, history included (0 when none)."""

    @abc.abstractmethod
    def hook_redeliveries(self, agent_id: str, max_offers: int, cutoff: str) -> list:
        """Signals a hook delivered to the agent, unread, offered fewer than `max_offers` times,
        last at or before `cutoff`; each row carries `offers`."""

    @abc.abstractmethod
    def add_deliveries(self, agent_id: str, signal_ids: list, stamp: str, method: str) -> None:
        """First delivery rows (SPEC-037), in the transaction that returns these signals."""

    @abc.abstractmethod
    def reoffer(self, agent_id: str, signal_ids: list, stamp: str) -> None:
        """A hook offered these signals again."""

    @abc.abstractmethod
    def add_reads(self, agent_id: str, signal_ids: list, stamp: str) -> None:
        """Mark signals read by the agent (already read ones stay as they were)."""

    # -- heartbeat copies -------------------------------------------------------------------------------
    def put_heartbeat(self, doc: dict, stamp: str) -> None:
        """A copy of the agent's latest heartbeat document, for readers on other machines (§12). The
        local file is always written first; SQLite stores nothing here (the file is the heartbeat)."""

    # -- the rate limit ----------------------------------------------------------------------------
    @abc.abstractmethod
    def rate_bucket(self, agent_id: str):
        """The sender's token bucket (`tokens`, `updated_at` in epoch seconds) or None; held for
        this transaction, so two sends of one agent cannot both spend one token."""

    @abc.abstractmethod
    def set_rate_bucket(self, agent_id: str, tokens: float, updated_at: float) -> None:
        """Store the sender's bucket."""

    # -- the whiteboard (EP-0118 `session_state`) -------------------------------------------------
    @abc.abstractmethod
    def whiteboard_set(self, key: str, value: str, agent_id: str, stamp: str) -> None:
        """Set one entry (last writer wins)."""

    @abc.abstractmethod
    def whiteboard_get(self, key: str):
        """One entry's row (key, value, updated_by, updated_at), or None."""

    @abc.abstractmethod
    def whiteboard_all(self) -> list:
        """Every entry, ordered by key."""

    # -- staged memories (EP-0118 `staged_memories`) ---------------------------------------------
    @abc.abstractmethod
    def stage_memory(self, memory_id: str, agent_id: str, data: str, stamp: str) -> bool:
        """Stage one memory; False when that id is staged already."""

    @abc.abstractmethod
    def staged_memories(self) -> list:
        """Every staged row (id, agent_id, memory_data, created_at), oldest first."""

    @abc.abstractmethod
    def unstage(self, memory_ids: list) -> None:
        """Remove these staged rows (they are in the ledger now)."""

    @abc.abstractmethod
    def count_staged(self) -> int:
        """How many memories are staged."""

    # -- idempotency keys (docs/SIGNALS.md, "Retries and idempotency keys") -------------------------
    def signal_by_key(self, sender: str, key: str):
        """The signal `sender` stored with idempotency key `key` (insert_signal / send_signal raise KeyTaken for a
        second one), or None."""
        raise NotImplementedError

    def note_by_key(self, agent_id: str, key: str) -> dict | None:
        """The note (`seq`, `at`, `agent_id`, `text`) `agent_id` appended with idempotency key `key`, or None."""
        raise NotImplementedError


class KeyTaken(Exception):
    """A signal or note carries an idempotency key its sender has stored already (the unique index says so, on
    any machine): raised inside the verb's write transaction, which rolls back; retries.py answers the first."""


class SessionStore(abc.ABC):
    """One session's shared state, opened: transactions on it, then `close()`."""

    session_id: str
    busy_timeout_ms: int

    @abc.abstractmethod
    def write(self):
        """`with store.write() as tx:` a write transaction (a `Transaction`): committed on success, rolled back
        on any error."""

    @abc.abstractmethod
    def read(self):
        """`with store.read() as tx:` a read transaction: one consistent view for every query in the body."""

    @abc.abstractmethod
    def close(self) -> None:
        """Give the connection back; the store is not used after this."""

    def forget_audience(self) -> None:
        """Drop a broadcast's audience kept between broadcasts (store/audience.py), as a new process has none: the
        next broadcast reads the registry again. A store that keeps none has nothing to drop."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Store(abc.ABC):
    """A backend for one state directory: its sessions, and what is shared beyond one session."""

    kind: str  # "sqlite" or "postgresql"

    @abc.abstractmethod
    def open_session(self, session_id: str, create: bool = False) -> SessionStore:
        """The session's store; NotFoundError when it does not exist and not `create`."""

    @abc.abstractmethod
    def session_exists(self, session_id: str) -> bool:
        """Whether the session's document exists."""

    @abc.abstractmethod
    def create_session(self, session_id: str, created_at: str) -> bool:
        """Create the session (its store and document, status `active`) unless it exists; True when new."""

    @abc.abstractmethod
    def read_session(self, session_id: str) -> dict:
        """The session document {session_id, status, created_at, ended_at, ...}; NotFoundError."""

    @abc.abstractmethod
    def list_sessions(self) -> list[dict]:
        """Every readable session document, by id."""

    @abc.abstractmethod
    def set_session_status(self, session_id: str, status: str, stamp: str) -> dict:
        """Mark a session `ended` or `active` again; returns the new document."""

    def session_signature(self, session_id: str):
        """What identifies the session's database now: a pooled store is reused only while this is
        unchanged (SQLite: the file's device and inode, so a replaced session.db is reopened)."""
        return (self.kind,)

    # -- the notes bus ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def note_appender(self, session_id: str):
        """`with store.note_appender(sid) as add:` then `add(tx, agent_id, text, now)` appends one note
        (seq unique and increasing) that stands or falls with the write transaction `tx`."""

    @abc.abstractmethod
    def read_notes(self, session_id: str, limit: int) -> list[dict]:
        """The newest `limit` notes of the session, oldest first."""

    @abc.abstractmethod
    def notes_version(self, session_id: str) -> int:
        """A number that grows whenever a note is added to the session (for subscriptions)."""

    # -- the memory ledger ------------------------------------------------------------------------------
    @abc.abstractmethod
    def append_ledger(self, tx: Transaction, merged: list, *, session_id: str, merged_by: str,
                      reader=None) -> tuple[list, list]:
        """Inside the consolidating transaction `tx`: append the merged lines the ledger does not hold yet
        (store/ledger.py's LedgerHoldings decide); returns (written, already held). Two consolidations at once
        never both write one memory."""

    @abc.abstractmethod
    def read_ledger(self) -> list[dict]:
        """Every ledger line, oldest first."""

    def ledger_location(self) -> str:
        """Where the ledger lives, for people (a file, or the database without its password)."""
        return self.kind

    def put_heartbeat_copy(self, doc: dict, stamp: str) -> None:
        """The copy of a heartbeat by an agent in no session (no session transaction carries it), in a
        transaction of its own; the local file was written first. SQLite: nothing (the file is it)."""

    def heartbeat_copies(self) -> list[dict]:
        """The latest heartbeat document of every agent that wrote one into the store (SQLite: none;
        its readers read the heartbeat files). Each has `received_at`, the store's time of the copy."""
        return []

    def heartbeat_copy(self, agent_id: str) -> dict | None:
        """One agent's copy (see heartbeat_copies), or None."""
        return None

    # -- claims (contract §9) ---------------------------------------------------------------------------
    @abc.abstractmethod
    def claim_slot(self, item: str):
        """`with store.claim_slot(item) as slot:` one item's claim, exclusively: `slot.record` (None when
        missing or unreadable), `slot.existed`, `slot.high_water()` (the highest token ever handed out),
        `slot.write(record, event)` (the record and its event, both or neither). SQLite: the claim file
        under its file lock (store/local/claims.py)."""

    @abc.abstractmethod
    def claim_document(self, item: str) -> tuple:
        """(record or None, existed) of one item, without locking."""

    @abc.abstractmethod
    def claim_documents(self):
        """(record or None, name, error) of every claimed item."""

    @abc.abstractmethod
    def path_claim_candidates(self, prefixes, under: str | None = None) -> list[str]:
        """The path claims that may be held whose index prefix (store/claim_keys.py `index_prefix`) is in `prefixes` or
        lies under `under`, without locking. SQLite: the index file."""

    @abc.abstractmethod
    def claim_records(self, items) -> dict:
        """{item: record} of these items, read afresh (missing and unreadable ones left out)."""

    @abc.abstractmethod
    def wait_book(self):
        """`with store.wait_book() as book:` the claim waiters (contract §14), exclusively: `book.waits()`,
        `book.put(record, swept)`, `book.remove(agent_id, item)`, `book.claim_records(items)`.
        SQLite: state/claim-waits.json under its lock."""

    @abc.abstractmethod
    def waits(self) -> list[dict]:
        """Every recorded waiter (live or not), without locking."""

    # -- escalation incidents (contract §6) ------------------------------------------------------------
    @abc.abstractmethod
    def escalation_book(self):
        """`with store.escalation_book() as book:` the incidents, held exclusively (one writer at a time
        across every machine sharing the store): `book.current()` {key name: incident}, and
        `book.record(changed, records)`, the changed incidents and the event records, all or none.
        SQLite: the escalations/ files under their file lock."""

    @abc.abstractmethod
    def incidents(self) -> dict:
        """The current incident of every key, {key name: incident}, without locking."""

    @abc.abstractmethod
    def incident_log(self) -> list:
        """Every escalation event record ever stored (each with its `incident`), oldest first."""

    # -- the guard's events (contract §15: denials, refused commits, deadlocks; guard_events.py) ----------------
    @abc.abstractmethod
    def record_event(self, event: dict, keep: int) -> None:
        """Keep `event`, and only the newest `keep` of them. SQLite: guard-events.jsonl (store/local/events.py)."""

    @abc.abstractmethod
    def recent_events(self, limit: int) -> list[dict]:
        """The newest `limit` events kept, newest first."""

    def now(self):
        """The moment every comparison between agents uses: the local clock, or the server's."""
        return utcnow()

    def exclusive_pass(self, name: str, lock_path):
        """`with store.exclusive_pass(name, lock) as got:` True while this process is the only one across the
        store running pass `name` (the watchdog), False at once when another holds it."""
        from ..atomic import locked

        return locked(lock_path, blocking=False)

    def listen(self, on_change, stop, retry_s: float = 1.0):
        """Push: call `on_change(session_id)` when a signal is stored in that session by any process,
        and `on_change(None)` when everything must be re-checked (after a lost connection). Returns the
        thread doing it, or None when the store has no push of its own (SQLite: watch the session
        folder instead)."""
        return None

    def close(self) -> None:
        """Release what the store holds (connections)."""
