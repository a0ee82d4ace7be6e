"""The `claims` verb's answer (contract §9, §14): every claim and who waits for what, at the store's clock.

One library function, so that the team server answers it for a machine that has only the server (§16) exactly
as the CLI beside the store does.
"""

from __future__ import annotations

from datetime import datetime


def claims_view(ws, *, held_only: bool = False, now: datetime | None = None) -> dict:
    """`claims` (each claim file with its state and holder status) and `waiting` (the waiters), and `now`: the
    moment they were read at, as text (the store's clock, which the ages shown to people are counted from)."""
    from .claim_waits import waiting
    from .claims import list_claims
    from .store import clock
    from .timeutil import format_ts

    moment = clock(ws, now)
    return {"claims": list_claims(ws, moment, held_only=held_only), "waiting": waiting(ws, moment),
            "now": format_ts(moment)}
