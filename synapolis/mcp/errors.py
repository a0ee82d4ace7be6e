"""Tool and resource errors: the contract's one-line message (`<Type> (exit N): message`) for every failure."""

from __future__ import annotations

import mcp_types as types
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError, UnexpectedToolError
from pydantic import ValidationError

from ..errors import NotFoundError, SynapolisError, UsageError, internal_error


# -- errors ---------------------------------------------------------------------------------------------
def error_line(error: SynapolisError) -> str:
    return f"{error.type_name} (exit {error.exit_code}): {error.message}"


def error_result(error: SynapolisError) -> types.CallToolResult:
    """A tool error: the contract's one-line message as its only content.

    No structured content: it would have to match the tool's output schema, and TypeScript SDK 1.x clients
    (Gemini CLI, the Inspector) validate it even on errors, showing the model a schema error instead of
    ours (issue 12).
    """
    return types.CallToolResult(content=[types.TextContent(type="text", text=error_line(error))], is_error=True)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid arguments: " + "; ".join(parts)


def as_synapolis_error(exc: BaseException, tool: str) -> SynapolisError:
    """What went wrong in a tool call, as the error the CLI would have reported for it."""
    cause = exc.__cause__
    if isinstance(cause, SynapolisError):
        return cause
    if isinstance(exc, ToolError) and not isinstance(exc, UnexpectedToolError):
        if isinstance(cause, ValidationError):
            return UsageError(_validation_message(cause))
        if cause is None and str(exc).startswith("Unknown tool"):
            return UsageError(f"unknown tool {tool!r}: tools/list names the tools")
        return UsageError(str(exc) if cause is None else f"{tool}: {cause}")
    return internal_error(exc if cause is None else cause)



def resource_error(error: SynapolisError) -> ResourceError:
    cls = ResourceNotFoundError if isinstance(error, (NotFoundError, UsageError)) else ResourceError
    return cls(error_line(error))

