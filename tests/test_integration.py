"""The pieces together: the watchdog's warn broadcast into sessions, registry flagging, claims freed."""

from __future__ import annotations

from datetime import timedelta

from conftest import NOW

from synapolis import actions, claims, watchdog
from synapolis.identity import Who


def test_watchdog_pass_warns_peers_flags_registry_and_frees_claims(ws, start_agent, db_rows):
    ada = start_agent("ada")
    start_agent("bob", session_id=ada["session_id"])
    session = ada["session_id"]
    claims.claim(ws, "ticket:142", "bob", session_id=session, now=NOW)

    # bob goes silent at NOW; ada keeps beating; two hours later bob is dead
    later = NOW + timedelta(hours=2)
    actions.beat(ws, Who("ada", session), env={}, now=later)
    result = watchdog.run_watchdog(ws, now=later)

    assert result["ran"] and not result["errors"]
    opened = [e for e in result["escalation"]["events"] if e["event"] in ("opened", "raised")]
    assert [(e["event"], e["agent_id"], e["level"], e["alert"]["ok"]) for e in opened] == [("opened", "bob", 2, True)]
    # the peer learns it at once: a warn broadcast from the watchdog, waiting in ada's inbox
    inbox = actions.read_signals(ws, Who("ada", session), env={}, now=later)["signals"]
    warns = [s for s in inbox if s["type"] == "warn"]
    assert len(warns) == 1 and warns[0]["sender"] == "synapolis.watchdog" and "bob" in warns[0]["content"]
    # the registry row of the silent agent is flagged stale, the live one is not
    rows = {r["id"]: r["status"] for r in db_rows(session, "SELECT id, status FROM agents")}
    assert rows == {"ada": "active", "bob": "stale"}
    # the dead holder's claim is free again, with an event for it
    reaped = result["claims_reaped"]
    assert [r["item"] for r in reaped] == ["ticket:142"]
    taken = claims.claim(ws, "ticket:142", "ada", session_id=session, now=later)
    assert taken["token"] == 2

    # a second pass changes nothing and warns nobody again
    again = watchdog.run_watchdog(ws, now=later + timedelta(seconds=1))
    assert [e for e in again["escalation"]["events"] if e["event"] in ("opened", "raised")] == []
    inbox = actions.read_signals(ws, Who("ada", session), env={}, now=later)["signals"]
    assert len([s for s in inbox if s["type"] == "warn"]) == 1
