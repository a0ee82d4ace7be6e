"""The JSON Schemas in standards/: finding them (installed or in a checkout) and validating with them."""

from __future__ import annotations

import functools
import json
from pathlib import Path

SCHEMA_FILES = {
    "heartbeat": "heartbeat.schema.json",
    "monitor": "monitor.schema.json",
    "escalation": "escalation.schema.json",
    "config": "config.schema.json",
    "claim": "claim.schema.json",
    "ledger": "ledger-entry.schema.json",
}


def standards_dir() -> Path:
    """`synapolis/standards` in an installed wheel, else `standards/` beside the package in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "standards", here.parent / "standards"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the standards/ folder with the JSON Schemas is missing from this install")


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads((standards_dir() / SCHEMA_FILES[name]).read_text("utf-8"))


@functools.lru_cache(maxsize=None)
def validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _pointer(path) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def validation_errors(name: str, document) -> list[dict]:
    """Every error of `document` against schema `name`, as {pointer, message}, in document order."""
    errors = sorted(validator(name).iter_errors(document), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [{"pointer": _pointer(e.absolute_path), "message": e.message} for e in errors]
