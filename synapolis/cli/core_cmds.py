"""Commands of the foundation: init and validate-heartbeat."""

from __future__ import annotations

import click

from .. import heartbeat as hb
from .common import emit, json_option, pass_workspace


@click.command("init")
@json_option
@pass_workspace(create=True)
def init_cmd(ws, as_json):
    """Create the state directory and synapolis.json (idempotent).

    Example: synapolis --state-dir ./state init
    """
    emit(as_json, {"state_dir": str(ws.root), "config": str(ws.paths.config)},
         lambda d: f"state directory ready: {d['state_dir']}")


@click.command("validate-heartbeat")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, help="The state directory.")
@click.argument("paths", nargs=-1, type=click.Path())
@json_option
def validate_heartbeat_cmd(state_dir, paths, as_json):
    """Validate heartbeat files against standards/heartbeat.schema.json; exit 1 if any is invalid.

    Example: validate-heartbeat --state-dir ./state state/heartbeats/alice.json
    """
    from pathlib import Path

    from ..errors import CheckFailed
    from ..workspace import Workspace

    if paths:
        files = [Path(p) for p in paths]
    else:
        files = hb.iter_heartbeat_paths(Workspace.open(state_dir).paths.heartbeats)
    results = []
    for path in files:
        if path.is_dir():
            results.append({"path": str(path), "valid": False, "errors": [{"pointer": "", "message": "is a directory"}]})
            continue
        read = hb.read_heartbeat(path, detailed=True)
        results.append({"path": str(path), "valid": read.valid, "errors": read.errors})
    valid = all(r["valid"] for r in results)
    data = {"valid": valid, "files": results}

    def text(d):
        lines = []
        for r in d["files"]:
            if r["valid"]:
                lines.append(f"ok       {r['path']}")
            for e in r["errors"]:
                lines.append(f"INVALID  {r['path']}  {e['pointer'] or '/'}: {e['message']}")
        bad = sum(1 for r in d["files"] if not r["valid"])
        lines.append(f"{len(d['files'])} file(s), {bad} invalid" if d["files"] else "no heartbeat files")
        return lines

    emit(as_json, data, text)
    if not valid:
        raise click.exceptions.Exit(CheckFailed.exit_code)
