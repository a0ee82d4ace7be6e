"""The team server's watcher (the dashboard's change feed and push): reads of the state directory, the
server's own included, wake none of its threads; writes still do, and still tell the dashboard."""

from __future__ import annotations

import threading

from conftest import wait_until

from synapolis.identity import Who
from synapolis.mcp.watch import SessionWatcher, Subscriptions, inbox_uri


class CountingWatcher(SessionWatcher):
    """The real watcher, counting every event watchdog hands it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def _on_event(self, event):
        self.events.append((event.event_type, event.src_path))
        super()._on_event(event)


def test_reads_wake_no_watcher_thread_and_writes_still_tell_the_dashboard(ws, start_agent):
    from synapolis import actions

    alice = start_agent("alice")
    start_agent("bob", session_id=alice["session_id"])
    changed = threading.Event()
    pushed = []
    subscriptions = Subscriptions()
    subscriptions.add(inbox_uri(alice["session_id"], "bob"), "holder", 0)
    watcher = CountingWatcher(ws, subscriptions, pushed.extend, on_change=changed.set).start()
    try:
        # what list_agents does per agent, and what every verb does with the config: open, read, close
        for _ in range(50):
            for agent in ("alice", "bob"):
                ws.paths.heartbeat(agent).read_bytes()
            actions.list_agents(ws, None, session_id=alice["session_id"], env={})
        # a write after the reads: once its event is in, every earlier one is too (one inotify queue)
        actions.signal(ws, Who("alice", alice["session_id"], alice["run_token"]), "bob", "hello", env={})
        wait_until(lambda: changed.is_set() and pushed, 5, "the change event and the push of the signal")
        assert pushed == [inbox_uri(alice["session_id"], "bob")]
        assert not [e for e in watcher.events if e[0] in ("opened", "closed_no_write")], watcher.events
        assert any(path.endswith("session.db-wal") for kind, path in watcher.events if kind == "modified")
    finally:
        watcher.stop()
