"""The sender of notifications (contract §15): renders each format, posts with retries, logs what still fails.

Run detached by `notify.hand_over` as `python -m synapolis.notify_send SPOOL` (the spool file is removed
first thing); `notify test` calls `deliver` directly. Retries are urllib3's: at most 3 tries of one POST
(a refused connection, a timeout and a status of 400 or more all count as failures), with backoff, and
each target's whole pass ends within 30 s (DEADLINE_S). The CloudEvent is built by the `cloudevents` SDK.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

TRIES = 3
DEADLINE_S = 30.0
TRY_TIMEOUT_S = 8.0  # 3 tries of 8 s and the backoff sleeps (0 s, then 3 s) stay within DEADLINE_S
BACKOFF_FACTOR = 1.5
FAILURE_LOG_MAX = 1024 * 1024  # notify-failures.jsonl past this moves to notify-failures.jsonl.1


def wants(target: dict, event_type: str) -> bool:
    """Whether `target` takes events of `event_type`: all of them without `events`, else the listed types or
    shell-style patterns (`io.synapolis.incident.*`)."""
    events = target.get("events")
    if not events:
        return True
    from fnmatch import fnmatchcase

    return any(fnmatchcase(event_type, pattern) for pattern in events)


def redact(url: str) -> str:
    """The target's URL as logs and reports show it: without user, password or query (ntfy takes an access
    token as `?auth=`), so no secret of the person's own lands in a file either."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "(bad url)"


def _header_text(text: str) -> str:
    """A header value HTTP can carry: ASCII as it is, anything else as RFC 2047 UTF-8 (ntfy decodes it)."""
    text = " ".join(str(text).split())[:250]
    if text.isascii():
        return text
    import base64

    return "=?UTF-8?B?" + base64.b64encode(text.encode("utf-8")).decode("ascii") + "?="


def render(fmt: str, msg: dict) -> tuple[dict, bytes]:
    """(headers, body) of one message in one target format."""
    if fmt == "cloudevents":
        from cloudevents.core.bindings.http import to_structured
        from cloudevents.core.formats.json import JSONFormat
        from cloudevents.core.v1.event import CloudEvent

        from .timeutil import parse_ts

        attributes = dict(msg["event"])
        data = attributes.pop("data")
        attributes["time"] = parse_ts(attributes["time"])
        out = to_structured(CloudEvent(attributes, data), JSONFormat())
        return dict(out.headers), out.body
    if fmt == "slack":
        return {"content-type": "application/json"}, json.dumps({"text": msg["line"]}, ensure_ascii=False).encode("utf-8")
    if fmt == "ntfy":
        return ({"content-type": "text/plain; charset=utf-8", "Title": _header_text(msg["title"]),
                 "Priority": msg["priority"], "Tags": ",".join(msg["tags"])}, msg["line"].encode("utf-8"))
    raise ValueError(f"unknown format {fmt!r}")


def _retry(backoff_factor: float):
    from urllib3.util.retry import Retry

    # every method (a POST is not idempotent to urllib3, but a duplicate notice is better than none, and the
    # CloudEvent id lets a receiver drop it); Retry-After is not obeyed, or one answer could hold a pass for hours
    return Retry(total=TRIES - 1, connect=TRIES - 1, read=TRIES - 1, status=TRIES - 1, other=TRIES - 1,
                 allowed_methods=None, status_forcelist=set(range(400, 600)), backoff_factor=backoff_factor,
                 backoff_max=10, raise_on_status=False, respect_retry_after_header=False, redirect=False)


