"""The error classes of synapolis, each carrying the exit code the contract gives it."""

from __future__ import annotations


class SynapolisError(Exception):
    """Base of every error synapolis raises on purpose; `exit_code` is the process exit code."""

    exit_code = 1
    type_name = "InternalError"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def __reduce__(self):
        # Exception pickles as cls(*args), which fails for a class with required arguments
        # (RateLimitedError): rebuild the bare instance, then restore its attributes
        return _rebuild, (type(self), self.args), self.__dict__

    def to_json(self) -> dict:
        return {"error": {"type": self.type_name, "message": self.message, "exit_code": self.exit_code, **self.details}}


class CheckFailed(SynapolisError):
    exit_code = 1
    type_name = "CheckFailed"


class InternalError(SynapolisError):
    exit_code = 1
    type_name = "InternalError"


# No error here subclasses ValueError or an OSError builtin (PermissionError, TimeoutError): the many
# `except (OSError, ValueError)` around reading and parsing files must never swallow a refusal, a bad
# argument or a timeout meant for the caller. A caller that means to catch one names its class.
# NotFoundError alone is also a LookupError (nothing catches LookupError broadly).
class UsageError(SynapolisError):
    exit_code = 2
    type_name = "UsageError"


class ConflictError(SynapolisError):
    exit_code = 3
    type_name = "ConflictError"


class IdentityError(SynapolisError):
    exit_code = 4
    type_name = "NoIdentityError"


class NoIdentityError(IdentityError):
    type_name = "NoIdentityError"


class AmbiguousIdentityError(IdentityError):
    type_name = "AmbiguousIdentityError"


class RateLimitedError(SynapolisError):
    exit_code = 5
    type_name = "RateLimitedError"

    def __init__(self, message: str, retry_after_s: float, **details):
        super().__init__(message, retry_after_s=round(retry_after_s, 3), **details)
        self.retry_after_s = retry_after_s


class NotFoundError(SynapolisError, LookupError):
    exit_code = 6
    type_name = "NotFoundError"


class ForbiddenError(SynapolisError):
    exit_code = 7
    type_name = "ForbiddenError"


class StaleToken(ForbiddenError):
    """A fencing token that is no longer the live holder's."""


class BusyError(SynapolisError):
    exit_code = 8
    type_name = "BusyError"


def _rebuild(cls, args):
    error = cls.__new__(cls, *args)
    error.args = args
    return error


def internal_error(exc: BaseException) -> InternalError:
    """An exception synapolis did not raise on purpose, as the one-line InternalError (exit 1) it reports."""
    if isinstance(exc, OSError):
        where = getattr(exc, "filename", None)
        return InternalError(f"{exc.strerror or exc}" + (f" ({where})" if where else ""))
    return InternalError(f"unexpected {type(exc).__name__}: {exc}")
