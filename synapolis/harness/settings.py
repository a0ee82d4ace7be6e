"""What a harness's own user-level settings decide about project hooks (Codex's trust, Gemini CLI's switch).

Codex's project and per-hook trust, Gemini CLI's hook switch and trusted folders: read the way each
harness reads them; written only on request. `load_settings` reads a harness's JSON settings file.

Codex (0.171; codex-rs/hooks/src/engine/discovery.rs and config_rules.rs, codex-rs/config fingerprint.rs):
it loads `<dir>/.codex/` only for a trusted project (`[projects."<dir>"] trust_level = "trusted"` in
$CODEX_HOME/config.toml, the folder itself, else the project root, else the repository root), and runs a
hook from it only when `[hooks.state."<hooks.json path>:<event>:<group>:<handler>"] trusted_hash` equals
the hook's current hash. The hash is `sha256:` + SHA-256 of the compact, key-sorted JSON of the hook's
normalized identity (`event_name`, `matcher` for events that have one, the one handler with its timeout
defaulted to 600 and at least 1, `async` false by default, absent fields left out).

Gemini CLI (packages/cli/src/config/settings.ts and trustedFolders.ts, packages/core/src/utils/trust.ts):
`hooksConfig.enabled` false in the merged settings (system defaults, user, workspace, system) runs no hook;
`hooksConfig.disabled` lists hook names (or commands) that do not run; the workspace's settings, its hooks
among them, are read only in a trusted folder (`~/.gemini/trustedFolders.json`, longest matching rule).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import UsageError

# -- Codex ---------------------------------------------------------------------------------------------

CODEX_EVENT_LABELS = {
    "PreToolUse": "pre_tool_use", "PermissionRequest": "permission_request", "PostToolUse": "post_tool_use",
    "PreCompact": "pre_compact", "PostCompact": "post_compact", "SessionStart": "session_start",
    "SessionEnd": "session_end", "UserPromptSubmit": "user_prompt_submit", "SubagentStart": "subagent_start",
    "SubagentStop": "subagent_stop", "Stop": "stop",
}
# Codex ignores the matcher of the other events, and leaves it out of their hash
CODEX_EVENTS_WITH_MATCHERS = frozenset({"PreToolUse", "PermissionRequest", "PostToolUse", "PreCompact",
                                        "PostCompact", "SessionStart", "SubagentStart", "SubagentStop"})
CODEX_DEFAULT_TIMEOUT_S = 600
CODEX_SESSION_END_MAX_TIMEOUT_S = 3  # Codex clamps a SessionEnd hook's timeout to this


def load_settings(path: Path) -> dict:
    """The settings document at `path` ({} when missing); UsageError (exit 2) when it is not a JSON object."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a settings file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if not raw.strip():
        return {}
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # Recursion: nested too deeply
        raise UsageError(f"{path} is not valid JSON ({exc}); fix it by hand, it was left untouched") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path} holds a JSON {type(document).__name__}, not an object; it was left untouched")
    return document


def codex_home(env=None) -> Path:
    """$CODEX_HOME, else ~/.codex (where Codex keeps config.toml)."""
    env = os.environ if env is None else env
    value = env.get("CODEX_HOME")
    return Path(value).expanduser() if value else Path.home() / ".codex"


def codex_hook_hash(event: str, group: dict, handler: dict) -> str:
    """The hash Codex compares with a hook's trusted_hash (the `currentHash` of `codex app-server`'s hooks/list)."""
    timeout = handler.get("timeout")
    timeout = CODEX_DEFAULT_TIMEOUT_S if not isinstance(timeout, int) or isinstance(timeout, bool) else timeout
    if event == "SessionEnd":
        timeout = min(timeout, CODEX_SESSION_END_MAX_TIMEOUT_S)
    normalized = {"type": "command", "command": handler.get("command"), "timeout": max(timeout, 1),
                  "async": handler.get("async") is True}
    for key in ("statusMessage", "additionalContextLimit"):
        if handler.get(key) is not None:
            normalized[key] = handler[key]
    identity = {"event_name": CODEX_EVENT_LABELS[event], "hooks": [normalized]}
    matcher = group.get("matcher")
    if event in CODEX_EVENTS_WITH_MATCHERS and isinstance(matcher, str):
        identity["matcher"] = matcher
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def codex_hooks(hooks_file: Path, document: dict, is_ours) -> list[dict]:
    """Each command hook of a project's .codex/hooks.json that `is_ours(command)` accepts, as Codex keys it.

    Each: `event`, `key` (the key of its entry in `[hooks.state]`), `hash`, `command`.
    """
    source = os.path.realpath(hooks_file)  # Codex works from the resolved working directory
    found = []
    table = document.get("hooks") if isinstance(document, dict) else None
    for event, groups in (table or {}).items():
        if event not in CODEX_EVENT_LABELS or not isinstance(groups, list):
            continue
        for group_index, group in enumerate(groups):
            handlers = group.get("hooks") if isinstance(group, dict) else None
            for handler_index, handler in enumerate(handlers if isinstance(handlers, list) else []):
                if not (isinstance(handler, dict) and handler.get("type") == "command" and is_ours(handler.get("command"))):
                    continue
                found.append({"event": event, "command": handler["command"],
                              "key": f"{source}:{CODEX_EVENT_LABELS[event]}:{group_index}:{handler_index}",
                              "hash": codex_hook_hash(event, group, handler)})
    return found


