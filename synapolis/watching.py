"""Watching the state directory with watchdog, falling back to polling where native watching is unavailable.

Used by `read-signals --follow`, `monitor --watch`, `status --watch` and the MCP server's push. watchdog
is imported inside these functions only: the verbs that run on every tool call never pay for it.
"""

from __future__ import annotations

import os


def event_handler(on_event):
    """A watchdog event handler that calls `on_event(event)` for every event."""
    from watchdog.events import FileSystemEventHandler

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event):
            on_event(event)

    return Handler()


def event_paths(event) -> list[str]:
    """The paths an event names, decoded: its source, and its destination for a move."""
    return [os.fsdecode(raw) for raw in (getattr(event, "src_path", ""), getattr(event, "dest_path", "")) if raw]


def writes_only() -> list:
    """watchdog's event filter for the changes of files: no "opened", no "closed_no_write", no events of
    folders themselves. A watcher given it is not woken by reads (inotify is not even asked for them): each
    file a verb reads (a heartbeat, the config) would otherwise cost two events, each parsed and passed
    through watchdog's threads only to be dropped. A recursive watch still follows new folders."""
    from watchdog import events

    return [events.FileCreatedEvent, events.FileModifiedEvent, events.FileDeletedEvent, events.FileMovedEvent,
            events.FileClosedEvent]


def start_observer(handler, folder, *, recursive: bool = False, force_polling: bool = False,
                   poll_interval_s: float = 0.25, log=None, event_filter=None):
    """A started watchdog observer of `folder` for `handler`: native (inotify) where the system allows,
    else a polling observer looking every `poll_interval_s`; `log` (a logger) is told of the fallback.
    `event_filter`: the watchdog event classes wanted (e.g. `writes_only()`), default all."""
    if not force_polling:
        from watchdog.observers import Observer

        observer = Observer()
        try:
            observer.schedule(handler, str(folder), recursive=recursive, event_filter=event_filter)
            observer.start()
            return observer
        except OSError as exc:  # inotify limits reached, or no inotify on this filesystem
            if log is not None:
                log.warning("synapolis: native file watching unavailable (%s); polling %s instead", exc, folder)
    from watchdog.observers.polling import PollingObserver

    observer = PollingObserver(timeout=poll_interval_s)
    observer.schedule(handler, str(folder), recursive=recursive, event_filter=event_filter)
    observer.start()
    return observer


def stop_observer(observer, timeout: float | None = None) -> None:
    """Stop `observer`; with `timeout`, wait up to that long for its threads to end."""
    observer.stop()
    if timeout is not None:
        observer.join(timeout)
