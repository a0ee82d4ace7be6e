"""The paths a Codex `apply_patch` envelope writes: every file it adds, updates, deletes or moves to.

Codex's patch format (codex-rs/apply-patch, the tool's own grammar) is a `*** Begin Patch` ... `*** End
Patch` envelope whose file operations are header lines: `*** Add File: PATH`, `*** Update File: PATH`
(optionally followed by `*** Move to: NEW PATH`) and `*** Delete File: PATH`. The envelope reaches a
PreToolUse hook as `tool_input.command` (or, as a shell call, inside `apply_patch <<'EOF' ... EOF`), so
headers are looked for on every line, wherever the envelope starts. A header counts only at the start of
a line (Codex's own parser trims the line first, so leading blanks are allowed too); a `+` or `-` line of a
hunk that merely contains such text is content, not a header.
"""

from __future__ import annotations

HEADERS = ("*** Add File:", "*** Update File:", "*** Delete File:", "*** Move to:")


def patch_paths(text) -> list[str]:
    """The paths named by the envelope's file headers, in order, each once; [] for anything else."""
    if not isinstance(text, str):
        return []
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        for header in HEADERS:
            if stripped.startswith(header):
                path = stripped[len(header):].strip()
                if path and path not in found:
                    found.append(path)
                break
    return found


def tool_input_patch(tool_input) -> str | None:
    """The patch text of an apply_patch call's `tool_input`: `command` (Codex's shape), else `input` or
    `patch` (the freeform and older spellings); a bare string is the patch itself."""
    if isinstance(tool_input, str):
        return tool_input
    if not isinstance(tool_input, dict):
        return None
    for key in ("command", "input", "patch"):
        value = tool_input.get(key)
        if isinstance(value, list):  # a shell call as argv: ["apply_patch", "<patch>"]
            value = "\n".join(v for v in value if isinstance(v, str))
        if isinstance(value, str):
            return value
    return None
