"""Timestamps: RFC 3339 UTC formatting and parsing, and relative ages for people."""

from __future__ import annotations

import functools
from datetime import datetime, timezone

UTC = timezone.utc


def utcnow() -> datetime:
    return datetime.now(UTC)


def micro_stamp(moment: datetime) -> str:
    """format_ts(moment, micro=True), uncached; for a moment in UTC, datetime's own isoformat (in C, a fifth of
    the time): a send stamps its signal and judges its audience by three of these, each a moment not seen before
    (format_ts's cache would only add a miss). isoformat writes four digits of year, as format_ts does."""
    if moment.tzinfo is UTC:
        return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" off the end
    return format_ts(moment, micro=True)


# cached: a monitor pass formats the same `now` and re-parses the same stamps for every agent
@functools.lru_cache(maxsize=4096)
def format_ts(moment: datetime, micro: bool = False) -> str:
    """RFC 3339 in UTC with a `Z`; seconds precision unless `micro`."""
    moment = moment.astimezone(UTC)
    # %-formatting, not strftime: half the time on every verb's path (three or four stamps a signal), and
    # always four digits of year (glibc's strftime writes year 5 as "5")
    fields = (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second)
    if micro or moment.microsecond:
        return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (*fields, moment.microsecond)
    return "%04d-%02d-%02dT%02d:%02d:%02dZ" % fields


def now_ts(micro: bool = False) -> str:
    return format_ts(utcnow(), micro=micro)


def parse_ts(text: str) -> datetime:
    """Parse an RFC 3339 timestamp; raises ValueError. Naive values are taken as UTC."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"not a timestamp: {text!r}")
    return _parse_ts(text)


@functools.lru_cache(maxsize=32768)
def _parse_ts(text: str) -> datetime:
    value = text.strip()
    if value[-1:] in ("Z", "z"):
        value = value[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        # Python < 3.11 cannot read every RFC 3339 shape; dateutil can, and is only needed here.
        from dateutil import parser as date_parser

        try:
            moment = date_parser.isoparse(text)
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"not an RFC 3339 timestamp: {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def humanize_age(seconds: float | None) -> str:
    """"4m ago", "in 2h" — a relative age for a person."""
    if seconds is None:
        return "-"
    future = seconds < 0
    s = abs(seconds)
    if s < 60:
        text = f"{int(s)}s"
    elif s < 3600:
        text = f"{int(s // 60)}m"
    elif s < 86400:
        text = f"{int(s // 3600)}h"
    else:
        text = f"{int(s // 86400)}d"
    return f"in {text}" if future else f"{text} ago"


def created_moment(entry) -> datetime:
    """When a memory or a ledger line was made: its `created_at` (a datetime, or a stamp parse_ts reads); the
    earliest moment there is when it has neither."""
    value = entry.get("created_at")
    if isinstance(value, datetime):
        return value
    try:
        return parse_ts(value)
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=UTC)
