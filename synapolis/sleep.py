"""The consensus sleep protocol (contract §8): memories in, staging, the last agent's merge and the ledger."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from .errors import UsageError
from .names import check_limit, validate_agent_id
from .rules.merge import LEDGER_SCHEMA_VERSION, _moment, memory_id, merge_memories, normalise  # noqa: F401 - sleep's merge, importable here as before
from .store.ledger import LedgerHoldings, new_ledger_lines  # noqa: F401
from .store.local.ledger import LedgerReader, append_to_ledger, read_ledger  # noqa: F401
from .timeutil import parse_ts

MAX_INPUT_BYTES = 4 * 1024 * 1024   # a whole --memories document
MAX_MEMORIES = 1000                 # per call
MAX_TEXT_BYTES = 65536              # one memory's text (UTF-8)
MAX_KEY_CHARS = 200
MAX_TAGS = 32
MAX_TAG_CHARS = 100
ALLOWED_FIELDS = frozenset({"text", "key", "tags"})


# --- memories in ---------------------------------------------------------------------------------

def _refuse(where: str, why: str):
    raise UsageError(f"memories: {where}: {why} (expected a JSON array of strings or objects with "
                     f"'text' and optional 'key', 'tags'; or one such value per line)")


def _encodable(text: str) -> bool:
    # lone surrogates parse as JSON but cannot be written as UTF-8 later: refuse them up front
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_memory(item, where: str = "memory") -> dict:
    """One memory as the caller gave it (a string or an object) -> {text, key?, tags}; UsageError otherwise."""
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, dict):
        _refuse(where, f"a memory must be a string or an object, not {type(item).__name__}")
    unknown = sorted(set(item) - ALLOWED_FIELDS)
    if unknown:
        _refuse(where, f"unknown field(s) {', '.join(map(repr, unknown))}")
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        _refuse(where, "'text' must be a non-empty string")
    text = text.strip()
    if not _encodable(text):
        _refuse(where, "'text' is not valid Unicode (lone surrogate)")
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        _refuse(where, f"'text' is longer than {MAX_TEXT_BYTES} bytes")
    memory = {"text": text}
    key = item.get("key")
    if key is not None:
        if not isinstance(key, str) or not key.strip():
            _refuse(where, "'key' must be a non-empty string")
        key = key.strip()
        if len(key) > MAX_KEY_CHARS or not _encodable(key):
            _refuse(where, f"'key' must be valid Unicode of at most {MAX_KEY_CHARS} characters")
        memory["key"] = key
    tags = item.get("tags")
    if tags is None:
        tags = []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        _refuse(where, "'tags' must be a list of non-empty strings")
    tags = sorted({t.strip() for t in tags})
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS or not _encodable(t) for t in tags):
        _refuse(where, f"at most {MAX_TAGS} tags of at most {MAX_TAG_CHARS} characters each")
    memory["tags"] = tags
    return memory


def check_memories(items) -> list[dict]:
    """A list of memories (strings or objects, e.g. from the MCP tool) -> checked memories."""
    if not isinstance(items, list):
        _refuse("input", f"expected a list, not {type(items).__name__}")
    if len(items) > MAX_MEMORIES:
        _refuse("input", f"more than {MAX_MEMORIES} memories in one call")
    return [check_memory(item, f"item {i + 1}") for i, item in enumerate(items)]


def parse_memories(text) -> list[dict]:
    """A JSON array of strings/objects, or JSON lines of the same -> checked memories.

    Anything else raises UsageError (exit 2), so a caller can parse before it writes anything.
    Empty input (no lines at all) is zero memories.
    """
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_INPUT_BYTES:
            _refuse("input", f"larger than {MAX_INPUT_BYTES} bytes")
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError:
            _refuse("input", "not UTF-8")
    if not isinstance(text, str):
        _refuse("input", f"expected text, not {type(text).__name__}")
    if len(text) > MAX_INPUT_BYTES:
        _refuse("input", f"larger than {MAX_INPUT_BYTES} bytes")
    text = text.lstrip("\ufeff")
    if not text.strip():
        return []
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = _NOT_JSON
    except RecursionError:
        _refuse("input", "nested too deeply")
    if whole is not _NOT_JSON:
        if isinstance(whole, list):
            return check_memories(whole)
        if isinstance(whole, (str, dict)):  # a single JSON line
            return [check_memory(whole, "line 1")]
        _refuse("input", f"a JSON {type(whole).__name__} is not a memory")
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            _refuse(f"line {number}", f"not JSON ({getattr(exc, 'msg', 'nested too deeply')})")
        if not isinstance(value, (str, dict)):
            _refuse(f"line {number}", f"a JSON {type(value).__name__} is not a memory")
        items.append(value)
        if len(items) > MAX_MEMORIES:
            _refuse("input", f"more than {MAX_MEMORIES} memories in one call")
    return [check_memory(item, f"line {i + 1}") for i, item in enumerate(items)]


_NOT_JSON = object()


# --- the ledger (its holdings and its file are the store's: store/ledger.py, store/local/ledger.py) ---

def memories(ws, *, limit: int | None = None) -> dict:
    """`synapolis memories`: the consolidated ledger from the store, the newest `limit` lines, oldest first."""
    check_limit(limit)
    store = ws.store
    lines = store.read_ledger()
    total = len(lines)
    if limit is not None:
        lines = lines[-limit:]
    shown = [{"text": line.get("text"), "key": line.get("key"), "tags": line.get("tags") or [],
              "sources": line.get("sources") or [], "merged_at": line.get("merged_at"),
              "session_id": line.get("session_id")} for line in lines if isinstance(line.get("text"), str)]
    return {"memories": shown, "total": total, "ledger": store.ledger_location()}


# --- the protocol --------------------------------------------------------------------------------

def coerce_memories(memories) -> list[dict]:
    """What `tired` accepts: None, the CLI's text (JSON array or JSON lines), or a list of strings/objects."""
    if memories is None:
        return []
    if isinstance(memories, (str, bytes, bytearray)):
        return parse_memories(memories)
    return check_memories(memories)


