"""What the store keeps of a run token: `sha256:` and the token's SHA-256, never the token (docs/SECURITY.md)."""

from __future__ import annotations

from ..names import sha256_hex

TOKEN_HASH_PREFIX = "sha256:"


def hash_token(token: str) -> str:
    """What the store keeps of a run token. The program only ever compares a presented token with it, so
    a copy of session.db (a backup, another user who can read it) never yields a token to act with."""
    # surrogatepass: a token from argv or the environment that is not UTF-8 hashes to something that
    # matches nothing (exit 7), rather than failing to encode
    return TOKEN_HASH_PREFIX + sha256_hex(str(token).encode("utf-8", "surrogatepass"))


def is_hashed(stored) -> bool:
    return isinstance(stored, str) and stored.startswith(TOKEN_HASH_PREFIX)
