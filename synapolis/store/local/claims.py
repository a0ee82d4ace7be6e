"""The local store's claim files: `claims/<item>.json`, `claims.jsonl` and the per-item locks (contract §9)."""

from __future__ import annotations

import json
import os

from ...atomic import (JsonlLog, atomic_write_json, json_files, locked, open_regular, parse_jsonl_line, read_json,
                       restorable)
from ...errors import BusyError, ConflictError, SynapolisError
from ...names import is_name, validate_claim_item
from ..claim_keys import is_claim_record

# Encoded names longer than this become a prefix plus a hash, so a 200-character item of
# escaped characters (600 bytes) still fits the usual 255-byte file-name limit with room to spare.
MAX_STEM = 180
_PREFIX = 110
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
PATHS_LOCK = "claim-paths"  # .locks/claim-paths.lock: held by every change of a path claim


def encode_item(item: str) -> str:
    """The file-name stem of a (validated) item: percent-encoding of everything outside [A-Za-z0-9_.-].

    '/' is always escaped, so the name is one path component, and so are the pattern characters `*?[]`;
    a leading '.' (`.github/...`) is escaped too, so the name is never hidden, '.', '..' or a temp file
    (an item starting with a letter or digit, every item before path patterns, keeps its old name).
    Too long: a truncated prefix, '~' (which no valid item contains, so it cannot collide with a short
    name) and the item's sha256.
    """
    stem = "".join(ch if ch in _SAFE else f"%{ord(ch):02X}" for ch in item)
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    if len(stem) > MAX_STEM:
        from ...names import sha256_hex

        stem = stem[:_PREFIX] + "~" + sha256_hex(item.encode("utf-8"))
    return stem


def claim_path(ws, item: str):
    """The claim file of `item` as a pathlib.Path (for people and tests; the verbs use `claim_file`)."""
    return ws.paths.claims / f"{encode_item(validate_claim_item(item))}.json"


def claim_file(ws, item: str) -> str:
    """The claim file of a validated `item` as a plain str: the verbs never load pathlib."""
    return os.path.join(ws.files.claims, f"{encode_item(item)}.json")


def lock_file(ws, item: str) -> str:
    """The item's lock file. On POSIX nobody removes it (filelock keeps it too), so every holder locks one
    inode; on Windows a FileLock removes it on release only when no other process has it open."""
    return ws.files.lock(f"claim.{encode_item(item)}")


def try_item_lock(path: str):
    """The item's lock taken at once (an entered atomic.locked, to be exited), or None: another process
    holds it, or the file cannot be opened just now (on Windows a FileLock holder removes it on release)."""
    lock = locked(path, blocking=False)
    try:
        if lock.__enter__():
            return lock
    except PermissionError:
        return None  # filelock's turn: it copes with its own removals, or says what is wrong
    lock.__exit__(None, None, None)
    return None


class item_lock:
    """`with item_lock(ws, item):` the per-item lock `.locks/claim.<stem>.lock`, with the configured finite
    timeout; a timeout is BusyError (exit 8).

    Free (the usual case): taken at once by atomic.locked's non-blocking try, without importing filelock
    (50-75 ms, several times a whole `synapolis claim`). Held by another process: waited for through
    filelock.FileLock, which takes the very same lock on the same file (flock on POSIX, a lock on byte 0
    on Windows), so a holder on either side excludes the other (docs/CLAIMS.md, "The lock").
    """

    def __init__(self, ws, item: str, path: str | None = None):
        self.ws, self.item = ws, item
        self.path = path or lock_file(ws, item)
        self.held = None  # the entered atomic.locked, or the acquired FileLock

    def __enter__(self) -> None:
        path = self.path
        fast = try_item_lock(path)
        if fast is not None:
            self.held = fast
            return
        from filelock import FileLock, Timeout  # contended: a waiter pays the import while it waits anyway

        timeout_ms = self.ws.config.busy_timeout_ms
        lock = FileLock(path, timeout=timeout_ms / 1000.0)
        try:
            lock.acquire()
        except Timeout:
            raise BusyError(f"claim {self.item} stayed locked past busy_timeout_ms ({timeout_ms} ms); try again",
                            item=self.item) from None
        self.held = lock

    def __exit__(self, *exc) -> None:
        held, self.held = self.held, None
        if isinstance(held, locked):
            held.__exit__(None, None, None)
        else:
            held.release()