def deliver(target: dict, msg: dict, backoff_factor: float = BACKOFF_FACTOR, timeout_s: float = TRY_TIMEOUT_S) -> dict:
    """POST one message to one target, retried; {"url", "format", "ok", "status", "tries", "error"}. Never raises."""
    import urllib3

    result = {"url": redact(target.get("url", "")), "format": target.get("format"), "ok": False, "status": None,
              "tries": 0, "error": None}
    try:
        headers, body = render(target["format"], msg)
    except Exception as exc:  # noqa: BLE001 - a message that cannot be rendered is this target's failure
        result["error"] = f"cannot render: {type(exc).__name__}: {exc}"
        return result
    try:
        with urllib3.PoolManager(retries=_retry(backoff_factor), timeout=urllib3.Timeout(total=timeout_s)) as pool:
            response = pool.request("POST", target["url"], body=body, headers=headers, preload_content=True)
    except urllib3.exceptions.MaxRetryError as exc:
        result.update(tries=TRIES, error=f"no answer after {TRIES} tries: {_reason(exc.reason)}")
        return result
    except Exception as exc:  # noqa: BLE001 - a bad URL or a failure urllib3 does not retry
        result.update(tries=1, error=f"{type(exc).__name__}: {exc}")
        return result
    history = response.retries.history if response.retries is not None else ()
    result.update(status=response.status, tries=len(history) + 1, ok=200 <= response.status < 300)
    if not result["ok"]:
        result["error"] = f"HTTP {response.status}" + (f" after {result['tries']} tries" if result["tries"] > 1 else "")
    return result


def _reason(reason) -> str:
    text = str(reason)
    # urllib3's reasons repeat the pool object's repr; the end says what happened
    return text.split(": ", 1)[-1] if ">: " in text else text


def send_pass(targets: list, messages: list, backoff_factor: float = BACKOFF_FACTOR,
              deadline_s: float = DEADLINE_S) -> list:
    """Send one pass: each target in its own thread, its messages in order; a target whose message still
    fails after its tries (or whose deadline passes) gets no more of this pass. One summary per target."""
    summaries = [{"url": redact(t.get("url", "")), "format": t.get("format"), "delivered": 0, "undelivered": 0,
                  "results": [], "error": None} for t in targets]
    started = time.monotonic()

    def run(target, summary):
        mine = [m for m in messages if wants(target, m["event"]["type"])]
        for n, msg in enumerate(mine):
            left = deadline_s - (time.monotonic() - started)
            if left <= 0:
                summary["undelivered"] = len(mine) - n
                summary["error"] = summary["error"] or f"no time left within {deadline_s:g} s"
                return
            result = deliver(target, msg, backoff_factor, timeout_s=min(TRY_TIMEOUT_S, left / TRIES))
            result["id"], result["type"] = msg["event"]["id"], msg["event"]["type"]
            summary["results"].append(result)
            if not result["ok"]:
                summary["undelivered"] = len(mine) - n
                summary["error"] = result["error"]
                return
            summary["delivered"] += 1

    threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in zip(targets, summaries)]
    for thread in threads:
        thread.start()
    for thread, summary in zip(threads, summaries):
        thread.join(max(0.0, deadline_s + 1 - (time.monotonic() - started)))
        if thread.is_alive():
            summary["error"] = f"no answer within {deadline_s:g} s"
            summary["undelivered"] = summary["undelivered"] or 1
    return summaries


def log_failures(path: str, summaries: list) -> None:
    """One line per target still failing after this pass (never the URL's credentials or query)."""
    from .timeutil import now_ts

    lines = [json.dumps({"at": now_ts(), "url": s["url"], "format": s["format"], "error": s["error"],
                         "delivered": s["delivered"], "undelivered": s["undelivered"],
                         "event_ids": [r["id"] for r in s["results"] if not r["ok"]]}) + "\n"
             for s in summaries if s["error"]]
    if not lines:
        return
    try:
        if os.path.getsize(path) > FAILURE_LOG_MAX:  # a target down for weeks: keep one older file, not all
            os.replace(path, path + ".1")
    except OSError:
        pass
    try:
        # one short write per line with O_APPEND: two senders at once never interleave within a line
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            for line in lines:
                os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:
        pass


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m synapolis.notify_send SPOOL_FILE\n")
        return 2
    try:
        with open(args[0], encoding="utf-8") as handle:
            spool = json.load(handle)
    except (OSError, ValueError):
        return 1
    finally:
        try:
            os.unlink(args[0])
        except OSError:
            pass
    summaries = send_pass(spool["targets"], spool["messages"])
    log_failures(spool["failure_log"], summaries)
    return 0 if not any(s["error"] for s in summaries) else 1


if __name__ == "__main__":
    # os._exit: a thread still hanging on a receiver past the deadline must not keep the process alive
    code = main()
    sys.stdout.flush()
    os._exit(code)
