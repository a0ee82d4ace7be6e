"""`synapolis mcp`'s front: the handshake and the fixed lists answered at once, while the MCP SDK loads behind.

Importing the SDK and building the server takes most of a second (several under load), and Claude Code and
Codex start their first turn without the tools of a server that has not answered `tools/list` yet. Those
answers never change for one build of synapolis, so `static.json` holds them, taken from the real server
(mcp/snapshot.py writes it; a test checks it against the server). This module answers from it with the
standard library only: `initialize` and `server/discover` (either one first, so a client that probes with
discovery and then falls back to the handshake on the same connection is served), then `tools/list`,
`resources/list`, `resources/templates/list`, `prompts/list` and `ping` in the era the connection is in.
Everything else, and anything unusual about one of those (a cursor, a malformed envelope, a line that is not
JSON-RPC), goes to the SDK once it has loaded, in order. The request that set the era is replayed to the SDK
first under an id of our own, and the SDK's answer to it dropped, so the SDK stands exactly where the client
believes the connection is. The snapshot names a fingerprint of the sources it came from: a checkout edited
since it was written gets no front (every answer from the SDK, as before), never a stale list.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "static.json")
# the modules the answers come from (tool definitions, instructions, capabilities); the SDK's version too
SOURCES = ("server.py", "tools.py", "errors.py", "state.py", "live.py", "watch.py", "http.py", "__init__.py")
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
INFO_KEY = "io.modelcontextprotocol/clientInfo"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
LISTS = ("tools/list", "resources/list", "resources/templates/list", "prompts/list")
LEGACY, MODERN, SDK = "legacy", "modern", "sdk"  # the era: set here, or left to the SDK (everything passed on)


def sdk_version() -> str | None:
    """The installed MCP SDK's version, from its dist-info folder's name (importlib.metadata costs more than
    the rest of the front together)."""
    for entry in sys.path:
        folder = entry or "."
        if os.path.isfile(os.path.join(folder, "mcp", "__init__.py")):
            try:
                names = os.listdir(folder)
            except OSError:
                return None
            found = [n for n in names if n.startswith("mcp-") and n.endswith(".dist-info")]
            return found[0][4:-10] if len(found) == 1 else None
    return None


def fingerprint() -> str | None:
    """A checksum of the sources the static answers come from and the SDK's version; None when one is missing."""
    version = sdk_version()
    if version is None:
        return None
    crc = zlib.crc32(version.encode())
    for name in SOURCES:
        try:
            with open(os.path.join(HERE, name), "rb") as source:
                crc = zlib.crc32(source.read(), crc)
        except OSError:
            return None
    return f"{crc:08x}"


def load_snapshot(path: str = SNAPSHOT) -> dict | None:
    """The static answers, or None when there are none for this build (missing, unreadable, or stale)."""
    try:
        with open(path, "rb") as source:
            snapshot = json.loads(source.read())
    except (OSError, ValueError):
        return None
    if not isinstance(snapshot, dict) or snapshot.get("fingerprint") != fingerprint():
        return None
    return snapshot


def _is_str_map(value, keys) -> bool:
    return isinstance(value, dict) and all(k in keys and isinstance(v, str) for k, v in value.items())


def _plain_initialize(params) -> bool:
    """Whether the SDK would take these `initialize` params as they are (else it is the SDK's to answer)."""
    return (isinstance(params, dict) and set(params) == {"protocolVersion", "capabilities", "clientInfo"}
            and isinstance(params["protocolVersion"], str) and _capabilities(params["capabilities"])
            and _is_str_map(params["clientInfo"], ("name", "version", "title", "description", "websiteUrl"))
            and {"name", "version"} <= set(params["clientInfo"]))


def _capabilities(value) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())


def _has_envelope(params) -> bool:
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and VERSION_KEY in meta