def _load(ws, item: str, path) -> tuple[dict | None, bool]:
    """(record, exists): the claim file of `item`; record None when missing or unreadable."""
    try:
        doc = read_json(path)
    except FileNotFoundError:
        return None, False
    except (OSError, ValueError):
        return None, True
    if isinstance(doc, dict) and isinstance(doc.get("item"), str) and doc["item"] != item:
        # only on a case-insensitive filesystem, where 'Ticket:1' and 'ticket:1' share a name
        raise ConflictError(f"claim item {item} shares its file {os.path.basename(path)} with item {doc['item']} "
                            "on this filesystem (it ignores case); spell the item differently", item=item)
    return (doc if is_claim_record(doc, item) else None), True


def _known_path(ws, item: str) -> str:
    """The marker saying `item` was claimed here before: `.locks/claims-known/<stem>`, an empty file kept
    with the item's lock file (claims/ holds claim files only)."""
    return os.path.join(ws.files.locks, "claims-known", encode_item(item))


def _mark_known(ws, item: str) -> bool:
    """Make the marker under the item's lock, before any claim file of `item` is written; whether it
    was there already (a stat, when it was)."""
    path = _known_path(ws, item)
    if os.path.lexists(path):
        return True
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # O_EXCL | O_NOFOLLOW: never through a link someone planted; one that appeared since is as good
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644))
    except FileExistsError:
        pass
    return False


def _high_water(ws, item: str, record: dict | None, known: bool = True) -> int:
    """The highest token ever handed out for `item`.

    The claim file carries it and is written before a token is returned. Only when that file is gone
    or unreadable (a person edited or deleted it) do we fall back to the event log, so a token never
    goes back even then. An item with neither a file nor a `claims-known` marker (made before its first
    claim file) was never claimed: no log to search, so a new claim costs the same however long the
    log is.
    """
    if record is not None:
        return record["token"]
    if not known:
        return 0
    needle = json.dumps(item, ensure_ascii=False).encode("utf-8")
    best = 0
    try:
        # a FIFO or device planted as the log is never opened (open_regular), so this never hangs
        with open(open_regular(ws.files.claims_log), "rb") as handle:
            for line in handle:
                if needle not in line:
                    continue
                event = parse_jsonl_line(line)
                if event is None:
                    continue
                token = event.get("token")
                if event.get("item") == item and isinstance(token, int) and not isinstance(token, bool):
                    best = max(best, token)
    except OSError:  # missing, or not a regular file: no history to go by
        pass
    return best


def _event_of(record: dict, transition: dict) -> dict:
    """The claims.jsonl line of one transition of `record`."""
    return {"at": transition["at"], "item": record["item"],
            **{k: v for k, v in transition.items() if k not in ("at", "log_at", "count")}}


