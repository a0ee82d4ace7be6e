"""Sleep's merge of staged memories into ledger lines: pure (no store, no file)."""

from __future__ import annotations

import hashlib
from datetime import datetime

# a memory's norm and moment: the ground's, which the store's ledger holdings judge by too
from ..names import normalise_memory as normalise
from ..timeutil import created_moment as _moment, format_ts

LEDGER_SCHEMA_VERSION = 1


def memory_id(norm: str, key: str | None) -> str:
    identity = f"key\0{key}\0{norm}" if key is not None else f"text\0{norm}"
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


def merge_memories(entries, now: datetime) -> list[dict]:
    """Merge staged memories into ledger lines; pure.

    `entries`: dicts with `text`, optional `key` and `tags`, `agent_id` (the source) and
    `created_at`. Memories without a key that are equal after `normalise` become one line; all
    memories of one key become one line holding the newest value (ties: the later entry), with the
    older distinct values kept under `superseded`. Each line has the sorted union of the `sources`
    and `tags` of what went into it. Lines come out in the order their first memory was made.
    Session fields (`session_id`, `merged_by`) are added by the caller.
    """
    ordered = sorted(enumerate(entries), key=lambda pair: (_moment(pair[1]), pair[0]))
    groups: dict[tuple, list[dict]] = {}
    for _, entry in ordered:
        norm = normalise(entry["text"])
        key = entry.get("key")
        group_key = ("key", key) if key is not None else ("text", norm)
        groups.setdefault(group_key, []).append({**entry, "norm": norm})
    merged_at = format_ts(now, micro=True)
    lines = []
    for members in groups.values():
        newest = members[-1]
        line = {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "id": memory_id(newest["norm"], newest.get("key")),
            "text": newest["text"],
            "norm": newest["norm"],
        }
        if newest.get("key") is not None:
            line["key"] = newest["key"]
        line["tags"] = sorted({t for m in members for t in (m.get("tags") or [])})
        line["sources"] = sorted({m["agent_id"] for m in members})
        line["created_at"] = format_ts(_moment(newest), micro=True)
        line["merged_at"] = merged_at
        older = _superseded(members)
        if older:
            line["superseded"] = older
        lines.append(line)
    return lines


def _superseded(members: list[dict]) -> list[dict]:
    """The older distinct values of one key (oldest first), each with who said it and when last."""
    winner = members[-1]["norm"]
    values: dict[str, dict] = {}
    for m in members:  # oldest first, so the last write of a slot is its newest use
        if m["norm"] != winner:
            slot = values.setdefault(m["norm"], {"sources": set()})
            slot["sources"].add(m["agent_id"])
            slot["last"] = m
    return [{"text": v["last"]["text"], "sources": sorted(v["sources"]),
             "created_at": format_ts(_moment(v["last"]), micro=True)} for v in values.values()]