def _tomllib(path: Path):
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise UsageError(f"cannot read {path}: reading TOML needs Python 3.11 or the tomli package") from None
    return tomllib


def load_toml(path: Path) -> dict | None:
    """The TOML document at `path`; None when missing; UsageError when unreadable or not TOML."""
    tomllib = _tomllib(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise UsageError(f"{path} is not valid TOML ({exc})") from None


def codex_hook_states(config: dict | None) -> dict:
    """`[hooks.state]` of Codex's user config: key -> {"enabled", "trusted_hash"} (malformed entries skipped)."""
    hooks = (config or {}).get("hooks")
    table = hooks.get("state") if isinstance(hooks, dict) else None
    states = {}
    for key, value in (table or {}).items():
        if isinstance(value, dict) and isinstance(key, str) and key.strip():
            enabled = value.get("enabled")
            trusted = value.get("trusted_hash")
            states[key.strip()] = {"enabled": enabled if isinstance(enabled, bool) else None,
                                   "trusted_hash": trusted if isinstance(trusted, str) else None}
    return states


def codex_trust_status(hook: dict, states: dict) -> str:
    """`trusted`, `untrusted` (never reviewed), `modified` (changed since trusted) or `disabled`."""
    state = states.get(hook["key"], {})
    if state.get("enabled") is False:
        return "disabled"
    trusted = state.get("trusted_hash")
    if trusted is None:
        return "untrusted"
    return "trusted" if trusted == hook["hash"] else "modified"


def _git_roots(folder: Path) -> tuple[Path | None, Path | None]:
    """(checkout root: nearest folder with a .git, repository root: the main checkout of a worktree)."""
    for candidate in (folder, *folder.parents):
        dot_git = candidate / ".git"
        if dot_git.is_dir():
            return candidate, candidate
        if dot_git.is_file():
            try:
                line = dot_git.read_text("utf-8", errors="replace").strip()
            except OSError:
                return candidate, candidate
            gitdir = Path(line.partition("gitdir:")[2].strip()) if line.startswith("gitdir:") else None
            if gitdir is None:
                return candidate, candidate
            gitdir = gitdir if gitdir.is_absolute() else candidate / gitdir
            try:
                common = (gitdir / "commondir").read_text("utf-8").strip()
                common_dir = Path(os.path.realpath(gitdir / common))
            except OSError:
                common_dir = Path(os.path.realpath(gitdir))
            return candidate, common_dir.parent
    return None, None


def codex_project_trust(project: Path, config: dict | None) -> tuple[str | None, str]:
    """(`trusted` / `untrusted` / None when not listed, the key Codex looks for) for a project folder."""
    projects = (config or {}).get("projects")
    projects = projects if isinstance(projects, dict) else {}
    folder = Path(os.path.abspath(project))
    checkout, repo = _git_roots(Path(os.path.realpath(folder)))
    candidates = [folder, checkout or folder, repo]
    keys = []
    for candidate in candidates:
        if candidate is None:
            continue
        for key in (os.path.realpath(candidate), str(candidate)):
            if key not in keys:
                keys.append(key)
    for key in keys:
        entry = projects.get(key)
        level = entry.get("trust_level") if isinstance(entry, dict) else None
        if isinstance(level, str):
            return level, key
    return None, str(repo or checkout or Path(os.path.realpath(folder)))


def _toml_string(text: str) -> str:
    # a JSON string is a valid TOML basic string: \" \\ \n \t \uXXXX escapes, everything else as is
    return json.dumps(text, ensure_ascii=False)


def trust_codex_hooks(config_path: Path, hooks: list[dict]) -> list[str]:
    """Record each hook's current hash as trusted in Codex's user config; the keys written.

    Only on the user's explicit request (`hooks install codex --trust`). The file is changed by
    appending `[hooks.state."KEY"]` tables (or replacing a trusted_hash line synapolis wrote before);
    the result is parsed again and must equal the old document plus exactly these hashes, or nothing
    is written (UsageError, exit 2: trust them in Codex instead, with /hooks).
    """
    import copy

    from ..atomic import atomic_write_bytes

    before = load_toml(config_path) or {}
    try:
        text = config_path.read_text("utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise UsageError(f"cannot read {config_path}: {exc.strerror}") from None
    states = codex_hook_states(before)
    written = []
    for hook in hooks:
        if states.get(hook["key"], {}).get("trusted_hash") == hook["hash"]:
            continue
        header = f"[hooks.state.{_toml_string(hook['key'])}]"
        line = f"trusted_hash = {_toml_string(hook['hash'])}"
        lines = text.split("\n")
        if header in lines:
            at = lines.index(header)
            if at + 1 < len(lines) and lines[at + 1].startswith("trusted_hash = "):
                lines[at + 1] = line
            else:
                lines.insert(at + 1, line)
            text = "\n".join(lines)
        else:
            text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + f"{header}\n{line}\n"
        written.append(hook["key"])
    if not written:
        return []
    expected = copy.deepcopy(before)
    for hook in hooks:
        expected.setdefault("hooks", {}).setdefault("state", {}).setdefault(hook["key"], {})["trusted_hash"] = hook["hash"]
    try:
        after = _tomllib(config_path).loads(text)
    except Exception:  # noqa: BLE001 - any failure means the edit cannot be trusted
        after = None
    if after != expected:
        raise UsageError(f"{config_path} is laid out in a way synapolis will not edit safely; nothing was written. "
                         "Trust the hooks in Codex instead: start codex in the project and review them with /hooks")
    mode = config_path.stat().st_mode & 0o777 if config_path.exists() else 0o600
    try:
        atomic_write_bytes(config_path, text.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise UsageError(f"cannot write {config_path}: {exc.strerror}") from None
    return written


# -- Gemini CLI -----------------------------------------------------------------------------------------

def gemini_home(env=None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("GEMINI_CLI_HOME") or Path.home()) / ".gemini"


def gemini_settings_files(project: Path, env=None) -> list[tuple[str, Path]]:
    """(scope, path) in the order Gemini CLI merges them, lowest precedence first."""
    env = os.environ if env is None else env
    system = Path(env.get("GEMINI_CLI_SYSTEM_SETTINGS_PATH") or "/etc/gemini-cli/settings.json")
    defaults = Path(env.get("GEMINI_CLI_SYSTEM_DEFAULTS_PATH") or system.parent / "system-defaults.json")
    return [("system defaults", defaults), ("user", gemini_home(env) / "settings.json"),
            ("workspace", project / ".gemini" / "settings.json"), ("system", system)]


def _read_json_object(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def gemini_hooks_switch(project: Path, env=None) -> tuple[bool, Path | None]:
    """(hooks enabled?, the file whose `hooksConfig.enabled` decides it; None for the default, on)."""
    enabled, decided_by = True, None
    for _scope, path in gemini_settings_files(project, env):
        document = _read_json_object(path) or {}
        config = document.get("hooksConfig")
        if isinstance(config, dict) and isinstance(config.get("enabled"), bool):
            enabled, decided_by = config["enabled"], path
    return enabled, decided_by


def gemini_disabled_hooks(project: Path, env=None) -> list[tuple[str, Path]]:
    """(name, file) for every entry of a `hooksConfig.disabled` list in the merged settings files."""
    found = []
    for _scope, path in gemini_settings_files(project, env):
        document = _read_json_object(path) or {}
        config = document.get("hooksConfig")
        names = config.get("disabled") if isinstance(config, dict) else None
        found += [(n, path) for n in names or [] if isinstance(n, str)]
    return found


def gemini_folder_trust(project: Path, env=None) -> tuple[bool | None, str]:
    """(True trusted / False untrusted / None not decided yet, how that was decided) for a project folder."""
    env = os.environ if env is None else env
    if env.get("GEMINI_CLI_TRUST_WORKSPACE") in ("true", "false"):
        return env["GEMINI_CLI_TRUST_WORKSPACE"] == "true", "GEMINI_CLI_TRUST_WORKSPACE"
    folder_trust = True  # security.folderTrust.enabled, from every scope but the workspace
    for scope, path in gemini_settings_files(project, env):
        if scope == "workspace":
            continue
        security = (_read_json_object(path) or {}).get("security")
        setting = security.get("folderTrust") if isinstance(security, dict) else None
        if isinstance(setting, dict) and isinstance(setting.get("enabled"), bool):
            folder_trust = setting["enabled"]
    if not folder_trust:
        return True, "security.folderTrust.enabled is false"
    rules_file = Path(env.get("GEMINI_CLI_TRUSTED_FOLDERS_PATH") or gemini_home(env) / "trustedFolders.json")
    rules = _read_json_object(rules_file) or {}
    location = os.path.realpath(project)
    best, level = -1, None
    for rule, trust in rules.items():
        if trust not in ("TRUST_FOLDER", "TRUST_PARENT", "DO_NOT_TRUST"):
            continue
        effective = os.path.realpath(os.path.dirname(rule) if trust == "TRUST_PARENT" else rule)
        inside = location == effective or location.startswith(effective.rstrip(os.sep) + os.sep)
        if inside and len(rule) > best:
            best, level = len(rule), trust
    if level is None:
        return None, str(rules_file)
    return level != "DO_NOT_TRUST", str(rules_file)