class Front:
    """One connection's front: `take(line)` answers the line (through `send`) when it can and returns the lines
    the SDK must read for it; `drops(text)` says whether a line the SDK writes is the answer to our replay."""

    def __init__(self, snapshot: dict, send):
        self.snapshot, self.send = snapshot, send
        self.era: str | None = None
        self.version: str | None = None  # the protocol version the connection speaks, once set here
        self.awaiting = False  # a line was passed on that the SDK must answer
        self._replay_id: str | None = None

    def take(self, line: str) -> list[str]:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            self.awaiting = self.awaiting or not _is_answer(message)
            return [line]  # the SDK answers bad lines, and takes responses and notifications
        if "id" not in message:
            return [line]
        request_id, method, params = message["id"], message["method"], message.get("params")
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            result, opens = self._result(method, params)
            if result is not None:
                self.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result},
                                     ensure_ascii=False, separators=(",", ":")) + "\n")
                if not opens:
                    return []
                self._replay_id = f"synapolis-front-{os.urandom(6).hex()}"
                return [json.dumps({**message, "id": self._replay_id}, ensure_ascii=False) + "\n"]
        if self.era is None:  # the SDK sees this request first: it decides the era, as it always did
            self.era = MODERN if method != "initialize" and _has_envelope(params) else SDK
        self.awaiting = True
        return [line]

    def _result(self, method: str, params):
        """(the answer, whether this request sets the connection's era) when the front answers it, else (None, _)."""
        if method == "initialize":
            if self.era is not None or not _plain_initialize(params):
                return None, False
            handshake = self.snapshot["handshake"]
            requested = params["protocolVersion"]
            self.version = requested if requested in handshake else self.snapshot["latest_handshake"]
            self.era = LEGACY
            return handshake[self.version]["initialize"], True
        if self.era == LEGACY:
            plain = params is None or (isinstance(params, dict) and set(params) <= {"_meta"}
                                       and _is_str_map(params.get("_meta", {}), ("progressToken",)))
            if plain and (method in LISTS or method == "ping"):
                return self.snapshot["handshake"][self.version][method], False
            return None, False
        if self.era not in (None, MODERN) or (method not in LISTS and method != "server/discover"):
            return None, False
        version = self._modern_version(params)
        if version is None or (self.era == MODERN and version != self.version):
            return None, False
        opens = self.era is None and method != "server/discover"  # discovery leaves the handshake open
        if opens:
            self.era, self.version = MODERN, version
        return self.snapshot["modern"][version][method], opens

    def _modern_version(self, params) -> str | None:
        """The envelope's protocol version when the request carries a whole, well-formed one we answer."""
        if not isinstance(params, dict) or set(params) != {"_meta"}:
            return None
        meta = params["_meta"]
        if not isinstance(meta, dict) or not set(meta) <= {VERSION_KEY, INFO_KEY, CAPABILITIES_KEY}:
            return None
        version = meta.get(VERSION_KEY)
        if version not in self.snapshot["modern"] or not _capabilities(meta.get(CAPABILITIES_KEY)):
            return None
        info = meta.get(INFO_KEY)
        if info is not None and not (_is_str_map(info, ("name", "version", "title", "description", "websiteUrl"))
                                     and {"name", "version"} <= set(info)):
            return None
        return version

    def drops(self, text: str) -> bool:
        """Whether `text`, a line the SDK writes, answers the request we replayed (the client had its answer)."""
        if self._replay_id is None or self._replay_id not in text:
            return False
        try:
            message = json.loads(text)
        except ValueError:
            return False
        if isinstance(message, dict) and message.get("id") == self._replay_id and _is_answer(message):
            self._replay_id = None
            return True
        return False


def _is_answer(message) -> bool:
    return isinstance(message, dict) and "id" in message and ("result" in message or "error" in message) \
        and "method" not in message


# -- the process: the front on the wire until the SDK has loaded, then the SDK behind it ----------------------

def _build(root, polling: bool):
    """The real server (what takes the time): the SDK imported, every tool registered."""
    from ..store import keep_connections
    from .server import create_server

    keep_connections()  # a database store keeps a pool: this process serves many calls
    return create_server(root, force_polling=polling)


def serve(root, polling: bool = False) -> None:
    """`synapolis mcp` on state directory `root` until the client closes stdin. Errors from building the
    server (a broken store, a missing SDK) are raised here, after the front has answered what it could."""
    from .stdio import _pipes

    snapshot = load_snapshot() if _pipes(0, 1) else None
    if snapshot is None:  # a file or a terminal on stdin, or no snapshot for this build: the SDK does it all
        _build(root, polling).run("stdio")
        return
    import select
    import threading

    from .stdio import take_wire

    wire = take_wire()
    wire_in, wire_out = wire[0].fileno(), wire[1].fileno()

    def send(text: str) -> None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(wire_out, data):]

    front = Front(snapshot, send)
    built: dict = {}
    wake_r, wake_w = os.pipe()

    def load() -> None:
        try:
            built["server"] = _build(root, polling)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which reports it
            built["error"] = exc
        finally:
            os.write(wake_w, b".")

    # the front answers between the loader's bytecodes: switch threads every millisecond, not every five
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    loader = threading.Thread(target=load, name="synapolis-mcp-load", daemon=True)
    loader.start()
    queued: list[str] = []
    buffer = bytearray()
    try:
        while True:
            ready, _w, _x = select.select([wire_in, wake_r], [], [])
            if wake_r in ready:
                break
            chunk = os.read(wire_in, 1 << 16)
            if not chunk:  # the client is done: a last line without its newline still counts
                if buffer:
                    queued.extend(front.take(buffer.decode("utf-8", errors="replace")))
                if not front.awaiting:
                    # nothing waits for the SDK: leave now rather than after it has loaded
                    sys.stderr.flush()
                    os._exit(0)
                buffer.clear()
                break
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                queued.extend(front.take(buffer[start:end + 1].decode("utf-8", errors="replace")))
                start = end + 1
            del buffer[:start]
    except KeyboardInterrupt:
        os._exit(130)
    except (BrokenPipeError, ConnectionResetError):  # the client went away while we answered: nobody is left
        os._exit(0)
    loader.join()
    sys.setswitchinterval(interval)
    os.close(wake_r)
    os.close(wake_w)
    if "error" in built:
        raise built["error"]
    import anyio

    from .stdio import serve_behind

    # a line begun before the SDK took over is finished by the loop's reader
    anyio.run(serve_behind, built["server"].lowlevel, front, queued, wire, bytes(buffer))
