"""A claim as both stores keep it: the shape a record must have, and a path claim's index key (its literal prefix)."""

from __future__ import annotations

from ..names import is_name

# pathpatterns is imported by the two functions that need it: a name's claim never loads the path machinery


def is_claim_record(doc, item: str | None = None) -> bool:
    """A claim record with the fields every reader relies on, of the right types (anything else: as if missing)."""
    if not isinstance(doc, dict):
        return False
    token = doc.get("token")
    if not (isinstance(token, int) and not isinstance(token, bool) and token >= 1):
        return False
    if not (isinstance(doc.get("item"), str) and isinstance(doc.get("claimed_by"), str)
            and isinstance(doc.get("transitions"), list)):
        return False
    from ..timeutil import parse_ts  # here: a hook's free path reads no record and never loads timeutil

    try:
        parse_ts(doc["expires_at"])
        parse_ts(doc["claimed_at"])
    except (KeyError, ValueError):
        return False
    return item is None or doc["item"] == item


def index_prefix(item: str) -> str:
    """The key of a path claim in the index: its literal prefix, lower-cased (a superset when the file system
    heeds case; exact matching comes after)."""
    from ..pathpatterns import literal_prefix

    return literal_prefix(item).lower()


def lines_of(prefix: str) -> list[str]:
    """The prefixes a pattern with this prefix may overlap, at or above it: "" and each leading run."""
    from ..pathpatterns import prefixes_of

    return prefixes_of(prefix) if prefix else [""]


def is_path_item(item: str) -> bool:
    return not is_name(item)