def _logged(log: JsonlLog, event: dict, offset) -> bool:
    """Whether the line at `offset` of the claim log is `event` (the line a transition was written with)."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return True  # written before transitions carried their offset: nothing to compare
    # (a line appended after a torn fragment starts one newline later)
    line = os.pread(log.fd, 65536, offset).lstrip(b"\n").split(b"\n", 1)[0]
    found = parse_jsonl_line(line)
    return found is not None and all(found.get(k) == event.get(k) for k in ("at", "item", "event", "token"))


def _repair(log: JsonlLog, record: dict | None, last) -> None:
    """Log the transition `last` of `record` if its line is missing: a writer killed between replacing the
    claim file and appending the event leaves the event only in the file; the next change logs it."""
    if isinstance(last, dict) and "log_at" in last and not _logged(log, _event_of(record, last), last["log_at"]):
        log.append({**_event_of(record, last), "recovered": True})


class FileSlot:
    """One item's claim on the SQLite store (files): `claims/<item>.json` and `claims.jsonl`, held under
    the item's file lock. The PostgreSQL store has the same shape (store/postgres/claims.py, ClaimSlot)."""

    def __init__(self, ws, item: str):
        self.ws, self.item = ws, item
        self.path = claim_file(ws, item)
        self.record, self.existed = _load(ws, item, self.path)
        # under the item's lock, before any claim file of it is written; state dirs from before the
        # marker get it on first use (their items have files, so `existed` says known)
        self.known = _mark_known(ws, item) or self.existed

    def high_water(self) -> int:
        return _high_water(self.ws, self.item, self.record, self.known)

    def write(self, record: dict, event: dict) -> None:
        """The event log is locked first, so a busy log (BusyError) changes nothing; if the event cannot
        be appended (a full disk, a file-size limit) the old claim file is put back (atomic.restorable).

        Each transition records the offset of its line (`log_at`), so a writer killed between the file
        and its line is repaired by the next change of the item (_repair).
        """
        history = record.get("transitions") or []
        path_item = not is_name(self.item)
        if path_item:
            from .claim_index import file_index_change  # a name's claim never loads the path machinery
        if path_item and not record.get("released_at"):
            file_index_change(self.ws, self.item, True)  # before the file: a crash leaves a candidate, never a gap
        with self._log() as log, restorable(self.path):
            _repair(log, record, history[-2] if len(history) >= 2 else None)
            if history:
                history[-1]["log_at"] = os.fstat(log.fd).st_size
            atomic_write_json(self.path, record)
            log.append(event)
        if path_item and record.get("released_at"):
            try:
                file_index_change(self.ws, self.item, False)
            except (OSError, SynapolisError):
                pass  # released already: the entry left is one extra candidate (claim_index), never a gap

    def path_claim_candidates(self, prefixes, under: str | None = None) -> list[str]:
        from .claim_index import file_candidates

        return file_candidates(self.ws, prefixes, under)

    def claim_records(self, items) -> dict:
        return file_records(self.ws, items)

    def settle(self) -> None:
        """Nothing changes (releasing a released claim), but a crashed change's missing line is logged."""
        history = (self.record or {}).get("transitions") or []
        if history:
            with self._log() as log:
                _repair(log, self.record, history[-1])

    def _log(self) -> JsonlLog:
        return JsonlLog(self.ws.files.claims_log, timeout=self.ws.config.busy_timeout_ms / 1000.0)


class file_slot:
    """`with file_slot(ws, item) as slot:` the SQLite store's claim slot, the item's lock held for the body."""

    def __init__(self, ws, item: str):
        self.ws, self.item = ws, item
        self.lock = item_lock(ws, item)
        # every change of a path claim holds one lock for all of them, taken before the item's own: two
        # overlapping patterns (`src/**`, `src/a.py`) are different items, and only one may win (§14)
        self.paths_lock = None if is_name(item) else item_lock(ws, item, ws.files.lock(PATHS_LOCK))

    def __enter__(self) -> FileSlot:
        if self.paths_lock is not None:
            self.paths_lock.__enter__()
        try:
            self.lock.__enter__()
        except BaseException:
            if self.paths_lock is not None:
                self.paths_lock.__exit__(None, None, None)
            raise
        try:
            return FileSlot(self.ws, self.item)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.lock.__exit__(*exc)
        finally:
            if self.paths_lock is not None:
                self.paths_lock.__exit__(*exc)


def file_document(ws, item: str) -> tuple[dict | None, bool]:
    return _load(ws, item, claim_file(ws, validate_claim_item(item)))


def file_documents(ws):
    """(record or None, file name, error) of every claim file."""
    for path in _claim_files(ws):
        try:
            doc = read_json(path)
        except (OSError, ValueError) as exc:
            yield None, path.name, str(exc)
            continue
        yield doc, path.name, "does not look like a claim record"


def _claim_files(ws):
    try:
        return json_files(ws.paths.claims)
    except NotADirectoryError:
        return []


def file_records(ws, items) -> dict:
    """{item: its claim record} read afresh from the claim files (unreadable or missing ones left out)."""
    out = {}
    for item in items:
        try:
            record, _existed = file_document(ws, item)
        except SynapolisError:
            continue
        if record is not None:
            out[item] = record
    return out
