"""Push for MCP subscriptions: the resource URIs, who watches which, and the watchdog watcher that says what is new.

Nothing here imports the MCP SDK: the watcher reports URIs to a callback, and the server turns them into
`notifications/resources/updated` (contract §10). A signal stored by any process lands in a session's
SQLite WAL, so watching `state/sessions/` tells us which sessions to look at; for each subscribed inbox we
then compare `signals.latest_visible_sequence` with what we last notified, so an event that changed
nothing for an inbox (another agent's traffic, a checkpoint) notifies nobody.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..atomic import is_temp_name
from ..errors import NotFoundError, UsageError
from ..names import validate_agent_id, validate_session_id
from ..watching import event_handler, event_paths, start_observer, stop_observer, writes_only

log = logging.getLogger(__name__)

SCHEME = "synapolis://session/"
INBOX_TEMPLATE = SCHEME + "{session_id}/inbox/{agent_id}"
NOTES_TEMPLATE = SCHEME + "{session_id}/notes"

# Files whose change can mean "something new": the database and its WAL, the notes bus.
_INTERESTING = ("session.db", "session.db-wal", "notes.jsonl")
# What in the state directory is bookkeeping, never news for a dashboard.
_NOT_STATE = (".locks", "monitor_history", "hooks", "tokens.json", "identity.json")
_NEWS = ("modified", "created", "deleted", "moved")  # not "closed", "attrib": SQLite readers make those


def inbox_uri(session_id: str, agent_id: str) -> str:
    return INBOX_TEMPLATE.format(session_id=session_id, agent_id=agent_id)


def notes_uri(session_id: str) -> str:
    return NOTES_TEMPLATE.format(session_id=session_id)


def parse_uri(uri: str) -> tuple[str, str, str | None]:
    """`("inbox", session_id, agent_id)` or `("notes", session_id, None)`; UsageError for anything else."""
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise UsageError(f"not a synapolis resource: {uri!r} (expected {INBOX_TEMPLATE} or {NOTES_TEMPLATE})")
    parts = uri[len(SCHEME):].split("/")
    if len(parts) == 3 and parts[1] == "inbox":
        return "inbox", validate_session_id(parts[0]), validate_agent_id(parts[2])
    if len(parts) == 2 and parts[1] == "notes":
        return "notes", validate_session_id(parts[0]), None
    raise UsageError(f"not a synapolis resource: {uri!r} (expected {INBOX_TEMPLATE} or {NOTES_TEMPLATE})")


@dataclass
class Watched:
    """One subscribed URI: what it names, the last value we notified, and who holds it."""

    kind: str
    session_id: str
    agent_id: str | None
    last: int
    holders: set = field(default_factory=set)


class Subscriptions:
    """The subscribed URIs and their holders (a connection, a listen stream); safe to use from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watched: dict[str, Watched] = {}

    def add(self, uri: str, holder, baseline: int) -> bool:
        """Register `holder` for `uri` (parsed first: UsageError when it is no synapolis URI); True when new."""
        kind, session_id, agent_id = parse_uri(uri)
        with self._lock:
            entry = self._watched.get(uri)
            if entry is None:
                entry = self._watched[uri] = Watched(kind, session_id, agent_id, baseline)
            fresh = holder not in entry.holders
            entry.holders.add(holder)
            return fresh

    def remove(self, uri: str, holder) -> None:
        with self._lock:
            entry = self._watched.get(uri)
            if entry is None:
                return
            entry.holders.discard(holder)
            if not entry.holders:
                del self._watched[uri]

    def drop_holder(self, holder) -> None:
        """A client that went away: its subscriptions go with it."""
        with self._lock:
            for uri in [u for u, w in self._watched.items() if holder in w.holders]:
                self._watched[uri].holders.discard(holder)
                if not self._watched[uri].holders:
                    del self._watched[uri]

    def holders(self, uri: str) -> set:
        with self._lock:
            entry = self._watched.get(uri)
            return set(entry.holders) if entry else set()

    def snapshot(self, session_ids=None) -> dict[str, Watched]:
        with self._lock:
            return {uri: Watched(w.kind, w.session_id, w.agent_id, w.last)
                    for uri, w in self._watched.items() if session_ids is None or w.session_id in session_ids}

    def advance(self, uri: str, value: int) -> bool:
        """Record `value` as notified; True when it is newer than what was notified before."""
        with self._lock:
            entry = self._watched.get(uri)
            if entry is None or value <= entry.last:
                return False
            entry.last = value
            return True

    def __len__(self):
        with self._lock:
            return len(self._watched)