def staged_id(agent_id: str, memory: dict) -> str:
    """Staging the same memory twice (a retried `tired`) is one row: its id is its content's hash."""
    identity = json.dumps([agent_id, memory.get("key"), memory["text"], memory.get("tags", [])], ensure_ascii=False)
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


def stage(tx, agent_id: str, memories: list[dict], now: datetime) -> int:
    """Inside a write transaction: put `memories` into staged_memories; returns how many rows are new."""
    from .sessions import ts

    stamp = ts(now)
    added = 0
    for memory in memories:
        data = json.dumps(memory, ensure_ascii=False, separators=(",", ":"))
        added += tx.stage_memory(staged_id(agent_id, memory), agent_id, data, stamp)
    return added


def staged_entries(tx) -> tuple[list[dict], list[str]]:
    """Every staged memory as a merge entry (oldest first), and the ids of rows too broken to merge.

    A broken row is left where it is rather than cleared, so nothing staged is ever silently lost.
    """
    entries, broken = [], []
    for row in tx.staged_memories():
        try:
            memory = check_memory(json.loads(row["memory_data"]))
            validate_agent_id(row["agent_id"])
            parse_ts(str(row["created_at"]))
        except (ValueError, TypeError, UsageError):
            broken.append(row["id"])
            continue
        entries.append({**memory, "agent_id": row["agent_id"], "created_at": str(row["created_at"]),
                        "staged_id": row["id"]})
    return entries, broken


def _session_status(ws, session_id: str) -> str | None:
    from .errors import NotFoundError
    from .sessions import read_session

    try:
        return read_session(ws, session_id).get("status")
    except NotFoundError:  # session.json lost (a crash at creation): the database still decides
        return None


