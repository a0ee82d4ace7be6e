"""Locks (flock, platform code here only), locked JSON-lines appends and their tolerant readers.

With atomic_io.py (atomic writes, bounded reads, counters, temp files), re-exported here, this is the only
place that writes state files; callers import both from here."""

from __future__ import annotations

import errno
import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path

# every name callers import from here (the writes and reads live in atomic_io.py)
from .atomic_io import (_APPEND_FLAGS, _CLOEXEC, _NOFOLLOW, _NONBLOCK, MAX_READ_BYTES,  # noqa: F401
                        TEMP_PREFIX, TEMP_SUFFIX, _make_parent, atomic_write_bytes, atomic_write_json, bump_counter,
                        dumps, file_signature, is_temp_name, json_files, json_names, old_temp_files, open_regular,
                        read_bytes, read_bytes_stat, read_counter, read_json, read_json_or, restorable,
                        sweep_temp_files)

if sys.platform == "win32":  # pragma: no cover - platform code lives here and nowhere else
    import msvcrt

    def _unlock_fd(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def _try_lock_fd(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
else:
    import fcntl

    def _unlock_fd(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    def _try_lock_fd(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:  # held by another; any other OSError (no locks on this filesystem) is real
            return False


# How long a blocking lock waits (the default busy_timeout_ms): our critical sections are short, so a
# holder past this is stuck (a stopped process, a hung disk) and the caller gets BusyError, not a hang.
LOCK_TIMEOUT_S = 5.0


def _lock_within(fd: int, what, timeout: float) -> None:
    """Take the lock on `fd`, waiting at most `timeout` seconds; BusyError (exit 8) past it."""
    if _try_lock_fd(fd):  # the usual case: free, one system call as before
        return
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            from .errors import BusyError

            raise BusyError(f"{what} stayed locked for more than {timeout:g} s: another process holds it "
                            "(stuck, or very slow); try again")
        time.sleep(min(delay, remaining))
        if _try_lock_fd(fd):
            return
        delay = min(delay * 2, 0.005)


class locked:
    """An exclusive advisory lock on `lock_path` (created if missing) for the `with` body.

    With `blocking=False`, `with` gives False at once when someone else holds it; otherwise waits up to
    `timeout` seconds (LOCK_TIMEOUT_S by default), then raises BusyError. (A class rather than a
    contextlib.contextmanager: contextlib is not imported on a hook's quiet path.)
    """

    def __init__(self, lock_path: Path | str, blocking: bool = True, timeout: float | None = None):
        self.lock_path, self.blocking, self.timeout = lock_path, blocking, timeout
        self.fd: int | None = None
        self.got = False

    def __enter__(self) -> bool:
        # never through a planted link (it would create a file elsewhere), never a FIFO or a device
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        try:
            fd = open_regular(self.lock_path, flags, 0o644)
        except (FileNotFoundError, NotADirectoryError):  # no lock folder yet (or a file in its place: makedirs says)
            _make_parent(self.lock_path)
            fd = open_regular(self.lock_path, flags, 0o644)
        try:
            if self.blocking:
                _lock_within(fd, self.lock_path, LOCK_TIMEOUT_S if self.timeout is None else self.timeout)
                self.got = True
            else:
                self.got = _try_lock_fd(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self.got

    def __exit__(self, *exc) -> None:
        fd, self.fd = self.fd, None
        try:
            if self.got:
                _unlock_fd(fd)
        finally:
            os.close(fd)


class JsonlLog:
    """An append-only JSON-lines file, opened and locked (its own flock) for the `with` body.

    Opening refuses a symbolic link, a FIFO or anything else that is not a regular file; the lock waits
    at most `timeout` seconds (LOCK_TIMEOUT_S), then BusyError, before anything is written. `append`
    writes whole lines or nothing: a short write, a full disk, a file-size limit (EFBIG, SIGXFSZ ignored)
    or a failed fsync truncates the file back to its old length and raises, so no torn line is left
    behind and no caller reports success for data that is not durably there. `undo(offset)` takes back
    what this holder appended (a later step of the same operation failed).
    """

    def __init__(self, path: Path | str, timeout: float | None = None):
        self.path = os.fspath(path)
        self.timeout = LOCK_TIMEOUT_S if timeout is None else timeout
        self.fd: int | None = None

    def __enter__(self) -> "JsonlLog":
        _make_parent(self.path)
        fd = open_regular(self.path, _APPEND_FLAGS, 0o644)
        try:
            _lock_within(fd, self.path, self.timeout)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        fd, self.fd = self.fd, None
        try:
            _unlock_fd(fd)
        finally:
            os.close(fd)

    def append(self, *records: dict, verify: bool = False) -> int:
        """Append `records` as complete lines, fsynced; returns the offset they start at (the old length).

        With `verify`, the written bytes are read back and compared before returning (the ledger's merge
        clears staged memories only after this).
        """
        payload = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
        data = payload.encode("utf-8")
        fd = self.fd
        size = os.fstat(fd).st_size
        # A writer killed mid-line leaves a fragment; start on a fresh line so ours stays whole.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:  # pragma: no cover - os.write raises rather than writing nothing
                    raise OSError(errno.EIO, "the disk took no bytes")
                view = view[written:]
            os.fsync(fd)
            if verify and os.pread(fd, len(data), size) != data:
                raise OSError(errno.EIO, "what was read back differs from what was written")
        except OSError as exc:
            self._truncate(size)
            raise OSError(exc.errno, f"{exc.strerror or exc}; nothing was appended", self.path) from None
        except BaseException:
            self._truncate(size)
            raise
        return size

    def undo(self, offset: int) -> None:
        """Take back everything appended from `offset` on (this holder's own lines: the lock is still held)."""
        self._truncate(offset)

    def _truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
            os.fsync(self.fd)
        except OSError:
            pass


def append_jsonl(path: Path | str, *records: dict, verify: bool = False) -> int:
    """Append complete JSON lines under an exclusive lock on the file itself (see JsonlLog); returns the
    offset they start at. Whole lines, durably written, or nothing and an OSError naming the file."""
    with JsonlLog(path) as log:
        return log.append(*records, verify=verify)


def parse_jsonl_line(line: bytes) -> dict | None:
    """One line of a JSON-lines log as its object; None for a blank, torn or broken line, or one that
    is not an object: every reader of our logs skips those rather than fail."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def read_jsonl(path: Path | str, limit: int | None = None) -> list[dict]:
    """Every complete, parseable line; a torn or broken line is skipped, never fatal.

    A log that is not a regular file (a FIFO, a device) reads as empty. At most `limit` bytes (default
    MAX_READ_BYTES) from the end are read, so a planted or runaway log never exhausts memory: the oldest
    lines past that are left out.
    """
    limit = MAX_READ_BYTES if limit is None else limit
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return []
    except OSError:
        return []
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        raw = os.pread(fd, size - start, start) if size else b""
    finally:
        os.close(fd)
    lines = raw.split(b"\n")
    if start:
        lines = lines[1:]  # cut by the limit: not a whole line
    return [r for r in map(parse_jsonl_line, lines) if r is not None]


TAIL_BLOCK = 65536


def iter_jsonl_backwards(path: Path | str, block: int = TAIL_BLOCK):
    """The parseable lines of a JSON-lines file, newest first, reading backwards from the end in blocks:
    the newest few of a huge log cost a block, not the log. Torn or broken lines are skipped; a missing
    file or one that is not regular yields nothing."""
    try:
        fd = open_regular(path)
    except OSError:
        return
    try:
        position = os.fstat(fd).st_size
        carry = b""  # the start of a line whose beginning lies in an earlier block
        while position > 0:
            step = min(block, position)
            position -= step
            chunk = os.pread(fd, step, position) + carry
            lines = chunk.split(b"\n")
            carry = lines[0] if position > 0 else b""
            complete = lines[1:] if position > 0 else lines
            for line in reversed(complete):
                record = parse_jsonl_line(line)
                if record is not None:
                    yield record
    finally:
        os.close(fd)


