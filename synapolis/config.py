"""The config file `synapolis.json`: its defaults, loading and the checks on its values."""

from __future__ import annotations

import os

from .atomic import atomic_write_json, read_json
from .errors import UsageError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
STORE_RULE = '"sqlite" or a postgresql:// URL'  # what `store` (and SYNAPOLIS_STORE_URL) may be


def is_store_url(value) -> bool:
    """Whether `value` names a store synapolis has: "sqlite", or a PostgreSQL URL."""
    return isinstance(value, str) and (value == "sqlite" or value.startswith(POSTGRES_SCHEMES))


DEFAULTS: dict = {
    "stale_after_s": 300,
    "dead_after_s": 3600,
    "clock_skew_s": 120,
    "rate_limit_per_min": 10,
    "max_content_bytes": 65536,
    "monitor_keep": 24,
    "claim_ttl_s": 3600,
    "busy_timeout_ms": 5000,
    "redeliver_after_s": 600,
    "require_run_token": False,
    # "sqlite" (the state directory) or a postgresql:// URL shared by several machines (contract §12)
    "store": "sqlite",
    # a `synapolis serve` URL to go through instead of any store, and the variable holding its token (§16)
    "server": None,
    "token_env": None,
    "escalation": {"notify_cmd": None, "repeat_after_s": 86400, "notify_timeout_s": 10},
}


def defaults() -> dict:
    """A fresh copy of DEFAULTS (one nested object, so no need to load `copy` for a deep copy)."""
    return {**DEFAULTS, "escalation": dict(DEFAULTS["escalation"])}


_DURATIONS = ("stale_after_s", "dead_after_s", "clock_skew_s", "claim_ttl_s", "redeliver_after_s")
# The largest value of each whole-number key that the code handles (standards/config.schema.json says the
# same): content is held in memory several times over and 16 MiB is far beyond any signal or note; a rate
# past a million per minute or a SQLite timeout past ten minutes stops meaning anything (and 1e20 overflows
# the float and C int they become).
MAX_INTS = {
    "rate_limit_per_min": 1_000_000,
    "max_content_bytes": 16 * 1024 * 1024,
    "monitor_keep": 100_000,
    "busy_timeout_ms": 600_000,
}
_POSITIVE_INTS = tuple(MAX_INTS)


# Ten years. Beyond it `now - duration` leaves the calendar (OverflowError in every verb that asks
# whether an agent is fresh), and Infinity, which Python's JSON reader accepts, is not a duration.
MAX_DURATION_S = 10 * 366 * 86400


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_DURATION_S


def check_config(document) -> list[str]:
    """Every problem with a config document, as readable lines (empty when it is fine)."""
    problems = []
    if not isinstance(document, dict):
        return ["the config must be a JSON object"]
    known = set(DEFAULTS) | {"$schema", "schema_version"}
    for key in document:
        if key not in known:
            problems.append(f"unknown key {key!r}")
    for key in _DURATIONS:
        if key in document and not _positive_number(document[key]):
            problems.append(f"{key} must be a positive number of seconds (at most {MAX_DURATION_S}), "
                            f"not {document[key]!r}")
    for key in _POSITIVE_INTS:
        value = document.get(key, 1)
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INTS[key]):
            problems.append(f"{key} must be a whole number from 1 to {MAX_INTS[key]}, not {value!r}")
    if "require_run_token" in document and not isinstance(document["require_run_token"], bool):
        problems.append("require_run_token must be true or false")
    if "store" in document:
        if not is_store_url(document["store"]):
            problems.append(f"store must be {STORE_RULE}")
    if document.get("server") is not None and not (isinstance(document["server"], str)
                                                   and document["server"].startswith(("http://", "https://"))):
        problems.append("server must be null or an http:// or https:// URL of a `synapolis serve`")
    token_env = document.get("token_env")
    if token_env is not None and not (isinstance(token_env, str) and token_env.isidentifier()):
        problems.append("token_env must be null or the name of an environment variable (never the token)")
    esc = document.get("escalation", {})
    if not isinstance(esc, dict):
        problems.append("escalation must be an object")
    else:
        for key in esc:
            if key not in DEFAULTS["escalation"]:
                problems.append(f"unknown key escalation.{key}")
        cmd = esc.get("notify_cmd")
        if cmd is not None and not (isinstance(cmd, str) and cmd.strip()) and not (
                isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd)):
            problems.append("escalation.notify_cmd must be null, a non-empty string or a list of strings")
        for key in ("repeat_after_s", "notify_timeout_s"):
            if key in esc and not _positive_number(esc[key]):
                problems.append(f"escalation.{key} must be a positive number of seconds (at most {MAX_DURATION_S})")
    return problems


