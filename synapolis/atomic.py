"""Atomic file writes, locked appends and temp-file hygiene: the only place that writes state files."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path

TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".tmp"

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


def is_temp_name(name: str) -> bool:
    """Temporary files of crashed writers: every reader skips them."""
    return name.startswith(TEMP_PREFIX) or name.endswith(TEMP_SUFFIX)


def _make_parent(path) -> None:
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)


def _fsync_dir(directory: str) -> None:
    if sys.platform == "win32":  # pragma: no cover
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path | str, data: bytes, durable: bool = True, mode: int = 0o644) -> None:
    """Write `data` to `path` so a reader sees the old or the new file, never a part.

    A temporary file in the same folder (same filesystem, so `os.replace` is atomic), flushed and
    fsynced, then renamed over the target.
    """
    folder, name = os.path.split(os.fspath(path))
    folder = folder or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{TEMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename == tmp:
            # say which file could not be written (a directory in its place...), not our temporary name
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    if durable:
        _fsync_dir(folder)


def dumps(document) -> str:
    return json.dumps(document, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path | str, document, durable: bool = True, mode: int = 0o644) -> None:
    """`mode` applies to the new file from its creation (0o600 for secrets such as identity.json)."""
    atomic_write_bytes(path, dumps(document).encode("utf-8"), durable=durable, mode=mode)


# O_NONBLOCK: a FIFO where a state file belongs reads as empty (not JSON) instead of blocking
# every verb forever, waiting for a writer; on a regular file it changes nothing.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_bytes(path: Path | str) -> bytes:
    """The whole file at `path`; OSError as `open` raises it, but never blocks on a FIFO."""
    fd = os.open(path, _READ_FLAGS)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as exc:  # os.read names no file (a directory where this file belongs: say which)
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
    finally:
        os.close(fd)


def read_json(path: Path | str):
    """Parse a JSON file; raises FileNotFoundError, or ValueError for anything unparseable."""
    raw = read_bytes(path)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    except RecursionError:  # '[[[[…' nested past the interpreter's stack: unreadable, like any garbage
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None


def read_json_or(path: Path | str, default=None):
    """The parsed file, or `default` when it is missing or unparseable."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return default


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


@contextlib.contextmanager
def locked(lock_path: Path | str, blocking: bool = True, timeout: float | None = None):
    """An exclusive advisory lock on `lock_path` (created if missing) for the `with` body.

    With `blocking=False`, yields False at once when someone else holds it; otherwise waits up to
    `timeout` seconds (LOCK_TIMEOUT_S by default), then raises BusyError.
    """
    _make_parent(lock_path)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if blocking:
            _lock_within(fd, lock_path, LOCK_TIMEOUT_S if timeout is None else timeout)
            got = True
        else:
            got = _try_lock_fd(fd)
        try:
            yield got
        finally:
            if got:
                _unlock_fd(fd)
    finally:
        os.close(fd)


def append_jsonl(path: Path | str, *records: dict) -> None:
    """Append complete JSON lines under an exclusive lock on the file itself."""
    _make_parent(path)
    payload = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _lock_within(fd, path, LOCK_TIMEOUT_S)
        try:
            # A writer killed mid-line leaves a fragment; start on a fresh line so ours stays whole.
            size = os.fstat(fd).st_size
            if size:
                with open(path, "rb") as reader:
                    reader.seek(size - 1)
                    if reader.read(1) != b"\n":
                        payload = "\n" + payload
            os.write(fd, payload.encode("utf-8"))
            os.fsync(fd)
        finally:
            _unlock_fd(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path | str) -> list[dict]:
    """Every complete, parseable line; a torn or broken line is skipped, never fatal."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return []
    records = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def old_temp_files(directory: Path | str, older_than_s: float = 3600.0, now: float | None = None) -> list[Path]:
    """Temp files of crashed writers older than `older_than_s`, recursively (`doctor` reports them)."""
    from pathlib import Path  # only doctor and the watchdog ask; not worth loading on every CLI call

    now = time.time() if now is None else now
    found = []
    directory = Path(directory)
    if not directory.is_dir():
        return found
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if not is_temp_name(name):
                continue
            candidate = Path(root) / name
            try:
                if now - candidate.stat().st_mtime >= older_than_s:
                    found.append(candidate)
            except OSError:
                continue
    return found


def sweep_temp_files(directory: Path | str, older_than_s: float = 3600.0, now: float | None = None) -> list[Path]:
    """Remove temp files of crashed writers older than `older_than_s`, recursively; returns what went."""
    removed = []
    for candidate in old_temp_files(directory, older_than_s, now):
        try:
            candidate.unlink()
        except OSError:
            continue
        removed.append(candidate)
    return removed


def json_files(directory: Path | str) -> list[Path]:
    """The JSON documents in `directory`, sorted by name: no temp files of crashed writers, no hidden
    files; [] when the directory does not exist."""
    from pathlib import Path  # the monitor, escalation and claims ask; the hot paths do not

    directory = Path(directory)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [directory / n for n in names if n.endswith(".json") and not is_temp_name(n) and not n.startswith(".")]
