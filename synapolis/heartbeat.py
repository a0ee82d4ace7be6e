"""Heartbeat documents: building, writing (atomically, seq +1), reading, and the fast schema check."""

from __future__ import annotations

import json
import os
import re

from .atomic import atomic_write_json, json_files, locked, read_bytes_stat, read_json
from .errors import UsageError
from .names import check_text, only_id_chars, validate_agent_id

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path

SCHEMA_VERSION = 1
DECLARED_STATUSES = ("active", "idle", "sleeping", "stopped")
REQUIRED = ("schema_version", "agent_id", "harness", "status", "beat_at", "seq")
OPTIONAL = ("substrate", "session_id", "started_at", "ttl_s", "task", "note", "host", "pid", "x")
MAX_TEXT = 4096
# used with fullmatch, never match: "$" also matches before a trailing newline ("a\n" must not pass)
# a pattern, compiled by `re` on first use: readers need it, a beat does not (0.2 ms of start-up)
_AGENT_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
# hours 00-23 and minutes 00-59 as RFC 3339 says (datetime.fromisoformat would take 24:00); compiled on first use
_UTC_TS_PATTERN = r"^\d{4}-\d{2}-\d{2}T([01]\d|2[0-3]):[0-5]\d:\d{2}(\.\d{1,9})?Z$"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_schema_int(value) -> bool:
    # JSON Schema counts 1.0 as an integer; the mirror must agree with it. `type(...) is int` first: what
    # json.loads gives for a whole number, one check instead of three on the monitor's path
    return type(value) is int or _is_int(value) or (isinstance(value, float) and value.is_integer())


# An infinite ttl_s would be written as `Infinity`, which is not JSON: the file would turn invalid.
# The longest an agent may promise to stay silent (standards/heartbeat.schema.json says the same): a day.
# Unbounded, `beat --ttl 1e308` would keep a silent agent `active`, and its claims held, forever.
MAX_TTL_S = 86400


def _ttl_ok(value) -> bool:
    return _is_number(value) and 0 < value <= MAX_TTL_S


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A stamp's shape is checked by hand for the first HAND_CHECKS stamps of a process, then by
# _UTC_TS_PATTERN compiled: compiling it costs as much as ~1,000 hand checks (0.2-0.3 ms, every beat and
# hook writes a heartbeat and checks one stamp), and a monitor pass (two stamps a file, thousands of files)
# is faster per stamp with the compiled pattern.
HAND_CHECKS = 64
_hand_checks_left = HAND_CHECKS
_ts_shape = None  # re.compile(_UTC_TS_PATTERN).fullmatch, once the hand checks are spent
_DIGIT_TO_D = str.maketrans("0123456789", "dddddddddd")


def _shape_by_hand(value: str) -> bool:
    """Whether ASCII text `value` fullmatches _UTC_TS_PATTERN, without compiling it."""
    shape = value.translate(_DIGIT_TO_D)
    if len(shape) == 20:
        laid_out = shape == "dddd-dd-ddTdd:dd:ddZ"
    elif 22 <= len(shape) <= 30:  # a fraction of 1 to 9 digits
        laid_out = shape.startswith("dddd-dd-ddTdd:dd:dd.") and shape[20:] == "d" * (len(shape) - 21) + "Z"
    else:
        return False
    return laid_out and value[11:13] < "24" and value[14] < "6"  # hours 00-23, minutes 00-59


def _shape_ok(value: str) -> bool:
    global _hand_checks_left, _ts_shape
    if _ts_shape is None:
        # text that is not ASCII goes to the pattern, whose \d takes other scripts' digits too
        if _hand_checks_left > 0 and value.isascii():
            _hand_checks_left -= 1
            return _shape_by_hand(value)
        _ts_shape = re.compile(_UTC_TS_PATTERN).fullmatch
    return _ts_shape(value) is not None