class Config:
    """The effective configuration: defaults overlaid with the file's values."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("values",)

    def __init__(self, values: dict | None = None):
        self.values = defaults() if values is None else values

    def __repr__(self) -> str:
        return f"Config(values={self.values!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.values == self.values

    __hash__ = None  # like the frozen dataclass it was: `values` is a dict

    def __getattr__(self, name):
        if name == "values":  # not set yet (copy, unpickling): no recursion through self.values
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def notify_cmd(self) -> list[str] | None:
        """The notifier as a list of arguments; UsageError for a string that cannot be split (an unclosed
        quote): the escalation writer records that as the notifier's failure and opens the incident."""
        return split_notify_cmd(self.values["escalation"].get("notify_cmd"))

    @property
    def repeat_after_s(self) -> float:
        return self.values["escalation"]["repeat_after_s"]

    @property
    def notify_timeout_s(self) -> float:
        return self.values["escalation"]["notify_timeout_s"]

    @property
    def thresholds(self) -> dict:
        return {k: self.values[k] for k in ("stale_after_s", "dead_after_s", "clock_skew_s")}


def split_notify_cmd(cmd) -> list[str] | None:
    """`notify_cmd` as arguments: a list as it is, a string split the way a shell splits words (never run
    through one); UsageError when the string cannot be split or leaves no command."""
    if cmd is None:
        return None
    if not isinstance(cmd, str):
        return list(cmd)
    import shlex  # only the escalation writer and doctor ask; not worth loading on every CLI call

    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise UsageError(f"escalation.notify_cmd {cmd!r} cannot be split into arguments ({exc})") from None
    if not words:
        raise UsageError(f"escalation.notify_cmd {cmd!r} names no command")
    return words


def notify_problems(document) -> list[str]:
    """What is wrong with the notifier that the schema cannot say (doctor reports it; verbs never refuse
    the config for it, so a broken notifier never stops the watchdog from opening incidents)."""
    esc = document.get("escalation") if isinstance(document, dict) else None
    cmd = esc.get("notify_cmd") if isinstance(esc, dict) else None
    if not isinstance(cmd, str):
        return []
    try:
        split_notify_cmd(cmd)
    except UsageError as exc:
        return [exc.message]
    return []


def merge_defaults(document: dict) -> dict:
    values = defaults()
    for key, value in document.items():
        if key == "escalation" and isinstance(value, dict):
            values["escalation"].update(value)
        elif key in DEFAULTS:
            values[key] = value
    return values


def load_config(path: str | os.PathLike) -> Config:
    """The config at `path`, or the defaults when there is none; UsageError when it is broken."""
    try:
        document = read_json(path)
    except FileNotFoundError:
        return Config()
    except ValueError as exc:
        raise UsageError(f"config {path} is not valid JSON: fix or delete it ({exc})") from None
    except OSError as exc:
        raise UsageError(f"config {path} cannot be read: {exc.strerror}") from None
    problems = check_config(document)
    if problems:
        raise UsageError(f"config {path}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    return Config(merge_defaults(document))


def default_config_document() -> dict:
    document = defaults()
    document.pop("escalation")
    for key in ("store", "server", "token_env"):  # the default store needs no line; the others are set by hand
        document.pop(key)
    document["escalation"] = {"notify_cmd": None, "repeat_after_s": 86400}
    return document


def write_default_config(path: str | os.PathLike) -> bool:
    """Create the config file if missing; True when it was created."""
    if os.path.exists(path):
        return False
    atomic_write_json(path, default_config_document())
    return True
