"""Text bound for a person's terminal, made safe: another agent's content must not drive the terminal."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (8-bit CSI/OSC...), and the bidirectional overrides
# and isolates that make text display in another order than it reads ("trojan source")
# (compiled on first use: text that is plain printable ASCII, most of what the CLI prints, needs no pattern)
_UNSAFE = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"


def _escape(match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` with every character a terminal would act on shown as an escape (`\\x1b`); tabs, newlines kept."""
    if text.isascii() and text.replace("\n", "").replace("\t", "").isprintable():
        return text  # ASCII's unsafe characters are exactly its unprintable ones (C0 and DEL)
    return re.sub(_UNSAFE, _escape, text)
