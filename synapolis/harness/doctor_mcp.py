"""The MCP entries of a harness's config, as doctor checks them: `synapolis mcp` over stdio, or `synapolis serve`
over HTTP (its URL must answer /healthz and accept the entry's token, which is never shown)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .settings import codex_home, load_toml

# where each harness keeps its MCP servers in a project (Codex also in $CODEX_HOME/config.toml)
MCP_FILES = {"claude-code": ".mcp.json", "gemini-cli": ".gemini/settings.json", "codex": ".codex/config.toml"}
HTTP_TIMEOUT_S = 3.0  # per request; doctor makes at most two per entry
OK, WARN, FAIL = "ok", "warn", "fail"


def mcp_files(project: Path, harness: str, env=None) -> list[Path]:
    files = [project / MCP_FILES[harness]]
    if harness == "codex":
        files.append(codex_home(env) / "config.toml")
    return files


def entries(path: Path) -> dict:
    """The MCP server entries of one config file, by name ({} when it has none); ValueError when it cannot be read."""
    if path.suffix == ".toml":
        from ..errors import UsageError

        try:
            document = load_toml(path) or {}
        except UsageError as exc:
            raise ValueError(exc.message) from None
        servers = document.get("mcp_servers")
    else:
        document = json.loads(path.read_bytes().decode("utf-8"))
        servers = document.get("mcpServers") if isinstance(document, dict) else None
    return servers if isinstance(servers, dict) else {}


def is_stdio_server(entry) -> bool:
    """Whether an entry starts `synapolis mcp` (by its program's name, or `python -m synapolis`)."""
    if not isinstance(entry, dict):
        return False
    command = entry.get("command")
    args = entry.get("args") or []
    if not isinstance(command, str) or not isinstance(args, list):
        return False
    words = command.split() + [str(a) for a in args]
    names = [os.path.basename(w) for w in words]
    if "mcp" not in words:
        return False
    return any(n in ("synapolis", "synapolis.exe") for n in names) or ("-m" in words and "synapolis" in words)


class HttpEntry:
    """An HTTP MCP entry as its harness reads it: the URL, and the bearer token it sends (`token`), with where
    that comes from in words that never hold the token itself (`source`); `unset` names a variable the token
    needs that this environment lacks."""

    def __init__(self, url: str, token: str | None, source: str, unset: str | None = None):
        self.url, self.token, self.source, self.unset = url, token, source, unset


_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_BARE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(text: str, env, bare: bool) -> tuple[str, list[str]]:
    """`text` with ${VAR} (and ${VAR:-default}; with `bare`, $VAR too) filled in from `env`; the unset names."""
    unset: list[str] = []

    def fill(match):
        name, default = match.group(1), match.group(2) if match.lastindex and match.lastindex > 1 else None
        if name in env:
            return env[name]
        if default is not None:
            return default
        unset.append(name)
        return ""

    text = _BRACED.sub(fill, text)
    if bare:
        text = _BARE.sub(fill, text)
    return text, unset


def _bearer(headers, env, bare: bool, where: str) -> tuple[str | None, str, str | None]:
    """(token, source, unset variable) from an Authorization header in `headers`."""
    if not isinstance(headers, dict):
        return None, where, None
    for name, value in headers.items():
        if str(name).lower() == "authorization" and isinstance(value, str):
            names = [m.group(1) for m in _BRACED.finditer(value)] or \
                ([m.group(1) for m in _BARE.finditer(value)] if bare else [])
            source = f"the Authorization header in {where}" + (f" (${names[0]})" if names else "")
            value, unset = _expand(value, env, bare)
            if unset:
                return None, source, unset[0]
            scheme, _, token = value.strip().partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None, source, None
    return None, where, None


def http_entry(harness: str, entry, path: Path, env) -> HttpEntry | None:
    """The entry's HTTP target in `harness`'s own format, or None when it is not an HTTP entry."""
    if not isinstance(entry, dict):
        return None
    if harness == "codex":
        url = entry.get("url")
        if not isinstance(url, str):
            return None
        variable = entry.get("bearer_token_env_var")
        if isinstance(variable, str):
            source = f"${variable} (bearer_token_env_var in {path})"
            return HttpEntry(url, env.get(variable) or None, source, None if env.get(variable) else variable)
        named = entry.get("env_http_headers")
        if isinstance(named, dict):
            for header, var in named.items():
                if str(header).lower() == "authorization" and isinstance(var, str):
                    if not env.get(var):
                        return HttpEntry(url, None, f"${var} (env_http_headers in {path})", var)
                    scheme, _, token = env[var].strip().partition(" ")
                    return HttpEntry(url, token.strip() if scheme.lower() == "bearer" else None,
                                     f"${var} (env_http_headers in {path})")
        return HttpEntry(url, *_bearer(entry.get("http_headers"), env, False, str(path)))
    if harness == "gemini-cli":
        # httpUrl is Gemini CLI's streamable HTTP; url with type http too (url alone is its SSE transport)
        url = entry.get("httpUrl") or (entry.get("url") if entry.get("type") == "http" else None)
        bare = True  # Gemini CLI expands $VAR as well as ${VAR} in settings.json
    else:
        url = entry.get("url") if entry.get("type") in ("http", "streamable-http") else None
        bare = False  # Claude Code expands ${VAR} and ${VAR:-default} in .mcp.json
    if not isinstance(url, str):
        return None
    url, unset = _expand(url, env, bare)
    if unset:
        return HttpEntry(url, None, f"the url in {path}", unset[0])
    return HttpEntry(url, *_bearer(entry.get("headers"), env, bare, str(path)))


def _get(url: str, token: str | None = None):
    """(HTTP status, body bytes) of a GET, or (None, the reason) when nothing answered in time."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only
            return answer.status, answer.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason) or type(reason).__name__


def probe(target: HttpEntry, name: str, path: Path) -> list[tuple[str, str, str | None]]:
    """(status, message, fix) for one `synapolis serve` entry: /healthz answers, the token is accepted."""
    url = target.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        return [(FAIL, f"MCP server {name} in {path}: {target.url!r} is not an http(s) URL", f"correct its url in {path}")]
    base = url[:-len("/mcp")] if url.endswith("/mcp") else url
    status, body = _get(base + "/healthz")
    healthy = status == 200 and _json(body).get("ok") is True
    if not healthy:
        said = f"HTTP {status}" if status is not None else body
        return [(FAIL, f"MCP server {name} in {path}: {base}/healthz does not answer as `synapolis serve` ({said})",
                 f"start `synapolis serve` there, or correct the url in {path}")]
    found = [(OK, f"MCP server {name} in {path}: `synapolis serve` at {url} answers /healthz", None)]
    if target.unset:
        return found + [(WARN, f"MCP server {name}: the token comes from ${target.unset}, which is not set here, so "
                               "doctor cannot check it", f"run doctor where the harness runs, with ${target.unset} set")]
    if target.token is None:
        return found + [(FAIL, f"MCP server {name} in {path} sends no bearer token; `synapolis serve` refuses "
                               "every call without one", "synapolis tokens create NAME, then send it: docs/MCP.md")]
    status, body = _get(base + "/api/status", target.token)
    if status == 200:
        return found + [(OK, f"MCP server {name}: the token from {target.source} is accepted", None)]
    if status in (401, 403):
        return found + [(FAIL, f"MCP server {name}: `synapolis serve` refuses the token from {target.source} "
                               "(unknown, revoked, or for another state directory)",
                         "synapolis tokens list on the server; create a new one with synapolis tokens create NAME")]
    said = f"HTTP {status}" if status is not None else body
    return found + [(FAIL, f"MCP server {name}: the token from {target.source} could not be checked ({said})", None)]


def _json(body) -> dict:
    try:
        value = json.loads(body)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def is_ours(name: str, target: HttpEntry) -> bool:
    """An HTTP entry doctor checks as synapolis's: named so, or at a URL that says so (the docs' snippets are)."""
    return "synapolis" in str(name).lower() or "synapolis" in target.url.lower()


def check(project: Path, harness: str, env) -> tuple[list[tuple[str, str, str | None]], bool]:
    """((status, message, fix) for each synapolis MCP entry of `harness`, or for a file that cannot be read;
    whether any entry was found)."""
    results = []
    for path in mcp_files(project, harness, env):
        if not path.is_file():
            continue
        try:
            servers = entries(path)
        except (OSError, ValueError, RecursionError) as exc:
            return [(FAIL, f"{path} cannot be parsed ({exc})", f"repair {path}")], False
        for name, entry in servers.items():
            if is_stdio_server(entry):
                results.append((OK, f"MCP server `synapolis mcp` configured in {path}", None))
                continue
            target = http_entry(harness, entry, path, env)
            if target is not None and is_ours(name, target):
                results.extend(probe(target, name, path))
    return results, bool(results)
