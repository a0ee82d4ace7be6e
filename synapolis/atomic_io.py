"""Atomic file writes, bounded reads of regular files, change counters and temp-file hygiene (no locks)."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path

TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".tmp"


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


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # Python adds O_CLOEXEC itself (PEP 446)


def atomic_write_bytes(path: Path | str, data: bytes, durable: bool = True, mode: int = 0o644) -> None:
    """Write `data` to `path` so a reader sees the old or the new file, never a part.

    A temporary file in the same folder (same filesystem, so `os.replace` is atomic), flushed and
    fsynced, then renamed over the target.
    """
    folder, name = os.path.split(os.fspath(path))
    folder = folder or "."
    tmp = os.path.join(folder, f"{TEMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    try:
        fd = os.open(tmp, _CREATE_FLAGS, mode)
    except (FileNotFoundError, NotADirectoryError):
        # the folder is missing (or is not one): made here, or makedirs says why it cannot be; the usual
        # case (it exists) costs no extra system calls
        os.makedirs(folder, exist_ok=True)
        fd = os.open(tmp, _CREATE_FLAGS, mode)
    try:
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked; plain system calls, no buffered file object
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        _quietly(os.unlink, tmp)
        if isinstance(exc, OSError) and exc.filename in (None, tmp):
            # say which file could not be written (a directory in its place...), not our temporary name
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    if durable:
        _fsync_dir(folder)


def _quietly(action, *args) -> None:
    """`action(*args)`, an OSError ignored (cleaning up after a failure that is already being raised)."""
    try:
        action(*args)
    except OSError:
        pass


class restorable:
    """Keep the files now at `paths` for the body; if the body raises, put every one back as it was.

    The old files are kept as hard links (temp names, so readers skip them) and renamed back on failure,
    which needs no free space: several files and a log entry (JsonlLog) change all together or not at
    all, even on a full disk. A file that did not exist is removed again. (A class, as `locked`: contextlib
    is not imported on a hook's quiet path.)
    """

    def __init__(self, *paths):
        self.paths = paths
        self.kept = []  # (path, backup or None)

    def __enter__(self) -> None:
        try:
            for path in map(os.fspath, self.paths):
                folder, name = os.path.split(path)
                backup = os.path.join(folder or ".", f"{TEMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}"
                                      f".previous{TEMP_SUFFIX}")
                try:
                    os.link(path, backup, follow_symlinks=False)
                except FileNotFoundError:
                    backup = None
                self.kept.append((path, backup))
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            for path, backup in reversed(self.kept):
                if backup is None:
                    _quietly(os.unlink, path)
                else:
                    _quietly(os.replace, backup, path)
        for _path, backup in self.kept:
            if backup is not None:
                _quietly(os.unlink, backup)


def dumps(document) -> str:
    return json.dumps(document, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path | str, document, durable: bool = True, mode: int = 0o644) -> None:
    """`mode` applies to the new file from its creation (0o600 for secrets such as identity.json)."""
    atomic_write_bytes(path, dumps(document).encode("utf-8"), durable=durable, mode=mode)


# O_NONBLOCK: a FIFO where a state file belongs is never waited on (open() of a FIFO waits for a writer);
# on a regular file it changes nothing. Whatever is opened must then be a regular file (open_regular).
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _NONBLOCK | _CLOEXEC

# appends never go through a symbolic link: a planted link would write outside the state directory
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC

# The largest state document any reader takes in: a heartbeat, claim, identity, session, config or monitor
# file is a few kilobytes (a monitor of 10,000 agents a few megabytes); anything bigger is not ours (a
# symlink to a huge file) and reads as unreadable instead of exhausting memory.
MAX_READ_BYTES = 64 * 1024 * 1024


def open_regular(path: Path | str, flags: int = _READ_FLAGS, mode: int = 0o644) -> int:
    """`os.open`, then refuse anything but a regular file (a FIFO, a device such as /dev/zero, a folder):
    OSError naming `path`. With O_NOFOLLOW in `flags`, a symbolic link is refused the same way."""
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if flags & _NOFOLLOW and exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "is a symbolic link: nothing is written through one", os.fspath(path)) from None
        raise
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise OSError(errno.EISDIR, "Is a directory", os.fspath(path))
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device is never read or written)",
                      os.fspath(path))
    return fd


def read_bytes(path: Path | str, limit: int | None = None) -> bytes:
    """The whole regular file at `path`, at most `limit` bytes (MAX_READ_BYTES); OSError as `open` raises
    it, or for a file that is not regular or is larger than `limit`. Never blocks on a FIFO."""
    return read_bytes_stat(path, limit)[0]


def read_bytes_stat(path: Path | str, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """read_bytes, with the fstat of the file it read: which file that was (inode, size, times), for a caller
    that remembers what it read (the monitor) without a stat of its own."""
    limit = MAX_READ_BYTES if limit is None else limit
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise OSError(errno.EISDIR, "Is a directory", os.fspath(path))
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device is never read or written)",
                          os.fspath(path))
        # one read of the size fstat gave (+1: a file grown since is read on, below); a regular file's short
        # read is its end, so the usual file needs no second read to find it
        want = min(info.st_size + 1, limit + 1)
        chunk = os.read(fd, want)
        if len(chunk) < want:
            return chunk, info
        chunks, size = [chunk], len(chunk)
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks), info
            chunks.append(chunk)
            size += len(chunk)
        raise OSError(errno.EFBIG, f"larger than {limit} bytes: not a state document", os.fspath(path))
    except OSError as exc:  # os.read names no file: say which
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
    finally:
        os.close(fd)


def file_signature(path) -> tuple | None:
    """Which file is at `path` (device, inode, mtime, size): an atomic replace by anyone changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


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


# A counter file is a hint for readers that want to skip work when nothing changed: `<epoch>:<count>`,
# fixed width, rewritten in place by writers that already exclude each other. The epoch is random and
# new whenever the file is (re)made, so a counter that was lost or reset never repeats a value a reader
# remembers; a reader compares the whole text and treats anything it cannot read as "changed".
_COUNTER_WIDTH = 16 + 1 + 20 + 1


def _parse_counter(data: bytes) -> tuple[str, int] | None:
    text = data.decode("ascii", "replace")
    epoch, sep, count = text.rstrip("\n").partition(":")
    if len(data) != _COUNTER_WIDTH or not sep or len(epoch) != 16 or not count.isdigit() or not count.isascii():
        return None
    return epoch, int(count)


def bump_counter(path: str, mode: int = 0o600, create: bool = True) -> str:
    """Add one to the counter at `path` (made when missing, unless not `create`: FileNotFoundError; restarted
    when unreadable); its new text. The caller holds whatever lock orders the counter's writers."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | _CLOEXEC | _NOFOLLOW, mode)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        parsed = _parse_counter(os.read(fd, 2 * _COUNTER_WIDTH))
        if parsed is None:
            os.ftruncate(fd, 0)
        epoch, count = parsed if parsed is not None else (os.urandom(8).hex(), 0)
        text = f"{epoch}:{count + 1:020d}\n"
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    return text


def read_counter(path: str) -> str | None:
    """The counter's text, or None when it is missing or unreadable (for a reader: "changed")."""
    try:
        fd = os.open(path, _READ_FLAGS | _NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, 2 * _COUNTER_WIDTH)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("ascii") if _parse_counter(data) is not None else None


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


def json_names(directory: Path | str) -> list[str]:
    """The names of the JSON documents in `directory`, sorted: no temp files of crashed writers, no hidden
    files; [] when the directory does not exist. (No pathlib: the monitor lists 50,000 of them.)"""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [n for n in names if n.endswith(".json") and not is_temp_name(n) and not n.startswith(".")]


def json_files(directory: Path | str) -> list[Path]:
    """json_names as paths."""
    from pathlib import Path  # the monitor, escalation and claims ask; the hot paths do not

    directory = Path(directory)
    return [directory / n for n in json_names(directory)]
