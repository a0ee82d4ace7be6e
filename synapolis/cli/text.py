"""Text for people on a terminal, without click: signal lines, tables, ages, terminal-safe output, the one-line error.

Another agent's content reaches a person's terminal through these (`read-signals`, piggybacked
signals, notes, the whiteboard, status): `terminal_safe` shows control characters as escapes, so no
content can clear the screen, set the title or rewrite a line. JSON output is left as it is (its
encoder escapes C0 controls already, and a program, not a terminal, reads it).
"""

from __future__ import annotations

import sys

from ..errors import SynapolisError
from ..terminal import terminal_safe  # noqa: F401 - the CLI's output helpers use it from here


def ago(stamp, now=None) -> str:
    """How long ago (or until) an RFC 3339 `stamp` is, for people: "4m ago", "in 2h"; "-" when missing or unreadable."""
    from ..timeutil import humanize_age, parse_ts, utcnow

    if not stamp:
        return "-"
    try:
        return humanize_age(((now or utcnow()) - parse_ts(stamp)).total_seconds())
    except (TypeError, ValueError):
        return "-"


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Aligned columns for people."""
    cells = [headers] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def one_line(text, width: int = 100) -> str:
    """`text` on one line (white space folded), cut to `width` characters with "..."."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def signal_line(s: dict) -> str:
    """One signal as one line: sequence, id, age, sender -> recipient, type, flags, content."""
    flags = []
    if s.get("read"):
        flags.append("read")
    elif "read" in s:
        flags.append("unread")
    if s.get("reply_to"):
        flags.append(f"re {s['reply_to'][:8]}")
    extra = f" ({', '.join(flags)})" if flags else ""
    sender = f"{s['person']} (person)" if s.get("person") else s["sender"]  # a person wrote it (synapolis.people)
    return (f"#{s['sequence']:<5} {s['id'][:12]}  {ago(s['timestamp']):>8}  {sender} -> {s['recipient']}  "
            f"[{s['type']}]{extra}  {one_line(s['content'])}")


def more_line(count: int, what: str, how: str) -> str:
    """The last line of a page that is not the end: how many are left (counted up to a cap) and how to go on."""
    from ..signals import COUNT_CAP

    many = f"{count}+" if count >= COUNT_CAP else str(count)
    return f"-- {many} more {what}: {how}"


def with_pending(lines, data: dict) -> list[str]:
    """The verb's own text, then the signals this response delivered (contract §7)."""
    lines = [lines] if isinstance(lines, str) else list(lines)
    pending = data.get("pending_signals") or []
    if pending:
        lines.append(f"-- {len(pending)} pending signal(s), delivered now; ack with `synapolis ack-signals ID`:")
        lines += [signal_line(s) for s in pending]
    if data.get("pending_remaining"):
        lines.append(more_line(data["pending_remaining"], "undelivered", "`synapolis signals-pending` delivers them"))
    return lines


def render(data: dict, text=None) -> str:
    """What `emit` prints for people: `text(data)` (a string or lines), or indented JSON; terminal-safe."""
    if text is None:
        import json

        out = json.dumps(data, indent=2, ensure_ascii=False)
    else:
        out = text(data)
        if isinstance(out, (list, tuple)):
            out = "\n".join(out)
    return terminal_safe(out) if out else ""


def put(text: str, err: bool = False) -> None:
    """`text` and a newline on stdout (stderr), as click.echo writes it: nothing when the stream is closed."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    stream.write(text + "\n")
    stream.flush()


def report_error(error: SynapolisError, as_json: bool) -> None:
    """The contract's error: one JSON object on stdout with --json, one terminal-safe line on stderr.
    Without click: the fast path (synapolis.cli.fast) reports through here too."""
    if as_json:
        import json

        put(json.dumps(error.to_json()))
    # one line, whatever the message holds: a path or value with a newline in it must not split the error
    # (nor forge a second "synapolis: ..." line), and click's own messages ("Choose from:\n\t...") fold up
    message = " ".join(part.strip() for part in error.message.splitlines() if part.strip()).replace("\t", " ")
    put(terminal_safe(f"synapolis: {error.type_name}: {message}"), err=True)
