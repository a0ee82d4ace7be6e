"""The guard's event record on the state directory's own files (the SQLite store): guard-events.jsonl, newest kept."""

from __future__ import annotations

import json
import os

FILE = "guard-events.jsonl"
LOCK = "guard-events"
# an event is appended (a hook pays one short write, not a rewrite of the record); past this size, or past twice
# what `keep` events the size of this one take, the file is rewritten with the newest `keep` only (readers take the
# newest anyway). The second bound keeps rewrites to about one in `keep` appends when 200 events pass TRIM_BYTES
# (a patch naming many files): with TRIM_BYTES alone, nearly every append of such events rewrote the whole file
TRIM_BYTES = 128 * 1024
# appending (read too: the last byte is looked at), never through a planted link, never waiting on a FIFO
# (open_regular then refuses anything but a regular file)
_FLAGS = (os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
          | getattr(os, "O_CLOEXEC", 0))


def _path(ws) -> str:
    return os.path.join(ws.files.root, FILE)


def record(ws, event: dict, keep: int) -> None:
    """Append `event` under the record's lock (a trim never drops one appended meanwhile); trim when large."""
    from ...atomic import locked, open_regular

    path = _path(ws)
    line = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    with locked(ws.files.lock(LOCK), timeout=ws.config.busy_timeout_ms / 1000.0):
        fd = open_regular(path, _FLAGS, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a writer killed mid-line left a fragment: ours starts on a line of its own
            os.write(fd, line)  # not fsynced: an event lost to a power cut costs a line on a page, not a hook's time
            size += len(line)
        finally:
            os.close(fd)
        if size > max(TRIM_BYTES, 2 * keep * len(line)):
            _trim(path, keep)


def _trim(path: str, keep: int) -> None:
    from ...atomic import atomic_write_bytes

    data = "".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in reversed(_newest(path, keep)))
    atomic_write_bytes(path, data.encode("utf-8"), durable=False, mode=0o644)


def _newest(path: str, limit: int) -> list[dict]:
    """The newest `limit` events of the file, newest first, read backwards from its end; a torn or broken line
    is skipped."""
    from itertools import islice

    from ...atomic import iter_jsonl_backwards

    return list(islice(iter_jsonl_backwards(path), max(0, limit)))


def recent(ws, limit: int) -> list[dict]:
    """The newest `limit` events, newest first, without locking (a trim replaces the file whole)."""
    return _newest(_path(ws), limit)
