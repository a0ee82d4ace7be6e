"""`synapolis doctor`'s checks of the state directory (writable, local, config, temp files) and its findings.

What lies outside it (each harness's files, the git hook, the crontab) and `run_doctor`, every check, are
synapolis.harness.doctor: those checks read the harnesses' own files, which the harness package describes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .atomic import TEMP_PREFIX, TEMP_SUFFIX, old_temp_files, read_bytes
from .config import check_config, notify_problems
from .paths import CONFIG_NAME

OK, WARN, FAIL = "ok", "warn", "fail"

# Filesystems on which SQLite's WAL mode and flock() are unsafe or silently local to one client.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p", "sshfs",
    "fuse.sshfs", "glusterfs", "fuse.glusterfs", "lustre", "ceph", "fuse.ceph", "gfs2", "ocfs2", "davfs",
    "fuse.davfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "beegfs", "gpfs", "pvfs2", "orangefs",
})
STRAY_TEMP_AGE_S = 3600.0   # the watchdog sweeps temp files this old; older ones mean it is not running


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
