"""Names: validation of agent ids, session ids and claim items, and generated ids (contract §2)."""

from __future__ import annotations

import re

from .errors import UsageError
from .timeutil import utcnow

_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_ITEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$")
MAX_ID = 128
MAX_ITEM = 200


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


def validate_agent_id(value, what: str = "agent id") -> str:
    if not isinstance(value, str) or value == "":
        raise UsageError(f"{what} must not be empty (rule: ^[A-Za-z0-9_.-]+$, at most {MAX_ID} characters)")
    if len(value) > MAX_ID:
        raise UsageError(f"{what} {_shown(value)} is longer than {MAX_ID} characters")
    if not _ID_RE.fullmatch(value):
        raise UsageError(f"{what} {_shown(value)} breaks the rule ^[A-Za-z0-9_.-]+$")
    if value in (".", ".."):
        raise UsageError(f"{what} {_shown(value)} may not be '.' or '..'")
    if any(part == "" for part in value.split(".")):
        raise UsageError(f"{what} {_shown(value)} has an empty dot-segment (leading, trailing or doubled '.')")
    return value


def validate_session_id(value, what: str = "session id") -> str:
    if not isinstance(value, str) or value == "":
        raise UsageError(f"{what} must not be empty (rule: ^[A-Za-z0-9_.-]+$, at most {MAX_ID} characters)")
    if len(value) > MAX_ID:
        raise UsageError(f"{what} {_shown(value)} is longer than {MAX_ID} characters")
    if not _ID_RE.fullmatch(value):
        raise UsageError(f"{what} {_shown(value)} breaks the rule ^[A-Za-z0-9_.-]+$")
    if value in (".", ".."):
        raise UsageError(f"{what} {_shown(value)} may not be '.' or '..'")
    return value


def validate_claim_item(value, what: str = "claim item") -> str:
    if not isinstance(value, str) or value == "":
        raise UsageError(f"{what} must not be empty (rule: ^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$)")
    if len(value) > MAX_ITEM:
        raise UsageError(f"{what} {_shown(value)} is longer than {MAX_ITEM} characters")
    if not _ITEM_RE.fullmatch(value):
        raise UsageError(f"{what} {_shown(value)} breaks the rule ^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$")
    if "//" in value:
        raise UsageError(f"{what} {_shown(value)} may not contain '//'")
    if any(part == ".." for part in value.split("/")):
        raise UsageError(f"{what} {_shown(value)} may not contain a '..' segment")
    return value


def is_subagent_of(candidate: str, parent: str) -> bool:
    """True when `candidate` is a strict dot-descendant of `parent` (a.b is under a)."""
    return candidate.startswith(parent + ".")


def slugify(text: str | None) -> str:
    """'Claude Sonnet 4.6' -> 'claude_sonnet_4_6'; at most 24 characters; 'agent' when nothing is left."""
    slug = re.sub(r"[^a-z0-9]+", "_", (text or "").lower()).strip("_")[:24].strip("_")
    return slug or "agent"


def generate_agent_id(substrate: str | None, harness: str | None, conversation_id: str | None = None,
                      deterministic: bool = False) -> str:
    """`<slug>_<8 hex of sha256(conversation id)>_<4 hex>` (contract §2).

    `deterministic` (hooks) takes the 4 hex from the same hash, so every call of one conversation agrees.
    """
    # imported here: hashlib/secrets load OpenSSL (~6 ms), and most CLI calls generate no id
    import hashlib
    import secrets

    slug = slugify(substrate or harness)
    if conversation_id:
        digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()
        middle = digest[:8]
        tail = digest[8:12] if deterministic else secrets.token_hex(2)
    else:
        middle = secrets.token_hex(4)
        tail = secrets.token_hex(2)
    return f"{slug}_{middle}_{tail}"


def generate_session_id() -> str:
    import secrets

    return utcnow().strftime("%Y%m%d_%H%M%S_") + secrets.token_hex(4)
