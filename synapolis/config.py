"""The config file `synapolis.json`: its defaults, loading and the checks on its values."""

from __future__ import annotations

import os

from .atomic import atomic_write_json, read_json
from .errors import UsageError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
STORE_RULE = '"sqlite" or a postgresql:// URL'  # what `store` (and SYNAPOLIS_STORE_URL) may be


def is_store_url(value) -> bool:
    """Whether `value` names a store synapolis has: "sqlite", or a PostgreSQL URL (by its scheme; whether
    the rest parses is store_url_problem's question)."""
    return isinstance(value, str) and (value == "sqlite" or value.startswith(POSTGRES_SCHEMES))


def store_url_problem(url: str) -> str | None:
    """Why a postgresql:// URL does not parse, as a sentence that quotes none of it (it may hold a password:
    pgurl.py), or None. Checked where the URL is read, so nothing past that point ever meets one that did
    not parse and echoes it (libpq's own errors quote the text they refuse)."""
    from .pgurl import problem

    reason = problem(url)
    return None if reason is None else (f"the postgresql:// URL does not parse: {reason}; nothing of it is "
                                        "shown, since it may hold a password")


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
    # targets told of incidents, guard denials and deadlocks: [{url, format, events?}] (contract §15)
    "notify": [],
    # the harness pre-tool hook and auto-claims (contract §14): "deny" | "warn" | "off"
    "guard": {"mode": "deny", "auto_claim": False},
}
GUARD_MODES = ("deny", "warn", "off")


def defaults() -> dict:
    """A fresh copy of DEFAULTS (one nested object, so no need to load `copy` for a deep copy)."""
    return {**DEFAULTS, "escalation": dict(DEFAULTS["escalation"]), "notify": [], "guard": dict(DEFAULTS["guard"])}


_DURATIONS = ("stale_after_s", "dead_after_s", "clock_skew_s", "claim_ttl_s", "redeliver_after_s")
# The largest value of each whole-number key that the code handles (standards/config.schema.json says the
# same): content is held in memory several times over and 16 MiB is far beyond any signal or note; a rate
# past a million per minute or a SQLite timeout past ten minutes stops meaning anything (and 1e20 overflows
# the float and C int they become). monitor_keep: every pass lists and prunes monitor-history/, and 100,000
# snapshots of even a small swarm are gigabytes; `monitor --keep` takes the same bound (README, "Config bounds").
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
        elif document["store"] != "sqlite":
            reason = store_url_problem(document["store"].strip())
            if reason:
                problems.append(f"store: {reason}")
    if "notify" in document:
        problems.extend(check_targets(document["notify"]))
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
    problems.extend(_guard_problems(document.get("guard", {})))
    return problems


def _guard_problems(guard) -> list[str]:
    if not isinstance(guard, dict):
        return ["guard must be an object"]
    problems = [f"unknown key guard.{key}" for key in guard if key not in DEFAULTS["guard"]]
    if "mode" in guard and guard["mode"] not in GUARD_MODES:
        problems.append(f"guard.mode must be one of {', '.join(GUARD_MODES)}, not {guard['mode']!r}")
    if "auto_claim" in guard and not isinstance(guard["auto_claim"], bool):
        problems.append("guard.auto_claim must be true or false")
    return problems


NOTIFY_FORMATS = ("cloudevents", "slack", "ntfy")  # contract §15
_TARGET_KEYS = ("url", "format", "events")


def check_targets(value) -> list[str]:
    """Every problem with the config's `notify` value (contract §15), as readable lines (check_config uses it)."""
    if not isinstance(value, list):
        return ["notify must be a list of targets ({url, format, events?})"]
    problems = []
    for n, target in enumerate(value):
        where = f"notify[{n}]"
        if not isinstance(target, dict):
            problems.append(f"{where} must be an object with url and format")
            continue
        for key in target:
            if key not in _TARGET_KEYS:
                problems.append(f"unknown key {where}.{key}")
        url = target.get("url")
        if not _is_http_url(url):
            problems.append(f"{where}.url must be an http:// or https:// URL with a host, not {url!r}")
        if target.get("format") not in NOTIFY_FORMATS:
            problems.append(f"{where}.format must be one of {', '.join(NOTIFY_FORMATS)}, not {target.get('format')!r}")
        events = target.get("events")
        if events is not None and not (isinstance(events, list) and events
                                       and all(isinstance(e, str) and e.strip() for e in events)):
            problems.append(f"{where}.events must be a non-empty list of event types (or patterns like "
                            f"io.synapolis.incident.*)")
    return problems


def _is_http_url(url) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        return bool(parts and parts.scheme in ("http", "https") and parts.hostname)
    except ValueError:  # a bad port or bracket
        return False


class Config:
    """The effective configuration: defaults overlaid with the file's values."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("values",)

    def __init__(self, values: dict | None = None):
        self.values = defaults() if values is None else values

    def __repr__(self) -> str:
        # never the store URL as written: it may hold a password (a repr lands in logs and tracebacks)
        store = self.values.get("store")
        if isinstance(store, str) and store != "sqlite":
            from .pgurl import describe

            return f"Config(values={ {**self.values, 'store': describe(store)}!r})"
        return f"Config(values={self.values!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.values == self.values

    __hash__ = None  # like the frozen dataclass it was: `values` is a dict

    def __getattr__(self, name):
        if name == "values":  # not set yet (copy, unpickling): no recursion through self.values
            raise AttributeError(name)
        return self._value(name)

    # the keys every send reads, as properties: a name __getattr__ answers is found only after the normal lookup
    # failed (an exception raised and caught inside Python, four times a send)
    stale_after_s = property(lambda self: self._value("stale_after_s"))
    clock_skew_s = property(lambda self: self._value("clock_skew_s"))
    rate_limit_per_min = property(lambda self: self._value("rate_limit_per_min"))
    max_content_bytes = property(lambda self: self._value("max_content_bytes"))

    def _value(self, name):
        try:
            return self.values[name]
        except KeyError:  # a missing key is a missing attribute (getattr's default applies)
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
    def guard_mode(self) -> str:
        return self.values.get("guard", DEFAULTS["guard"]).get("mode", "deny")

    @property
    def auto_claim(self) -> bool:
        return bool(self.values.get("guard", DEFAULTS["guard"]).get("auto_claim", False))

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
        if key in ("escalation", "guard") and isinstance(value, dict):
            values[key].update(value)
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
    document.pop("notify")  # nobody is told until targets are set by hand (README: "Being told")
    document["escalation"] = {"notify_cmd": None, "repeat_after_s": 86400}
    return document


def write_default_config(path: str | os.PathLike) -> bool:
    """Create the config file if missing; True when it was created."""
    if os.path.exists(path):
        return False
    atomic_write_json(path, default_config_document())
    return True
