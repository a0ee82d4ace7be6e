"""Names: validation of agent ids, session ids, claim items and free text, and generated ids (contract §2)."""

from __future__ import annotations

import os
import re

from .errors import ForbiddenError, UsageError

# ^[A-Za-z0-9_.-]+$ without `re`: a string made only of these is empty once stripped of them (no compile
# on every CLI call)
ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
# a pattern, compiled by `re` on first use: only claims need it (0.2 ms of every CLI call otherwise)
_ITEM_PATTERN = r"^[A-Za-z0-9._*?\[\]][A-Za-z0-9_.:/@+*?\[\]-]*$"
ITEM_RULE = "^[A-Za-z0-9._*?\\[\\]][A-Za-z0-9_.:/@+*?\\[\\]-]*$, no '.' or '..' segment, no '//'"
MAX_ID = 128
MAX_ITEM = 200
# the names synapolis itself speaks with (the watchdog's warnings come from `synapolis.watchdog`):
# `synapolis` and everything under it, in any case, so nobody registers one, acts as one or sends as one
RESERVED_ROOT = "synapolis"
# a person who posts (the dashboard): `synapolis.person.<name>`, under the reserved root (synapolis.people)
PERSON_PREFIX = RESERVED_ROOT + ".person."


def sha256_hex(data: bytes) -> str:
    """SHA-256 of `data` in hex: agent ids, signal ids and run tokens (contract §2, §5).

    Through hashlib, imported here because it loads OpenSSL (about 3 ms of a CLI call;
    benchmarks/RESULTS.md): a beat without a run token never pays it. No SHA-256 of our own and no
    private module (Python's `_sha256`, `_sha2` in 3.12): hashlib is the well-kept implementation."""
    from hashlib import sha256

    return sha256(data).hexdigest()


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


def _check_id(value, what: str) -> str:
    """The rules agent ids and session ids share: non-empty, <= 128, ^[A-Za-z0-9_.-]+$, not . or .."""
    if not isinstance(value, str) or value == "":
        raise UsageError(f"{what} must not be empty (rule: ^[A-Za-z0-9_.-]+$, at most {MAX_ID} characters)")
    if len(value) > MAX_ID:
        raise UsageError(f"{what} {_shown(value)} is longer than {MAX_ID} characters")
    if not only_id_chars(value):
        raise UsageError(f"{what} {_shown(value)} breaks the rule ^[A-Za-z0-9_.-]+$")
    if value in (".", ".."):
        raise UsageError(f"{what} {_shown(value)} may not be '.' or '..'")
    return value


def only_id_chars(value: str) -> bool:
    """Whether `value` matches ^[A-Za-z0-9_.-]+$ (one character or more, nothing else, no newline)."""
    return value != "" and not value.strip(ID_CHARS)


def validate_agent_id(value, what: str = "agent id") -> str:
    _check_id(value, what)
    if "" in value.split("."):  # an empty dot-segment (a test in C: no generator on every call)
        raise UsageError(f"{what} {_shown(value)} has an empty dot-segment (leading, trailing or doubled '.')")
    return value


def is_reserved(agent_id: str) -> bool:
    """True for the names synapolis keeps for itself: `synapolis` and its sub-agents, in any case."""
    folded = agent_id.lower()
    return folded == RESERVED_ROOT or folded.startswith(RESERVED_ROOT + ".")


def refuse_reserved(agent_id: str, what: str = "agent id") -> str:
    """`agent_id`, or ForbiddenError (exit 7) when it is one of synapolis's own names."""
    if is_reserved(agent_id):
        raise ForbiddenError(f"{what} {_shown(agent_id)} is reserved: synapolis and synapolis.* are the "
                             "system's own names (its watchdog warns as synapolis.watchdog); pick another")
    return agent_id


def validate_session_id(value, what: str = "session id") -> str:
    return _check_id(value, what)


WORD_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


