"""Who holds a path (contract §14): the held path claims, looked up by their literal prefix."""

from __future__ import annotations

from datetime import datetime

from .pathpatterns import compile_pattern, is_name, matches, prefixes_of


def held_path_records(ws, now: datetime) -> list[dict]:
    """Every path claim held at `now` (unreleased, unexpired), whoever holds it."""
    from .claims import _is_record, claim_state
    from .store import store_for

    out = []
    for doc, _name, _error in store_for(ws).claim_documents():
        if _is_record(doc) and not is_name(doc["item"]) and claim_state(doc, now) == "held":
            out.append(doc)
    return out


def holders_of(ws, rel_paths: list[str], now: datetime) -> dict[str, list[dict]]:
    """{path: [held claim records whose pattern matches it]} for normalised project-relative paths."""
    from .project import project_of

    _root, fold = project_of(ws)
    by_prefix: dict[str, list[tuple[tuple, dict]]] = {}
    for record in held_path_records(ws, now):
        compiled = compile_pattern(record["item"], fold)
        prefix = "/".join(s for s in _literal_head(compiled))
        by_prefix.setdefault(prefix, []).append((compiled, record))
    out: dict[str, list[dict]] = {}
    for path in rel_paths:
        for prefix in prefixes_of(path):
            for compiled, record in by_prefix.get(prefix, ()):
                if matches(compiled, path):
                    out.setdefault(path, []).append(record)
    return out


def _literal_head(compiled: tuple) -> list[str]:
    head = []
    for seg in compiled:
        if not isinstance(seg, str) or seg == "**":
            break
        head.append(seg)
    return head
