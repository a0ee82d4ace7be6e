"""The front's static answers (mcp/front.py), asked of the real server over stdio: `python -m synapolis.mcp.snapshot`
writes synapolis/mcp/static.json; run it after changing a tool, the instructions or the MCP SDK (a test says so)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time

from . import front

# `synapolis mcp` as it was before the front: the SDK answers everything (the reference the front must equal)
SDK_ONLY = ("import sys; from synapolis.mcp.server import create_server; "
            "create_server(sys.argv[1]).run('stdio')")
CLIENT = {"name": "synapolis-snapshot", "version": "0"}


class Wire:
    """A server process spoken to in raw JSON-RPC lines: `ask` sends one request and returns its answer."""

    def __init__(self, cmd: list[str], env: dict | None = None, timeout: float = 60):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)
        self.timeout, self._pending, self._next = timeout, b"", 0
        self.passed: list[dict] = []  # messages `ask` read past (notifications, answers to other ids)

    def send(self, message) -> None:
        self.proc.stdin.write((message if isinstance(message, str) else json.dumps(message)).encode() + b"\n")
        self.proc.stdin.flush()

    def line(self) -> dict:
        deadline = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within {self.timeout} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the server closed its output: " + self.proc.stderr.read().decode()[-2000:])
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def ask(self, method: str, params=None, request_id=None) -> dict:
        """The answer (result or error, whole message) to one request; notifications in between are skipped."""
        if request_id is None:
            self._next += 1
            request_id = self._next
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method,
                   **({} if params is None else {"params": params})})
        while True:
            message = self.line()
            if message.get("id") == request_id and "method" not in message:
                return message
            self.passed.append(message)

    def close(self) -> int:
        """Close stdin; the exit code, once everything the server still wrote is in `passed`."""
        self.proc.stdin.close()
        try:
            while True:
                self.passed.append(self.line())
        except EOFError:
            pass
        try:
            return self.proc.wait(timeout=self.timeout)
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


def sdk_only(state_dir) -> list[str]:
    return [sys.executable, "-c", SDK_ONLY, str(state_dir)]


def envelope(version: str) -> dict:
    return {"_meta": {front.VERSION_KEY: version, front.INFO_KEY: CLIENT, front.CAPABILITIES_KEY: {}}}


def take(state_dir) -> dict:
    """Every static answer, from the SDK-only server on `state_dir`."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

    snapshot = {"fingerprint": front.fingerprint(), "latest_handshake": LATEST_HANDSHAKE_VERSION,
                "handshake": {}, "modern": {}}
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        wire = Wire(sdk_only(state_dir))
        try:
            answers = {"initialize": wire.ask("initialize", {"protocolVersion": version, "capabilities": {},
                                                              "clientInfo": CLIENT})}
            wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            for method in (*front.LISTS, "ping"):
                answers[method] = wire.ask(method)
        finally:
            wire.close()
        snapshot["handshake"][version] = {m: _result(a, m) for m, a in answers.items()}
    for version in MODERN_PROTOCOL_VERSIONS:
        wire = Wire(sdk_only(state_dir))
        try:
            answers = {m: wire.ask(m, envelope(version)) for m in ("server/discover", *front.LISTS)}
        finally:
            wire.close()
        snapshot["modern"][version] = {m: _result(a, m) for m, a in answers.items()}
    return snapshot


def _result(answer: dict, method: str):
    if "result" not in answer:
        raise RuntimeError(f"the server refused {method}: {answer}")
    return answer["result"]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="synapolis-snapshot-") as state_dir:
        snapshot = take(state_dir)
    with open(front.SNAPSHOT, "w", encoding="utf-8") as out:
        json.dump(snapshot, out, ensure_ascii=False, indent=1)
        out.write("\n")
    print(f"wrote {front.SNAPSHOT} (fingerprint {snapshot['fingerprint']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
