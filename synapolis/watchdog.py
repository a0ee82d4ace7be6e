"""The watchdog: one cron pass (validate, monitor, escalate, sweep, reap claims, flag stale agents), never two at once."""

from __future__ import annotations

from datetime import datetime

from .atomic import sweep_temp_files
from .timeutil import format_ts

TEMP_MAX_AGE_S = 3600.0


def _flag_stale_sessions(ws, now: datetime) -> list:
    """Mark registry rows not heard from in stale_after_s as `stale` in every active session."""
    from .sessions import flag_stale

    return flag_stale(ws, now=now)


def _reap_claims(ws, now: datetime) -> list:
    """Claims whose lease expired or whose holder is dead, released (an event each)."""
    from .claims import reap

    return reap(ws, now=now)


def _validate(reads) -> dict:
    invalid = [{"agent_id": r.agent_id, "path": str(r.path), "errors": r.errors} for r in reads if not r.valid]
    return {"files": len(reads), "invalid": len(invalid), "invalid_files": invalid}


def run_watchdog(ws, now: datetime | None = None, on_alert=None) -> dict:
    """One pass; `ran` is False (and nothing is done) when another pass holds the lock.

    Each step runs even when an earlier one failed (escalation only after a fresh monitor);
    failures are listed under `errors`.
    """
    from .escalation import run_escalation
    from .monitor import heartbeat_reads, run_monitor

    from .store import clock

    store = ws.store
    now = clock(ws, now)
    # one pass at a time: on this machine (a file lock), and across every machine sharing a store
    with store.exclusive_pass("watchdog", ws.paths.lock("watchdog")) as got:
        if not got:
            return {"ran": False, "at": format_ts(now), "message": "a watchdog pass is already running; nothing done"}
        result = {"ran": True, "at": format_ts(now), "validate": None, "monitor": None, "escalation": None,
                  "swept": [], "claims_reaped": None, "sessions_flagged": [], "errors": []}

        def step(name, call):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - one broken step must not stop the others
                result["errors"].append({"step": name, "type": type(exc).__name__, "message": str(exc)})
                return None

        reads = step("validate", lambda: heartbeat_reads(ws))
        if reads is not None:
            result["validate"] = _validate(reads)
            document = step("monitor", lambda: run_monitor(ws, now=now, reads=reads))
            if document is not None:
                result["monitor"] = {"generated_at": document["generated_at"], "counts": document["counts"],
                                     "transitions": document["transitions"]}
        if result["monitor"] is None:
            # escalating against an outdated monitor would open or resolve incidents on old news
            result["errors"].append({"step": "escalate", "type": "Skipped", "message": "no fresh monitor"})
            escalation = None
        else:
            escalation = step("escalate", lambda: run_escalation(ws, now=now, on_alert=on_alert))
        if escalation is not None:
            result["escalation"] = {"events": escalation["events"], "open": len(escalation["incidents"])}
        swept = step("sweep", lambda: sweep_temp_files(ws.root, TEMP_MAX_AGE_S, now=now.timestamp()))
        result["swept"] = [str(p) for p in swept or []]
        result["claims_reaped"] = step("reap_claims", lambda: _reap_claims(ws, now))
        result["sessions_flagged"] = step("flag_sessions", lambda: _flag_stale_sessions(ws, now)) or []
    return result
