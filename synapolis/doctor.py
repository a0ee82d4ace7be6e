"""`synapolis doctor`: checks of a set-up, each finding with the fix for it (contract §5)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from . import hook_install
from .atomic import TEMP_PREFIX, TEMP_SUFFIX, old_temp_files, read_bytes
from .config import check_config, notify_problems
from .errors import UsageError
from .paths import CONFIG_NAME

OK, WARN, FAIL = "ok", "warn", "fail"

# Filesystems on which SQLite's WAL mode and flock() are unsafe or silently local to one client.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p", "sshfs",
    "fuse.sshfs", "glusterfs", "fuse.glusterfs", "lustre", "ceph", "fuse.ceph", "gfs2", "ocfs2", "davfs",
    "fuse.davfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "beegfs", "gpfs", "pvfs2", "orangefs",
})
STRAY_TEMP_AGE_S = 3600.0   # the watchdog sweeps temp files this old; older ones mean it is not running
CRONTAB_TIMEOUT_S = 5.0


def finding(check: str, status: str, message: str, fix: str | None = None, **extra) -> dict:
    return {"check": check, "status": status, "message": message, "fix": fix, **extra}


# -- the state directory -------------------------------------------------------------------------

def check_writable(root: Path) -> list[dict]:
    """The state directory (or, before `init`, the folder that will hold it) takes new files."""
    if root.exists() and not root.is_dir():
        return [finding("state_dir", FAIL, f"{root} exists and is not a directory",
                        "move the file away or point SYNAPOLIS_STATE_DIR / --state-dir elsewhere")]
    if not root.exists():
        parent = next((p for p in root.parents if p.exists()), None)
        if parent is None or not _can_create_in(parent):
            return [finding("state_dir", FAIL, f"{root} does not exist and {parent} is not writable",
                            f"create it where you may write: mkdir -p {root} (or choose another --state-dir)")]
        return [finding("state_dir", WARN, f"{root} does not exist yet", f"synapolis --state-dir {root} init")]
    problems = []
    for folder in (root, root / "heartbeats", root / "sessions", root / "claims", root / "escalations"):
        if folder.exists() and not folder.is_dir():
            problems.append(finding("state_dir", FAIL, f"{folder} is a file where a directory belongs",
                                    f"move {folder} away; `synapolis init` recreates the directory"))
        elif folder.is_dir() and not _can_create_in(folder):
            problems.append(finding("state_dir", FAIL, f"cannot create files in {folder}",
                                    f"give this user write access: chmod u+w {folder} (and check chattr/mount flags)"))
    return problems or [finding("state_dir", OK, f"{root} is writable")]


def _can_create_in(folder: Path) -> bool:
    probe = folder / f"{TEMP_PREFIX}doctor.{os.getpid()}{TEMP_SUFFIX}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(fd)
    try:
        probe.unlink()
    except OSError:
        pass
    return True


def _unescape_mount(path: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def filesystem_of(path: Path, mounts_file: str | os.PathLike = "/proc/mounts") -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding `path`, or None when it cannot be told."""
    try:
        lines = Path(mounts_file).read_text("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = str(_existing(path).resolve())
    best = None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount, fstype = _unescape_mount(parts[1]), parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/") or mount == "/"
        # the last matching line of the longest mount point wins (later mounts shadow earlier ones)
        if inside and (best is None or len(mount) >= len(best[0])):
            best = (mount, fstype)
    return best


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_local_fs(root: Path, mounts_file: str | os.PathLike = "/proc/mounts") -> list[dict]:
    found = filesystem_of(root, mounts_file)
    if found is None:
        return [finding("local_fs", OK, "cannot read the mount table here; assuming a local filesystem")]
    mount, fstype = found
    if fstype.lower() in NETWORK_FS or fstype.lower().startswith("nfs"):
        return [finding("local_fs", FAIL,
                        f"{root} is on {fstype} (mounted at {mount}): SQLite WAL and flock are unsafe there",
                        "put the state directory on a local disk (e.g. --state-dir /var/lib/synapolis/state) "
                        "and share it between agents of one machine only")]
    return [finding("local_fs", OK, f"{root} is on a local {fstype} filesystem ({mount})")]


def check_config_and_schemas(root: Path) -> list[dict]:
    from . import schemas

    results = []
    try:
        directory = schemas.standards_dir()
    except FileNotFoundError as exc:
        return [finding("schemas", FAIL, str(exc), "reinstall synapolis: pip install --force-reinstall synapolis")]
    broken = []
    for name, file_name in sorted(schemas.SCHEMA_FILES.items()):
        if not (directory / file_name).is_file():
            broken.append(f"{file_name} is missing")
            continue
        try:
            schemas.validator(name).check_schema(schemas.load_schema(name))
        except Exception as exc:  # noqa: BLE001 - any failure here is the finding
            broken.append(f"{file_name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    if broken:
        results.append(finding("schemas", FAIL, "; ".join(broken),
                               f"reinstall synapolis so {directory} is complete: pip install --force-reinstall synapolis"))
    else:
        results.append(finding("schemas", OK, f"{len(schemas.SCHEMA_FILES)} schemas load from {directory}"))
    config_path = root / CONFIG_NAME
    if not config_path.exists():
        results.append(finding("config", OK, f"no {CONFIG_NAME} yet: the defaults apply"))
        return results
    try:
        document = json.loads(read_bytes(config_path).decode("utf-8"))  # bounded, never a FIFO or device
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # Recursion: nested too deeply
        results.append(finding("config", FAIL, f"{config_path} is not valid JSON ({exc})",
                               f"fix the file by hand, or move it away and run `synapolis --state-dir {root} init`"))
        return results
    problems = check_config(document)
    if not problems and "config" in schemas.SCHEMA_FILES and not broken:
        problems = [f"{e['pointer'] or '/'}: {e['message']}" for e in schemas.validation_errors("config", document)]
    problems += notify_problems(document)
    if problems:
        results.append(finding("config", FAIL, f"{config_path}: " + "; ".join(problems),
                               "correct those keys (contract §1 lists every key and its default)"))
    else:
        results.append(finding("config", OK, f"{config_path} is valid"))
    return results


def check_temp_files(root: Path, now: float | None = None) -> list[dict]:
    """Leftovers of crashed writers: harmless to readers, but old ones mean nobody sweeps."""
    stray = old_temp_files(root, STRAY_TEMP_AGE_S, now)
    if not stray:
        return [finding("temp_files", OK, "no stray temporary files")]
    shown = ", ".join(str(p.relative_to(root)) for p in stray[:5]) + (" ..." if len(stray) > 5 else "")
    return [finding("temp_files", FAIL, f"{len(stray)} stray temporary file(s) older than an hour: {shown}",
                    f"`synapolis --state-dir {root} watchdog` sweeps them (and should run hourly from cron)",
                    paths=[str(p) for p in stray])]


# -- cron ---------------------------------------------------------------------------------------

def suggested_cron_line(root: Path) -> str:
    """The hourly line of cron/synapolis.crontab, with this checkout's wrapper and this state directory."""
    from . import schemas

    try:
        checkout = schemas.standards_dir().parent
    except FileNotFoundError:
        checkout = None
    wrapper = checkout / "scripts" / "synapolis-watchdog" if checkout else None
    minute = "7"
    if checkout:
        try:
            template = (checkout / "cron" / "synapolis.crontab").read_text("utf-8")
            lines = [ln.split() for ln in template.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            minute = lines[0][0] if lines and lines[0] else minute
        except OSError:
            pass
    if wrapper and wrapper.is_file():
        return f"{minute} * * * * {shlex.quote(str(wrapper))} {shlex.quote(str(root))}"
    return (f"{minute} * * * * synapolis --state-dir {shlex.quote(str(root))} watchdog "
            f">> {shlex.quote(str(root / 'watchdog.log'))} 2>&1")


def _names_state_dir(line: str, root: Path) -> bool:
    expanded = os.path.expandvars(line.replace("~/", str(Path.home()) + "/"))
    return str(root) in expanded or "SYNAPOLIS_STATE_DIR" in line


def check_cron(root: Path, crontab_cmd: str = "crontab") -> list[dict]:
    line = suggested_cron_line(root)
    add = f"(crontab -l 2>/dev/null; echo {shlex.quote(line)}) | crontab -"
    exe = shutil.which(crontab_cmd)
    if exe is None:
        return [finding("cron", FAIL, "no `crontab` on this machine, so the watchdog is never run hourly",
                        f"install cron (e.g. apt-get install cron), then: {add}")]
    try:
        done = subprocess.run([exe, "-l"], capture_output=True, text=True, timeout=CRONTAB_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [finding("cron", FAIL, f"`crontab -l` failed: {exc}", f"check cron, then: {add}")]
    if done.returncode != 0:
        return [finding("cron", FAIL, "no crontab for this user: the watchdog never runs", add)]
    entries = [ln.strip() for ln in done.stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    ours = [ln for ln in entries if "watchdog" in ln and "synapolis" in ln]
    if not ours:
        return [finding("cron", FAIL, "the crontab has no synapolis watchdog line", add)]
    if not any(_names_state_dir(ln, root) for ln in ours):
        return [finding("cron", WARN, f"a watchdog line is installed but it does not name {root}",
                        f"make sure it runs against this state directory: {line}", lines=ours)]
    return [finding("cron", OK, "the watchdog runs from cron", lines=ours)]


# -- harnesses ----------------------------------------------------------------------------------

MCP_FILES = {"claude-code": ".mcp.json", "gemini-cli": ".gemini/settings.json", "codex": ".codex/config.toml"}


def _mcp_snippet(harness: str) -> str:
    if harness == "codex":
        return '[mcp_servers.synapolis]\ncommand = "synapolis"\nargs = ["mcp"]'
    return '{"mcpServers": {"synapolis": {"command": "synapolis", "args": ["mcp"]}}}'


def _is_our_server(entry) -> bool:
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


def _load_toml(path: Path):
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def check_harness(project: Path, harness: str) -> list[dict]:
    spec = hook_install.harness_spec(harness)
    check = f"harness:{harness}"
    settings = hook_install.settings_file(project, harness)
    install = f"synapolis hooks install {harness} --project-dir {project}"
    results = []
    try:
        document = hook_install.load_settings(settings)
    except UsageError as exc:
        return [finding(check, FAIL, exc.message, f"repair {settings}, then: {install}")]
    events = set(hook_install.installed_events(document, harness))
    missing = [e for e in spec.events if e not in events]
    if len(missing) == len(spec.events):
        # the harness is set up in this project, but maybe not for synapolis: say so, do not fail
        return [finding(check, WARN, f"{settings.parent} exists but {settings.name} has no synapolis hooks, so "
                                     "this harness's agents neither beat nor receive signals", install)]
    if missing:
        results.append(finding(check, FAIL, f"{settings} has no synapolis hook for {', '.join(missing)}", install))
    else:
        results.append(finding(check, OK, f"hooks for {', '.join(spec.events)} in {settings}"))
    if hook_install.hooks_disabled(document, harness):
        results.append(finding(check, FAIL, f"{settings}: tools.enableHooks is false, so Gemini CLI runs no hooks",
                               "set \"tools\": {\"enableHooks\": true} in that file"))
    if harness == "codex":
        results.extend(_check_codex_features(project, check))
    results.extend(_check_mcp(project, harness, check))
    return results


def _check_codex_features(project: Path, check: str) -> list[dict]:
    for config in (project / ".codex" / "config.toml", Path.home() / ".codex" / "config.toml"):
        try:
            document = _load_toml(config) if config.is_file() else None
        except (OSError, ValueError):
            continue
        features = (document or {}).get("features") if isinstance(document, dict) else None
        if isinstance(features, dict) and (features.get("hooks") is False or features.get("codex_hooks") is False):
            return [finding(check, FAIL, f"{config} turns hooks off ([features] hooks = false)",
                            f"remove that line or set it to true in {config}")]
    return []


def _check_mcp(project: Path, harness: str, check: str) -> list[dict]:
    candidates = [project / MCP_FILES[harness]]
    if harness == "codex":
        candidates.append(Path.home() / ".codex" / "config.toml")
    for path in candidates:
        if not path.is_file():
            continue
        try:
            if path.suffix == ".toml":
                document = _load_toml(path) or {}
                servers = document.get("mcp_servers")
            else:
                document = json.loads(path.read_bytes().decode("utf-8"))
                servers = document.get("mcpServers") if isinstance(document, dict) else None
        except (OSError, ValueError, RecursionError) as exc:
            return [finding(check, FAIL, f"{path} cannot be parsed ({exc})", f"repair {path}")]
        if isinstance(servers, dict) and any(_is_our_server(entry) for entry in servers.values()):
            return [finding(check, OK, f"MCP server `synapolis mcp` configured in {path}")]
    return [finding(check, WARN, f"no `synapolis mcp` server in {candidates[0]} (hooks still deliver signals)",
                    f"add to {candidates[0]}: {_mcp_snippet(harness)}")]


def check_harnesses(project: Path) -> list[dict]:
    wired = [h for h, spec in hook_install.HARNESSES.items()
             if (project / spec.settings_path).parent.is_dir()]
    results = []
    if wired and shutil.which("synapolis") is None:
        results.append(finding("harness", FAIL, "the installed hooks run `synapolis`, which is not on PATH",
                               "install synapolis where the harness finds it (pipx install synapolis) or add its bin to PATH"))
    if not wired:
        return results + [finding("harness", WARN, f"no harness is wired up in {project}",
                                  "synapolis hooks install claude-code   (or gemini-cli, codex)")]
    for harness in wired:
        results.extend(check_harness(project, harness))
    return results


# -- all of it ----------------------------------------------------------------------------------

def run_doctor(root: Path | str, project_dir: Path | str | None = None, *, mounts_file="/proc/mounts",
               crontab_cmd: str = "crontab", now: float | None = None) -> dict:
    """Every check on state directory `root`; `ok` is False when any finding failed (the CLI then exits 1).

    Takes the path, not a Workspace: opening one refuses a broken config, which is a finding here.
    """
    root = Path(root).absolute()
    project = Path(project_dir or os.getcwd()).absolute()
    findings = []
    findings += check_writable(root)
    findings += check_local_fs(root, mounts_file)
    findings += check_config_and_schemas(root)
    findings += check_temp_files(root, now)
    findings += check_cron(root, crontab_cmd)
    findings += check_harnesses(project)
    counts = {s: sum(1 for f in findings if f["status"] == s) for s in (OK, WARN, FAIL)}
    return {"ok": counts[FAIL] == 0, "state_dir": str(root), "project_dir": str(project),
            "counts": counts, "findings": findings}