def _ts_ok(value) -> bool:
    """Whether `value` is a stamp in the heartbeat's shape that timeutil.parse_ts reads."""
    if not isinstance(value, str):
        return False
    # the compiled pattern once there is one, without the call through _shape_ok (two stamps a file, a pass)
    if not (_shape_ok(value) if _ts_shape is None else _ts_shape(value) is not None) or not _real_date(value):
        return False
    if value.isascii() and len(value) in (20, 24, 27):  # no fraction or 3 or 6 digits: fromisoformat's own
        return True
    from .timeutil import parse_ts  # datetime, and dateutil on 3.10: only for unusual fractions

    try:
        parse_ts(value)
    except ValueError:
        return False
    return True


def _real_date(stamp: str) -> bool:
    """Year, month, day and second of a stamp of _UTC_TS_PATTERN's shape in range, as datetime checks them
    (no leap second), without importing datetime: a hook's heartbeat refresh checks its `started_at`."""
    # the shape says the second is two digits; in range when its first is 0-5
    if stamp[17] > "5":
        return False
    day = stamp[:10]
    known = _DAYS_SEEN.get(day)
    if known is None:
        if len(_DAYS_SEEN) >= 4096:  # a bound: the stamps of a pass fall on a handful of days
            _DAYS_SEEN.clear()
        known = _DAYS_SEEN[day] = _real_day(day)
    return known


# YYYY-MM-DD -> whether it is a real day: a monitor pass checks two stamps a file, nearly all on the same few
# days, and the integer parsing was a tenth of a pass's check of 50,000 files (issue 31)
_DAYS_SEEN: dict = {}


def _real_day(day: str) -> bool:
    year, month, date = int(day[:4]), int(day[5:7]), int(day[8:10])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    return year >= 1 and 1 <= month <= 12 and 1 <= date <= days[month - 1]


_REQUIRED_KEYS = frozenset(REQUIRED)
_KNOWN_KEYS = frozenset(REQUIRED + OPTIONAL)


def is_agent_id(text: str) -> bool:
    """Whether `text` matches the schema's agent_id pattern (_AGENT_PATTERN: dot-separated parts of
    [A-Za-z0-9_-], none empty), without a regular expression: a monitor pass asks once per file."""
    return only_id_chars(text) and text[0] != "." and text[-1] != "." and ".." not in text


def quick_check(doc) -> bool:
    """True when `doc` satisfies standards/heartbeat.schema.json.

    A hand-written mirror of the schema, so the hot paths (beat, claims, a monitor pass over
    thousands of files) need not import jsonschema; tests hold the two in agreement, and
    `schema_errors` gives jsonschema's detailed messages when this says no.
    """
    if not isinstance(doc, dict):
        return False
    if not _REQUIRED_KEYS.issubset(doc) or not _KNOWN_KEYS.issuperset(doc):
        return False
    if not (_is_schema_int(doc["schema_version"]) and doc["schema_version"] == SCHEMA_VERSION):
        return False
    agent = doc["agent_id"]
    if not (isinstance(agent, str) and len(agent) <= 128 and is_agent_id(agent)):
        return False
    harness = doc["harness"]
    if not (isinstance(harness, str) and 1 <= len(harness) <= 128):
        return False
    if doc["status"] not in DECLARED_STATUSES or not isinstance(doc["status"], str):
        return False
    if not _ts_ok(doc["beat_at"]):
        return False
    if not (_is_schema_int(doc["seq"]) and doc["seq"] >= 1):
        return False
    if "substrate" in doc and not (isinstance(doc["substrate"], str) and len(doc["substrate"]) <= 128):
        return False
    if "session_id" in doc:
        sid = doc["session_id"]
        if not (isinstance(sid, str) and len(sid) <= 128 and only_id_chars(sid) and sid not in (".", "..")):
            return False
    if "started_at" in doc and not _ts_ok(doc["started_at"]):
        return False
    if "ttl_s" in doc and not _ttl_ok(doc["ttl_s"]):
        return False
    for key in ("task", "note"):
        if key in doc and not (isinstance(doc[key], str) and len(doc[key]) <= MAX_TEXT):
            return False
    if "host" in doc and not (isinstance(doc["host"], str) and len(doc["host"]) <= 255):
        return False
    if "pid" in doc and not (_is_schema_int(doc["pid"]) and doc["pid"] >= 0):
        return False
    if "x" in doc and not isinstance(doc["x"], dict):
        return False
    return True