def _parts_under(path: str, prefix: str) -> list[str] | None:
    """The components of `path` below the folder `prefix` (which ends with a separator), else None."""
    return path[len(prefix):].split(os.sep) if path.startswith(prefix) else None


def notes_size(ws, session_id: str) -> int:
    """A number that grows with each note of the session (the notes file's size on SQLite; see the store)."""
    return ws.store.notes_version(session_id)


def inbox_sequence(ws, session_id: str, agent_id: str, store=None) -> int:
    """The newest sequence `agent_id` can see in the session (0 when the session does not exist yet)."""
    from .. import signals
    from ..store import open_session

    own = store is None
    try:
        if own:
            store = open_session(ws, session_id)
        with store.read() as conn:
            return int(signals.latest_visible_sequence(conn, agent_id) or 0)
    except NotFoundError:
        return 0
    finally:
        if own and store is not None:
            store.close()


def current_value(ws, uri: str) -> int:
    """The value of a subscribed URI right now: its baseline when a client subscribes."""
    kind, session_id, agent_id = parse_uri(uri)
    if kind == "notes":
        return notes_size(ws, session_id)
    return inbox_sequence(ws, session_id, agent_id)


class SessionWatcher:
    """Watches `state/sessions/` with watchdog and calls `notify(uris)` for subscribed URIs that have news.

    A watchdog thread marks sessions dirty; one checker thread waits for a quiet `debounce_s` (at most
    `max_delay_s` after the first event), then looks at the dirty sessions' subscribed URIs. The checker
    keeps one SQLite connection per session open for its life: a reader that opened and closed its own
    connection would, as the last one out, checkpoint and delete the WAL, an event that wakes it again.

    With `on_change` (the team server's dashboard) it watches the whole state directory instead, and also
    calls `on_change()` once per quiet spell in which anything changed there (a heartbeat, a claim, an
    incident, a signal, a note): the same events, debounced the same way, as the push to MCP clients.
    """

    def __init__(self, ws, subscriptions: Subscriptions, notify: Callable[[list[str]], None], *,
                 debounce_s: float = 0.01, max_delay_s: float = 0.05, force_polling: bool = False,
                 poll_interval_s: float = 0.25, on_change: Callable[[], None] | None = None):
        self.ws = ws
        self.subscriptions = subscriptions
        self.notify = notify
        self.on_change = on_change
        self._changed = False
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.force_polling = force_polling
        self.poll_interval_s = poll_interval_s
        self.observer_kind = None
        self._cond = threading.Condition()
        self._dirty: set[str] = set()
        self._last_event = 0.0
        self._idle = True  # the checker waits for a first event (not out a quiet spell): events wake it
        self._stopping = False
        self._observer = None
        self._thread = None
        self._stores: dict = {}
        # the watched paths as the watcher's events spell them (string prefixes: pathlib per event costs)
        self._root_prefix = os.path.join(str(ws.paths.root), "")
        self._sessions_prefix = os.path.join(str(ws.paths.sessions), "")

    # -- the watchdog side -------------------------------------------------------------------------
    def mark_dirty(self, session_id: str) -> None:
        with self._cond:
            self._dirty.add(session_id)
            self._touched()

    def _touched(self) -> None:
        """(Under the condition.) An event arrived: it extends the quiet spell. Only an idle checker is woken:
        one already waiting out a spell finds the new `_last_event` when its wait ends and waits on, so a burst
        of events (one SQLite commit is several writes) wakes it once, not once per event."""
        self._last_event = time.monotonic()
        if self._idle:
            self._idle = False
            self._cond.notify()

    def _on_path(self, path: str) -> None:
        parts = _parts_under(path, self._sessions_prefix)
        if parts is not None and len(parts) == 2 and parts[1] in _INTERESTING:
            self.mark_dirty(parts[0])

    def _note_change(self, path: str, kind: str) -> None:
        """A dashboard's news: a file written, made, removed or renamed in the state directory. Readers of
        SQLite make noise that is no news (they open read-write, so closing is a "closed"; they create the
        WAL and -shm, and the last one out deletes the WAL), so of the WAL only a write counts."""
        parts = _parts_under(path, self._root_prefix)
        if not parts or parts[0] in _NOT_STATE or is_temp_name(parts[-1]) or parts[-1].endswith("-shm"):
            return  # locks, temporary files and SQLite's shared memory say nothing new
        if parts[-1].endswith("-wal") and kind != "modified":
            return
        self._mark_changed()

    def _mark_changed(self) -> None:
        with self._cond:
            self._changed = True
            self._touched()

    def _on_event(self, event) -> None:
        if event.is_directory or event.event_type in ("opened", "closed_no_write"):
            return  # reads, including our own, change nothing; a folder's own events say nothing a file's do not
        news = self.on_change is not None and event.event_type in _NEWS
        for path in event_paths(event):
            if news:
                self._note_change(path, event.event_type)
            self._on_path(path)

    def _start_observer(self) -> None:
        folder = self.ws.paths.sessions
        folder.mkdir(parents=True, exist_ok=True)
        if self.on_change is not None:
            folder = self.ws.paths.root
        self._observer = start_observer(event_handler(self._on_event), folder, recursive=True,
                                        force_polling=self.force_polling, poll_interval_s=self.poll_interval_s, log=log,
                                        event_filter=writes_only())
        self.observer_kind = type(self._observer).__name__

    # -- the checker side --------------------------------------------------------------------------
    def _store(self, session_id: str):
        from ..store import open_session

        store = self._stores.get(session_id)
        if store is None:
            store = self._stores[session_id] = open_session(self.ws, session_id)
        return store

    def check(self, session_ids=None) -> list[str]:
        """The subscribed URIs (of `session_ids`, default all) whose value grew since the last notice."""
        changed = []
        for uri, watched in self.subscriptions.snapshot(session_ids).items():
            try:
                if watched.kind == "notes":
                    value = notes_size(self.ws, watched.session_id)
                else:
                    try:
                        store = self._store(watched.session_id)
                    except NotFoundError:
                        continue  # not created yet; its creation is an event too
                    value = inbox_sequence(self.ws, watched.session_id, watched.agent_id, store)
            except Exception as exc:  # noqa: BLE001 - a locked or broken store must not stop the watcher
                log.warning("synapolis mcp: cannot check %s: %s", uri, exc)
                continue
            if self.subscriptions.advance(uri, value):
                changed.append(uri)
        return changed

    def _wait_for_dirty(self) -> tuple[set[str], bool] | None:
        """(dirty sessions, whether anything changed) once a burst of events is over; None: stopping."""
        with self._cond:
            while not self._dirty and not self._changed and not self._stopping:
                self._idle = True
                self._cond.wait()
            self._idle = False
            if self._stopping:
                return None
            first = time.monotonic()
            # trailing-edge debounce: one SQLite commit is several writes; look once they are done
            while not self._stopping:
                now = time.monotonic()
                quiet_at = self._last_event + self.debounce_s
                deadline = first + self.max_delay_s
                if now >= quiet_at or now >= deadline:
                    break
                self._cond.wait(min(quiet_at, deadline) - now)
            dirty, self._dirty = self._dirty, set()
            anything, self._changed = self._changed, False
            return dirty, anything

    def _run(self) -> None:
        try:
            while True:
                woken = self._wait_for_dirty()
                if woken is None:
                    return
                dirty, anything = woken
                if anything and self.on_change is not None:
                    try:
                        self.on_change()
                    except Exception as exc:  # noqa: BLE001 - the server may be shutting down
                        log.debug("synapolis: change listener failed: %s", exc)
                changed = self.check(dirty) if dirty else []
                if changed:
                    try:
                        self.notify(changed)
                    except Exception as exc:  # noqa: BLE001 - the server may be shutting down
                        log.debug("synapolis mcp: notify failed: %s", exc)
        finally:
            for store in self._stores.values():
                try:
                    store.close()
                except Exception:  # noqa: BLE001
                    pass
            self._stores.clear()

    def _on_store_change(self, session_id: str | None) -> None:
        """A shared store's push (PostgreSQL LISTEN/NOTIFY: a signal stored on any machine); None after a
        (re)connection, when notices may have been lost: every subscribed session is checked again."""
        if self.on_change is not None:  # the dashboard: news from another machine is news too
            self._mark_changed()
        if session_id is not None:
            self.mark_dirty(session_id)
            return
        for watched in self.subscriptions.snapshot().values():
            self.mark_dirty(watched.session_id)

    def start(self) -> "SessionWatcher":
        self._start_observer()
        self._listen_stop = threading.Event()
        self._listener = self.ws.store.listen(self._on_store_change, self._listen_stop)
        self._thread = threading.Thread(target=self._run, name="synapolis-mcp-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        if getattr(self, "_listen_stop", None) is not None:
            self._listen_stop.set()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._observer is not None:
            stop_observer(self._observer, timeout)
        if self._thread is not None:
            self._thread.join(timeout)
