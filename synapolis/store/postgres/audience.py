"""A broadcast's audience on the PostgreSQL store, kept between broadcasts while the session's audience epoch holds."""

from __future__ import annotations

from datetime import timedelta

from ...timeutil import micro_stamp, parse_ts
from ..audience import KeptAudience
from .schema import AUDIENCE_JUMP_S

_JUMP = timedelta(seconds=AUDIENCE_JUMP_S)


class PostgresAudience(KeptAudience):
    """The audience a broadcast read (store/audience.py) with the session's audience epoch read before it.

    PostgreSQL has no `data_version`, and a counter every heartbeat moved would queue the swarm's heartbeats on one
    row. So the schema's trigger (version 13) draws a new epoch only for the changes that can move an audience
    whatever the window: a registration or its removal, a status, and a heartbeat that goes back, to or from
    nothing, or forward by AUDIENCE_JUMP_S or more. synapolis_send, given the epoch it still is, reads nothing.

    What is kept then still holds when the window `covers` it and both of these hold, which make every heartbeat
    that drew no epoch leave its agent where it was:
    - the latest live heartbeat is at least AUDIENCE_JUMP_S below the ceiling: a live agent's heartbeat moved
      forward by less stays at or below it, and stays live;
    - the latest heartbeat of an active or idle agent below the cutoff (turned stale, not yet flagged) is at
      least AUDIENCE_JUMP_S below the cutoff: that agent's heartbeat moved forward by less stays below it.
    Otherwise it is read again, as a first broadcast is."""

    __slots__ = ("epoch", "clear_of_ceiling", "clear_of_cutoff")

    def __init__(self, epoch: int, window: tuple, live_ids: list, leaves, top, waiting_rows: list):
        super().__init__(window, live_ids, leaves, waiting_rows)
        self.epoch = epoch
        cutoff = window[0]
        stale = max((beat for _id, state, beat in waiting_rows
                     if state in ("active", "idle") and beat is not None and beat < cutoff), default=None)
        self.clear_of_ceiling = _jumped(top)
        self.clear_of_cutoff = _jumped(stale)

    def epoch_for(self, window: tuple) -> int | None:
        """The epoch to send with a broadcast in `window`: what is kept answers for it if the session's epoch is
        still this one. None when the window alone rules it out."""
        cutoff, ceiling = window
        if (self.covers(window) and (self.clear_of_ceiling is None or self.clear_of_ceiling <= ceiling)
                and (self.clear_of_cutoff is None or self.clear_of_cutoff <= cutoff)):
            return self.epoch
        return None


def _jumped(stamp: str | None) -> str | None:
    """`stamp` plus AUDIENCE_JUMP_S, in the same fixed-width text, so that the checks above compare text as the
    store does; a stamp that does not parse or overflows rules keeping out (the far end of time)."""
    if stamp is None:
        return None
    try:
        return micro_stamp(parse_ts(stamp) + _JUMP)
    except (ValueError, OverflowError):
        return "\uffff"