def schema_errors(doc) -> list[dict]:
    """Every schema error as {pointer, message}, from jsonschema (imported only here)."""
    from .schemas import validation_errors

    return validation_errors("heartbeat", doc)


class HeartbeatRead:
    """One heartbeat file as a reader finds it: the document, or why there is none."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("agent_id", "path", "doc", "errors", "mtime")

    def __init__(self, agent_id: str, path: Path, doc: dict | None, errors: list, mtime: float | None = None):
        self.agent_id, self.path, self.doc, self.mtime = agent_id, path, doc, mtime
        self.errors = errors  # [{pointer, message}]

    def __repr__(self) -> str:
        return f"HeartbeatRead({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    @property
    def valid(self) -> bool:
        return self.doc is not None and not self.errors


def read_heartbeat(path: Path | str, detailed: bool = False) -> HeartbeatRead:
    """Read and check one heartbeat file; never raises for a bad file."""
    return read_heartbeat_stat(path, detailed)[0]


def read_heartbeat_stat(path: Path | str, detailed: bool = False) -> tuple[HeartbeatRead, os.stat_result | None]:
    """read_heartbeat, with the fstat of the file it read (None when none was opened): the monitor remembers
    which file it read without a stat of its own."""
    name = os.path.basename(path)
    agent_id = name[:-5] if name.endswith(".json") else name
    try:
        raw, info = read_bytes_stat(path)
    except FileNotFoundError:
        return HeartbeatRead(agent_id, path, None, [{"pointer": "", "message": "no heartbeat file"}]), None
    except OSError as exc:
        return HeartbeatRead(agent_id, path, None, [{"pointer": "", "message": f"unreadable: {exc.strerror}"}]), None
    try:
        doc = _DECODER.decode(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return HeartbeatRead(agent_id, path, None, [{"pointer": "", "message": f"not valid JSON: {exc}"}]), info
    errors = []
    if detailed or not quick_check(doc):
        errors = schema_errors(doc)
        if not errors and not quick_check(doc):  # pragma: no cover - the two checks disagree
            errors = [{"pointer": "", "message": "does not satisfy the heartbeat schema"}]
    if isinstance(doc, dict) and isinstance(doc.get("agent_id"), str) and doc["agent_id"] != agent_id:
        errors.append({"pointer": "/agent_id",
                       "message": f"agent_id {doc['agent_id']!r} does not match the file name {name!r}"})
    return HeartbeatRead(agent_id, path, doc if isinstance(doc, dict) else None, errors), info


def _refuse_constant(name: str):
    # NaN and Infinity are not JSON (Python reads them anyway); an infinite ttl_s would never go stale
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)  # one, not one per file read


def iter_heartbeat_paths(directory: Path | str) -> list[Path]:
    """Heartbeat files in `directory`, skipping temp files of crashed writers; sorted by name."""
    return json_files(directory)


_UNSET = object()


def check_fields(*, status=None, task=None, note=None, harness=None, substrate=None, ttl_s=None) -> None:
    """UsageError for a field a beat cannot write; callers check before anything is written (§2)."""
    if status is not None and status not in DECLARED_STATUSES:
        raise UsageError(f"status must be one of {', '.join(DECLARED_STATUSES)}, not {status!r}")
    if task is not None and len(task) > MAX_TEXT:
        raise UsageError(f"task is longer than {MAX_TEXT} characters")
    if note is not None and len(note) > MAX_TEXT:
        raise UsageError(f"note is longer than {MAX_TEXT} characters")
    for value, what in ((task, "task"), (note, "note"), (harness, "harness"), (substrate, "substrate")):
        if isinstance(value, str):
            check_text(value, what)
    if ttl_s is not None and not _ttl_ok(ttl_s):
        raise UsageError(f"ttl must be a positive number of seconds, at most {MAX_TTL_S}, not {ttl_s!r}")


def write_heartbeat(paths, agent_id: str, *, harness: str | None = None, status: str | None = None,
                    task=_UNSET, note: str | None = None, ttl_s=_UNSET, substrate: str | None = None,
                    session_id: str | None = None, x: dict | None = None, now: str | None = None,
                    default_status: str = "active", durable: bool = True) -> dict:
    """Write `heartbeats/<agent_id>.json` atomically and return the document.

    `seq` is the previous file's + 1 under a per-agent lock, so two beats of one agent never share
    a seq. Fields not given keep their previous value (status, task, ttl, harness, session), so a
    refresh by any verb changes only `beat_at` and `seq`; `note` belongs to one beat only.
    """
    validate_agent_id(agent_id)
    check_fields(status=status, task=None if task is _UNSET else task, note=note, harness=harness,
                 substrate=substrate, ttl_s=None if ttl_s is _UNSET else ttl_s)
    files = paths.files  # plain strings: a beat never loads pathlib
    path = files.heartbeat(agent_id)
    # heartbeats/ is made by atomic_write_bytes when missing (no makedirs on every refresh)
    with locked(files.lock(f"heartbeat.{agent_id}")):
        lost = False  # a previous heartbeat exists but gives no seq: it must not restart at 1
        try:
            previous = read_json(path)
            if not isinstance(previous, dict):
                previous, lost = {}, True
        except FileNotFoundError:
            previous = {}
        except (OSError, ValueError):
            previous, lost = {}, True
        prev_seq = previous.get("seq")
        if _is_schema_int(prev_seq) and prev_seq >= 0:
            seq = int(prev_seq) + 1  # 12.0 is JSON Schema's integer 12: continued, never restarted
        elif lost or previous:
            seq = recovered_seq(files, agent_id)
        else:
            seq = 1
        stamp = now or _now_ts()
        doc = {
            "schema_version": SCHEMA_VERSION,
            "agent_id": agent_id,
            "harness": harness or _str_or(previous.get("harness")) or "cli",
            "status": status or (previous.get("status") if previous.get("status") in DECLARED_STATUSES else None)
            or default_status,
            "beat_at": stamp,
            "seq": seq,
        }
        sub = substrate or _str_or(previous.get("substrate"))
        if sub:
            doc["substrate"] = sub
        sid = session_id or _str_or(previous.get("session_id"))
        if sid:
            doc["session_id"] = sid
        started = previous.get("started_at") if _ts_ok(previous.get("started_at")) else None
        doc["started_at"] = started or stamp
        ttl = previous.get("ttl_s") if ttl_s is _UNSET else ttl_s
        if _ttl_ok(ttl):
            doc["ttl_s"] = ttl
        current_task = previous.get("task") if task is _UNSET else task
        if isinstance(current_task, str) and current_task:
            doc["task"] = current_task
        if note:
            doc["note"] = note
        doc["host"] = _hostname()[:255]
        doc["pid"] = os.getpid()
        extra = x if x is not None else previous.get("x")
        if isinstance(extra, dict):
            doc["x"] = extra
        # durable=False (refreshes by other verbs): still atomic, just no fsync on the hot path
        atomic_write_json(path, doc, durable=durable)
    return doc


def recovered_seq(files, agent_id: str) -> int:
    """The seq of a beat whose previous heartbeat cannot be read (mode 000, not JSON, a seq that is no whole
    number): above any seq that file can have held, so a seq never goes back (docs/SECURITY.md, "seq").

    The file's own number is lost; the floor is this machine's clock in milliseconds since the epoch, which a
    seq counting one a beat never reaches (a thousand beats a second, every second since 1970), and above the
    seq the last monitor saw for the agent (a clock set back)."""
    import time

    seen = 0
    try:
        monitor = read_json(files.monitor)
        for entry in monitor.get("agents", []) if isinstance(monitor, dict) else []:
            if isinstance(entry, dict) and entry.get("agent_id") == agent_id and _is_schema_int(entry.get("seq")):
                seen = max(seen, int(entry["seq"]))
    except (OSError, ValueError, AttributeError):
        pass
    return max(seen + 1, int(time.time() * 1000))


def _now_ts() -> str:
    from .timeutil import now_ts  # datetime: a quiet hook passes its own stamp and never loads it

    return now_ts()


def _hostname() -> str:
    # os.uname is free; importing socket costs ~7 ms on every beat (start-up budget, issue 2)
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # pragma: no cover - Windows

    return socket.gethostname()


def _str_or(value):
    return value if isinstance(value, str) and value else None
