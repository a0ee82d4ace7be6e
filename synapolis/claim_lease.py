"""The Claim record as a context manager: its lease renewed from a thread while held, released after."""

from __future__ import annotations

import math
import time
from datetime import datetime

from . import claim_ops
from .errors import BusyError, InternalError, NotFoundError, StaleToken, UsageError


class Claim(dict):
    """A claim record — a plain mapping, exactly the claim file — that is also a context manager.

    `with claim(...) as c:` renews the lease from a background thread every ttl/3 (refreshing the
    holder's heartbeat too, so a script that never beats is not taken over as 'missing') and
    releases on exit. `event` says what the call that produced it did (None: nothing changed).
    """

    def __init__(self, record: dict, *, ws=None, agent_id: str | None = None, session_id: str | None = None,
                 ttl_s: float | None = None, event: str | None = None, beat: bool = True):
        super().__init__(record)
        self.event = event
        self.lost: Exception | None = None  # why renewal stopped, when it did
        self._ws, self._agent_id, self._session_id, self._ttl_s = ws, agent_id, session_id, ttl_s
        self._beat = beat
        # the renewal thread and its stop event exist only while held (`with`): threading stays unloaded
        # for the CLI, which only claims
        self._stop = None
        self._thread = None
        self.overlaps: list[str] = []  # the caller's own held items overlapping this path claim (§14)

    @property
    def token(self) -> int:
        return self["token"]

    @property
    def item(self) -> str:
        return self["item"]

    def _refresh(self, record: dict) -> None:
        self.update(record)

    def check(self, now: datetime | None = None) -> dict:
        """The live record, or StaleToken when this claim's token is no longer the live one."""
        record = claim_ops.check(self._ws, self.item, self.token, now=now)
        self._refresh(record)
        return record

    def renew(self, now: datetime | None = None) -> dict:
        record = claim_ops.renew_record(self._ws, self.item, self._agent_id, self.token, ttl_s=self._ttl_s, now=now)
        self._refresh(record)
        return record

    def release(self, reason: str | None = None) -> dict:
        self._stop_renewing()
        record, _event = claim_ops.release_record(self._ws, self.item, self._agent_id, reason=reason, token=self.token)
        self._refresh(record)
        return record

    def _renew_loop(self, beat_every: float | None) -> None:
        """Renew the lease every ttl/3 and, when beating, the heartbeat every third of its own ttl
        (a lease of an hour must not let the heartbeat go stale, which would invite a take-over)."""
        renew_every = max(self._ttl_s / 3.0, 0.05)
        next_renew = time.monotonic() + renew_every
        next_beat = time.monotonic() + beat_every if beat_every else math.inf
        while not self._stop.wait(max(0.0, min(next_renew, next_beat) - time.monotonic())):
            moment = time.monotonic()
            if moment >= next_beat:
                next_beat = moment + beat_every
                try:
                    beat_holder(self._ws, self._agent_id, self._session_id)
                except (OSError, UsageError, InternalError):
                    pass  # the lease is what matters here; the next beat tries again
            if moment < next_renew:
                continue
            try:
                self.renew()
                next_renew = moment + renew_every
            except BusyError:
                continue  # the lock stayed busy for busy_timeout_ms: try again at once
            except Exception as exc:  # noqa: BLE001 - lost (StaleToken) or broken: stop and say why
                self.lost = exc
                return

    def _stop_renewing(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            import threading

            if self._thread is not threading.current_thread():
                self._thread.join(timeout=max(5.0, self._ws.config.busy_timeout_ms / 1000.0 + 1))
        self._thread = None

    def __enter__(self) -> "Claim":
        if self._ws is None or self._agent_id is None:
            raise InternalError("this claim record was not made by claim() and cannot be held")
        beat_every = None
        if self._beat:
            doc = beat_holder(self._ws, self._agent_id, self._session_id)
            beat_every = max((doc.get("ttl_s") or self._ws.config.stale_after_s) / 3.0, 0.05)
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, args=(beat_every,),
                                        name=f"claim-renew {self.item}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._stop_renewing()
        try:
            self._refresh(claim_ops.release_record(self._ws, self.item, self._agent_id, token=self.token)[0])
        except (StaleToken, NotFoundError):
            pass  # lost already (taken over, reaped or force-released): nothing of ours to release
        except Exception:  # noqa: BLE001
            if exc_type is None:
                raise  # never hide the body's own exception behind a failed release
        return False


def beat_holder(ws, agent_id: str, session_id: str | None = None) -> dict:
    """Refresh the holder's heartbeat (same status and task), as every act of an agent does (§7)."""
    from .heartbeat import write_heartbeat

    # a refresh, not a declaration: atomic but not fsynced, like every other verb's refresh
    return write_heartbeat(ws.paths, agent_id, session_id=session_id, durable=False)
