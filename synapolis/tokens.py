"""Bearer tokens for the team server (contract §13): create (shown once), list, revoke, verify.

Only a token's SHA-256 is kept, in `state/tokens.json` (mode 0600 from its creation). A presented token
is hashed and compared with every stored hash in constant time (`hmac.compare_digest`). The server
re-reads the file when it changes, so a revocation applies to the next request. The last-used time is
written at most once a minute per token, so a busy client does not rewrite the file on every request.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from datetime import datetime

from .atomic import atomic_write_json, locked, read_json
from .errors import ConflictError, NotFoundError, UsageError
from .names import sha256_hex, validate_agent_id
from .timeutil import format_ts, parse_ts, utcnow

PREFIX = "syn_"  # says what a token is when it turns up in a log or a config file
LAST_USED_GRANULARITY_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MAX_FILE = 4 << 20  # a planted huge file reads as invalid, never exhausts the server


def digest(token: str) -> str:
    return sha256_hex(token.encode("utf-8", "surrogatepass"))


def validate_name(name) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"token name {name!r} breaks the rule ^[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}$")
    return name


def _read(ws) -> list[dict]:
    """The stored token records; none when the file is missing. A damaged file is a usage error: the
    server refuses every token rather than guess."""
    path = ws.files.tokens
    try:
        if os.path.getsize(path) > _MAX_FILE:
            raise UsageError(f"{path} is larger than {_MAX_FILE} bytes: not a token file")
        document = read_json(path)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    records = document.get("tokens") if isinstance(document, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and isinstance(r.get("sha256"), str)
                                                 and isinstance(r.get("name"), str) for r in records):
        raise UsageError(f"{path} is not a token file (expected {{\"tokens\": [...]}})")
    return records


def _write(ws, records: list[dict]) -> None:
    atomic_write_json(ws.files.tokens, {"schema_version": 1, "tokens": records}, mode=0o600)


def public(record: dict) -> dict:
    """A record as `tokens list` shows it: never the hash."""
    return {k: record.get(k) for k in ("name", "agent_id", "read_only", "created_at", "last_used_at")}


def create(ws, name: str, *, agent_id: str | None = None, read_only: bool = False,
           now: datetime | None = None) -> dict:
    """A new token: `{"token": <shown once>, **its public record}`; ConflictError when the name is taken."""
    validate_name(name)
    if agent_id is not None:
        validate_agent_id(agent_id)
    ws.ensure()
    token = PREFIX + secrets.token_urlsafe(32)
    record = {"name": name, "sha256": digest(token), "agent_id": agent_id, "read_only": bool(read_only),
              "created_at": format_ts(now or utcnow()), "last_used_at": None}
    with locked(ws.paths.lock("tokens")):
        records = _read(ws)
        if any(r["name"] == name for r in records):
            raise ConflictError(f"a token named {name!r} exists: revoke it first, or pick another name")
        _write(ws, records + [record])
    return {"token": token, **public(record)}


def list_tokens(ws) -> dict:
    return {"tokens": [public(r) for r in _read(ws)]}


def revoke(ws, name: str) -> dict:
    validate_name(name)
    with locked(ws.paths.lock("tokens")):
        records = _read(ws)
        gone = [r for r in records if r["name"] == name]
        if not gone:
            raise NotFoundError(f"no token named {name!r}")
        _write(ws, [r for r in records if r["name"] != name])
    return {"revoked": public(gone[0])}


def exist(ws) -> bool:
    try:
        return bool(_read(ws))
    except UsageError:
        return True  # a file is there; serve's "no token yet" guard must not open a wide address on a guess


def match(records: list[dict], presented) -> dict | None:
    """The record whose hash is the presented token's, compared in constant time with every record."""
    if not isinstance(presented, str) or not presented or len(presented) > 512:
        return None
    wanted = digest(presented)
    found = None
    for record in records:
        if hmac.compare_digest(wanted, record["sha256"]):
            found = record
    return found


class TokenBook:
    """The server's view of tokens.json: re-read whenever the file changed (revocation applies to the next
    request), with last-used times written back at most once a minute per token."""

    def __init__(self, ws):
        self.ws = ws
        self._signature = None
        self._records: list[dict] = []

    def _current(self) -> list[dict]:
        from .atomic import file_signature

        signature = file_signature(self.ws.files.tokens)
        if signature != self._signature or signature is None:
            try:
                self._records = _read(self.ws)
            except UsageError:
                self._records = []  # a damaged file admits nobody
            self._signature = signature
        return self._records

    def verify(self, presented, now: datetime | None = None) -> dict | None:
        """The public record of a valid token (its last use noted), else None."""
        record = match(self._current(), presented)
        if record is None:
            return None
        now = now or utcnow()
        last = record.get("last_used_at")
        if last is None or _age_s(last, now) >= LAST_USED_GRANULARITY_S:
            self._note_use(record["name"], record["sha256"], now)
        return public(record)

    def _note_use(self, name: str, sha: str, now: datetime) -> None:
        try:
            with locked(self.ws.paths.lock("tokens"), timeout=1.0):
                records = _read(self.ws)
                for r in records:
                    if r["name"] == name and r["sha256"] == sha:
                        r["last_used_at"] = format_ts(now)
                        _write(self.ws, records)
                        break
        except Exception:  # noqa: BLE001 - bookkeeping: a busy or full disk must not refuse a valid token
            pass


def _age_s(stamp, now: datetime) -> float:
    try:
        return (now - parse_ts(stamp)).total_seconds()
    except (TypeError, ValueError):
        return float("inf")  # a damaged stamp is rewritten
