"""Whom start_session made each MCP client, by the one rule per transport of docs/MCP.md ("Identity")."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..atomic import atomic_write_json, file_signature, locked, read_json

MAX_REMEMBERED = 10_000  # clients whose identity one server remembers (the SDK's own session limit)
FILE_NAME = "mcp-identities.json"  # in the state directory, mode 0600
_MAX_FILE = 4 << 20  # a planted huge file is ignored, never read whole


@dataclass
class Remembered:
    """The identity start_session gave one client; `principal` is the key (SHA-256) of the token it came with."""

    agent_id: str
    session_id: str
    run_token: str | None
    principal: str | None = None


def stateless_key(token_key: str, client: dict | None) -> tuple:
    """The key of a 2026-07-28 client over HTTP, which has no session: its bearer token (by its SHA-256) and
    the client identity its requests carry in `_meta` (clientInfo: name and version), when they carry one."""
    tag = json.dumps(client, sort_keys=True, separators=(",", ":"), default=str)[:1024] if client else ""
    return ("stateless", token_key, tag)


def _pad(secret: str, label: str, size: int) -> bytes:
    key = secret.encode("utf-8", "surrogatepass")
    out = b""
    counter = 0
    while len(out) < size:
        out += hmac.new(key, f"{label}\0{counter}".encode(), "sha256").digest()
        counter += 1
    return out[:size]


def seal(secret: str, label: str, run_token: str) -> str:
    """A run token kept on disk only as a one-time pad under the bearer token (never stored): the file yields
    no token to whoever reads it without the bearer token, which only its holder presents."""
    data = run_token.encode("utf-8", "surrogatepass")
    return bytes(a ^ b for a, b in zip(data, _pad(secret, label, len(data)))).hex()


def unseal(secret: str, label: str, sealed) -> str | None:
    try:
        data = bytes.fromhex(sealed)
        return bytes(a ^ b for a, b in zip(data, _pad(secret, label, len(data)))).decode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return None


class IdentityMemory:
    """What start_session made each client, newest last. Stateless clients' identities (keyed by token and
    client, `stateless_key`) are also written to `state/mcp-identities.json`, so a restarted server still
    knows them; a handshake-era session or the stdio process dies with the server, and so does its memory."""

    def __init__(self):
        self.kept: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._file: tuple | None = None  # (path, signature, document)

    def recall(self, key, principal_key: str | None, ws=None, secret: str | None = None) -> Remembered | None:
        mem = self.kept.get(key)
        if mem is None and key[0] == "stateless" and ws is not None:
            mem = self._load(ws, key, secret)
        if mem is None or mem.principal != principal_key:
            return None
        self.kept[key] = mem
        self.kept.move_to_end(key)
        return mem

    def remember(self, key, mem: Remembered, ws=None, secret: str | None = None) -> None:
        self.kept[key] = mem
        self.kept.move_to_end(key)
        while len(self.kept) > MAX_REMEMBERED:  # sessions that ended without a DELETE (idle, gone)
            self.kept.popitem(last=False)
        if key[0] == "stateless" and ws is not None:
            self._store(ws, key, mem, secret)

    def forget(self, key) -> None:
        self.kept.pop(key, None)

    # -- the file ---------------------------------------------------------------------------------
    @staticmethod
    def _name(key) -> str:
        return hashlib.sha256("\0".join(key).encode("utf-8", "surrogatepass")).hexdigest()

    def _read(self, path) -> dict:
        signature = file_signature(path)
        cached = self._file
        if cached is not None and cached[0] == path and cached[1] == signature and signature is not None:
            return cached[2]
        try:
            if os.path.getsize(path) > _MAX_FILE:
                return {}
            document = read_json(path)
        except (OSError, ValueError):
            document = {}
        entries = document.get("clients") if isinstance(document, dict) else None
        entries = entries if isinstance(entries, dict) else {}
        self._file = (path, signature, entries)
        return entries

    def _load(self, ws, key, secret) -> Remembered | None:
        entry = self._read(os.path.join(ws.paths.root, FILE_NAME)).get(self._name(key))
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                                  for k in ("agent_id", "session_id", "principal")):
            return None
        token = unseal(secret, self._name(key), entry.get("run_token")) if secret and entry.get("run_token") else None
        return Remembered(entry["agent_id"], entry["session_id"], token, entry["principal"])

    def _store(self, ws, key, mem: Remembered, secret) -> None:
        path = os.path.join(ws.paths.root, FILE_NAME)
        name = self._name(key)
        entry = {"agent_id": mem.agent_id, "session_id": mem.session_id, "principal": mem.principal,
                 "run_token": seal(secret, name, mem.run_token) if secret and mem.run_token else None}
        try:
            with self._lock, locked(ws.paths.lock("mcp-identities"), timeout=2.0):
                entries = dict(self._read(path))
                entries.pop(name, None)
                entries[name] = entry  # newest last: the oldest go first past the limit
                while len(entries) > MAX_REMEMBERED:
                    entries.pop(next(iter(entries)))
                atomic_write_json(path, {"schema_version": 1, "clients": entries}, mode=0o600)
                self._file = None
        except Exception:  # noqa: BLE001 - remembering across restarts is a convenience: the memory still holds it
            pass