def is_name(item: str) -> bool:
    """A `word:` item (`ticket:142`) is a name, compared as a whole; every other item is a path pattern (§14)."""
    head, sep, _rest = item.partition(":")
    return bool(sep) and head != "" and not head.strip(WORD_CHARS)


def validate_claim_item(value, what: str = "claim item") -> str:
    """A claim item (contract §2): a `word:` name, or a path pattern relative to the project (§14)."""
    if not isinstance(value, str) or value == "":
        raise UsageError(f"{what} must not be empty (rule: {ITEM_RULE})")
    if len(value) > MAX_ITEM:
        raise UsageError(f"{what} {_shown(value)} is longer than {MAX_ITEM} characters")
    if not re.fullmatch(_ITEM_PATTERN, value):
        raise UsageError(f"{what} {_shown(value)} breaks the rule {ITEM_RULE}")
    if "//" in value:
        raise UsageError(f"{what} {_shown(value)} may not contain '//'")
    if any(part in (".", "..") for part in value.split("/")):
        raise UsageError(f"{what} {_shown(value)} may not contain a '.' or '..' segment")
    if not is_name(value):
        from .pathpatterns import PatternError, check_pattern

        try:
            check_pattern(value)
        except PatternError as exc:
            raise UsageError(f"{what} {_shown(value)} is not a readable path pattern: {exc}") from None
    return value


def check_text(value, what: str) -> str:
    """`value` when it is text that can be stored as UTF-8; UsageError (exit 2) otherwise.

    Python hands command-line bytes that are not UTF-8 over as lone surrogates ('\\udcff'); they
    pass every length check and then fail deep inside a JSON or SQLite write, so refuse them first.
    """
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8 text") from None
    return value


def check_content(value, what: str, config, allow_empty: bool = False) -> str:
    """Text an agent stores for others (a signal's content, a note, a whiteboard value): valid UTF-8 text,
    not empty unless `allow_empty`, at most `config.max_content_bytes` bytes of it; UsageError otherwise."""
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text")
    if not value and not allow_empty:
        raise UsageError(f"{what} is empty")
    try:
        size = len(value.encode("utf-8"))  # check_text's test and the size in one encoding
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8 text") from None
    if size > int(config.max_content_bytes):
        raise UsageError(f"{what} is {size} bytes, more than max_content_bytes={config.max_content_bytes}")
    return value


def check_limit(limit, *, optional: bool = True) -> None:
    """A page size: a whole number >= 1 (or None, the verb's default, when `optional`); UsageError otherwise."""
    if limit is None and optional:
        return
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise UsageError(f"limit must be a positive whole number, not {limit!r}")


def id_chain(agent_id: str) -> list[str]:
    """The agent and each agent it is a sub-agent of ("a.b.c": a, a.b, a.b.c): whom a signal to it may reach,
    and whom a broadcast from it does not."""
    if "." not in agent_id:  # most ids: an agent itself, no chain to build
        return [agent_id]
    parts = agent_id.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


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
    # os.urandom(n).hex() is what secrets.token_hex(n) returns, without loading secrets (and with it
    # hmac, hashlib and OpenSSL): a hook derives an id on every call
    slug = slugify(substrate or harness)
    if conversation_id:
        digest = sha256_hex(conversation_id.encode("utf-8"))
        middle = digest[:8]
        tail = digest[8:12] if deterministic else os.urandom(2).hex()
    else:
        middle = os.urandom(4).hex()
        tail = os.urandom(2).hex()
    return f"{slug}_{middle}_{tail}"


def generate_session_id() -> str:
    from .timeutil import utcnow  # datetime: not on a quiet hook's path, which needs only ID_CHARS

    return utcnow().strftime("%Y%m%d_%H%M%S_") + os.urandom(4).hex()


def normalise_memory(text: str) -> str:
    """The form duplicate memories are found by (sleep's merge, the ledger's holdings): NFC, case-folded,
    white-space runs made one space, trimmed."""
    import unicodedata  # only a merge or a ledger read asks

    return " ".join(unicodedata.normalize("NFC", text).casefold().split())