def consolidate(tx, ws, *, session_id: str, agent_id: str, now: datetime, announce: bool,
                reader: LedgerReader | None = None) -> dict:
    """Inside the consensus transaction of the last agent: merge everything staged into the ledger.

    The ledger is appended before the transaction commits. A crash in between rolls the database
    back (memories still staged, session not ended) while the ledger keeps its new lines; the next
    `tired` merges the same memories again and `append_to_ledger` skips every line the ledger holds,
    so nothing is doubled and nothing is lost.
    """
    from . import signals as sig

    entries, broken = staged_entries(tx)
    merged = merge_memories(entries, now)
    store = ws.store
    written, held = store.append_ledger(tx, merged, session_id=session_id, merged_by=agent_id, reader=reader)
    ids = [e["staged_id"] for e in entries]
    tx.unstage(ids)
    event = None
    if announce:
        sources = sorted({e["agent_id"] for e in entries})
        content = (f"session {session_id} is going to sleep: {agent_id} was the last active agent and merged "
                   f"{len(entries)} staged memory(ies) from {len(sources)} agent(s) into "
                   f"{'memory/ledger.jsonl' if store.kind == 'sqlite' else 'the shared memory ledger'} "
                   f"({len(written)} new line(s)).")
        # honest delivery: send() stores the broadcast and marks nothing delivered; not rate limited,
        # because the protocol's own announcement must never be refused
        event, _audience = sig.send(tx, caller=agent_id, recipient=sig.BROADCAST, content=content, now=now,
                                    config=ws.config, type_="sleep_event", rate_limited=False)
    return {"consolidated": len(entries), "memories": len(merged), "merged": len(written),
            "already_held": len(held), "unreadable": len(broken), "ledger_lines": written,
            "sleep_event": event["id"] if event else None}


def _probably_last(store, agent_id: str, now: datetime, config) -> bool:
    """A lock-free guess whether the caller will consolidate; the transaction decides for real."""
    from .sessions import count_live_agents

    with store.read() as tx:
        return count_live_agents(tx, now, config, exclude=agent_id) == 0


def tired(ws, who=None, *, memories=None, env=None, piggyback: bool = True, now: datetime | None = None) -> dict:
    """The consensus sleep protocol for the caller (contract §8); returns the `tired` answer.

    Memories are checked before anything is written. Then, in one BEGIN IMMEDIATE transaction: the
    caller's registry row goes idle (fresh), its memories are staged, agents not heard from in
    stale_after_s are flagged `stale`, and the other agents that are `active` and fresh are counted.
    More than zero: standby, commit, return. Zero (or the session has ended already): consolidate
    (see `consolidate`), and after the commit mark the session `ended` in session.json.
    """
    from .agent_call import as_agent
    from .sessions import count_live_agents, end_session, flag_stale_in, ts

    checked = coerce_memories(memories)
    with as_agent(ws, who, env=env, piggyback=piggyback, now=now) as call:
        me, session_id, moment = call.agent_id, call.session_id, call.now
        # heartbeat file and registry go `idle` through the call's own refresh (finish, below)
        ended_before = _session_status(ws, session_id) == "ended"
        result = {"agent_id": me, "session_id": session_id}
        reader = None
        if ended_before or _probably_last(call.store, me, moment, ws.config):
            # read the ledger now, outside the write lock; inside it only the tail is read
            reader = LedgerReader(ws.paths.memory_ledger)
            reader.catch_up()
        with call.store.write() as tx:
            tx.exclusive("sleep")  # one consensus count at a time (SQLite's write transactions are already)
            # first our own row: an agent idle for long must not flag itself stale below
            tx.refresh_agent(me, ts(moment), "idle")
            staged = stage(tx, me, checked, moment)
            flagged = [f["agent_id"] for f in flag_stale_in(tx, moment, ws.config)]
            others = count_live_agents(tx, moment, ws.config, exclude=me)
            result.update(outcome="standby", active_others=others, staged=staged, merged=0,
                          flagged_stale=flagged, ended_before=ended_before)
            if others == 0 or ended_before:
                result["outcome"] = "consolidated"
                result.update(consolidate(tx, ws, session_id=session_id, agent_id=me, now=moment,
                                          announce=not ended_before, reader=reader))
            else:
                result["still_staged"] = tx.count_staged()
            call.finish(result, tx, beat={"status": "idle"}, durable=True)
        if result["outcome"] == "consolidated":
            result["ledger"] = ws.store.ledger_location()
            result["session_status"] = "ended" if ended_before else end_session(ws, session_id, moment)["status"]
        else:
            result["session_status"] = "active"
        # an agent going to sleep lets go of the files guard.auto_claim claimed for it (contract §14)
        from .autoclaim import release_all

        result["released"] = release_all(ws, me, now=now)
        return result
