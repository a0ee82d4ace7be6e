"""The local store's incidents: `escalations/<key>.json` (each key's current incident) and `escalations.jsonl`."""

from __future__ import annotations

import contextlib

from ...atomic import JsonlLog, atomic_write_json, json_files, locked, read_json_or, read_jsonl, restorable


def is_incident(doc) -> bool:
    """A record with the fields the writer, `escalations` and `status` use, of the right types.

    Anything else (a hand-edited or damaged file) is skipped as if missing, so one bad file never
    stops a pass or a listing; the writer then puts a well-formed incident in its place.
    """
    return (isinstance(doc, dict)
            and all(isinstance(doc.get(k), str) for k in ("id", "key", "agent_id", "condition", "opened_at"))
            and doc.get("status") in ("open", "resolved") and type(doc.get("level")) is int
            and isinstance(doc.get("notifications", []), list))


def load_incidents(paths) -> dict:
    """The current incident of every key: {key name: incident}; broken files are skipped."""
    found = {}
    for path in json_files(paths.escalations):
        incident = read_json_or(path)
        if is_incident(incident):
            found[path.name[:-5]] = incident
    return found


def _record(paths, changed: dict, records: list) -> None:
    """Log the events, then write the changed incident files: all of it or none (a failure takes the log
    lines back and puts the old files back, atomic.restorable). The log goes first so that even a crash
    between the two never leaves an incident without its `opened` event (the next pass opens it again)."""
    if not changed and not records:
        return
    files = {name: paths.escalation(name) for name in changed}
    with JsonlLog(paths.escalations_log) as log, restorable(*files.values()):
        offset = log.append(*records) if records else None
        try:
            for name, incident in changed.items():
                atomic_write_json(files[name], incident)
        except BaseException:
            if offset is not None:
                log.undo(offset)
            raise


class FileBook:
    """The incidents as files (the SQLite store): `escalations/<key>.json` is the current incident of each
    key, `escalations.jsonl` every event; used under the local escalation lock (file_book)."""

    def __init__(self, paths):
        self.paths = paths

    def current(self) -> dict:
        return load_incidents(self.paths)

    def record(self, changed: dict, records: list) -> None:
        _record(self.paths, changed, records)


@contextlib.contextmanager
def file_book(ws):
    """The file-backed book of incidents, held exclusively on this machine."""
    with locked(ws.paths.lock("escalation")):
        yield FileBook(ws.paths)


def file_log(ws) -> list:
    """Every event record ever logged (escalations.jsonl), oldest first."""
    return list(read_jsonl(ws.paths.escalations_log))


def mirror(paths, incidents: dict, records: list) -> None:
    """A shared store's pass keeps this machine's files for local readers (§12): its event lines appended
    to escalations.jsonl, and every `escalations/<key>.json` that differs from the store's incident
    rewritten (so an incident another machine resolved reads resolved here too)."""
    local = load_incidents(paths)
    changed = {name: incident for name, incident in incidents.items() if local.get(name) != incident}
    _record(paths, changed, records)
