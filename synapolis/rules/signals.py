"""The signal rules: who sees a signal, whom it reaches, who is live to hear it, pages, the rate bucket, Lamport."""

from __future__ import annotations

from datetime import datetime

from ..errors import RateLimitedError
from ..names import id_chain, is_subagent_of

BROADCAST = "*"


def is_visible(row, agent_id: str) -> bool:
    """Whether reader `agent_id` sees this signal at all (history included)."""
    recipient, sender = row["recipient"], row["sender"]
    if recipient == BROADCAST:
        return sender != agent_id and not is_subagent_of(sender, agent_id)
    return recipient == agent_id or is_subagent_of(recipient, agent_id)


def json_cost(signal: dict) -> int:
    """About how many characters `signal` takes in a JSON answer: its content escaped, plus the rest."""
    import json

    return len(json.dumps(signal["content"])) + len(signal["sender"]) + len(signal["recipient"]) + 360


def fit(signals: list, limit: int | None, budget_chars: int | None, at_least_one: bool = True) -> int:
    """How many leading `signals` make a page within `limit` and `budget_chars`. With `at_least_one`
    the first is always in (one signal over the budget must not stall paging); a hook's hard cap is not."""
    used = 0
    for count, item in enumerate(signals):
        if limit is not None and count >= limit:
            return count
        used += json_cost(item)
        if budget_chars is not None and used > budget_chars and not (at_least_one and count == 0):
            return count
    return len(signals)


# the registered ids a directed signal may reach: the recipient and each agent it is a sub-agent of
recipient_chain = id_chain


_WINDOW_RULES: tuple = ()  # (LIVE_REGISTRY_STATUSES, registry_window), from status when a send first needs them


def _window_rules() -> tuple:
    """status's liveness rule, imported where a send first judges an audience (the other hot verbs never do)
    and kept, so later sends skip the import statement."""
    global _WINDOW_RULES
    from ..status import LIVE_REGISTRY_STATUSES, registry_window

    _WINDOW_RULES = (LIVE_REGISTRY_STATUSES, registry_window)
    return _WINDOW_RULES


def audience(rows, now: datetime, config) -> dict:
    """Which recipients are live and which the signal waits for (stale, asleep, stopped). `rows`: registry rows
    (by name: `id`, `status`, `last_heartbeat`), or plain (id, status, last_heartbeat) tuples."""
    live_states, registry_window = _WINDOW_RULES or _window_rules()
    # status.registry_live, written out once for every row: a broadcast judges each registered agent
    cutoff, ceiling = registry_window(now, config)
    live, waiting, status = [], [], {}
    if rows and not isinstance(rows[0], tuple):  # registry rows by name; (id, status, last_heartbeat) as they are
        rows = [(r["id"], r["status"], r["last_heartbeat"]) for r in rows]
    for agent_id, state, beat in rows:
        if state in live_states:
            if beat and cutoff <= beat <= ceiling:
                live.append(agent_id)
                continue
            state = "stale"
        waiting.append(agent_id)
        status[agent_id] = state
    return {"live": live, "waiting": waiting, "waiting_status": status}


def rate_limited_error(agent_id: str, tokens: float, rate: float) -> RateLimitedError:
    wait = (1.0 - tokens) / (rate / 60.0)
    return RateLimitedError(f"{agent_id} has sent {int(rate)} signals in the last minute "
                            f"(rate_limit_per_min): retry in {wait:.1f} s", retry_after_s=wait)


def bucket_tokens(row, moment: float, rate: float) -> float:
    """The tokens in an agent's bucket at `moment` (epoch seconds): `rate` a minute, refilled continuously
    since the row (`tokens`, `updated_at`) was written; a full bucket without a row."""
    per_s = rate / 60.0
    return rate if row is None else min(rate, row["tokens"] + max(0.0, moment - row["updated_at"]) * per_s)


def next_lamport(clock: int, replied: int | None = None) -> int:
    """A send's Lamport value: one past the sender's clock and, for a reply, past the signal it answers."""
    return (clock if replied is None else max(clock, replied)) + 1


def follow_from(first: dict, limit: int | None) -> int:
    """The sequence a follower goes on after, given its first page (read_signals' answer): the page's end when
    the page was cut short by its size (PAGE_LIMIT or the character budget, never by the caller's own `limit`),
    so the unread signals beyond it are printed next; else the newest it can see."""
    shown = [s["sequence"] for s in first["signals"]]
    cut = first.get("next_after") is not None and (limit is None or len(shown) < limit)
    return first["next_after"] if cut else max(shown + [first.get("latest_sequence") or 0])
