"""A broadcast's audience kept between broadcasts by a long-lived store (issue 31) answers exactly what a fresh
read of the registry would: after other connections' and other processes' commits, this connection's own
writes, a rollback, and time moving the live window forward or back."""

from __future__ import annotations

import random
import subprocess
from datetime import timedelta

import pytest

from conftest import NOW, clean_env, synapolis_cmd
from synapolis import signals
from synapolis.sessions import ts
from synapolis.store import open_session
from synapolis.workspace import Workspace

STATUSES = ("active", "idle", "sleeping", "stale")


def broadcast(store, ws, sender, now):
    with store.write() as tx:
        return signals.send(tx, caller=sender, recipient="*", content="all hands", now=now, config=ws.config,
                            rate_limited=False)[1]


def expected(store, ws, sender, now):
    """signals.audience over every registry row but the sender's chain: the rule the store's answer must match."""
    chain = {".".join(sender.split(".")[:i]) for i in range(1, sender.count(".") + 2)}
    with store.read() as tx:
        rows = [(r["id"], r["status"], r["last_heartbeat"]) for r in tx.agents() if r["id"] not in chain]
    return signals.audience(sorted(rows), now, ws.config)


@pytest.fixture
def crowd(ws, start_agent):
    """A session of 30 agents (some sub-agents); returns (session id, the ids)."""
    sid = start_agent("a00")["session_id"]
    names = ["a00"] + [f"a{i:02d}" for i in range(1, 25)] + ["a00.helper", "a03.x", "a03.x.y", "b", "b.c"]
    for name in names[1:]:
        start_agent(name, session_id=sid)
    return sid, names


def test_the_kept_audience_matches_a_fresh_read_through_every_change(ws, crowd, monkeypatch):
    """400 random steps, each followed by a broadcast from a long-lived store compared with the rule over the
    registry's rows: registry changes committed by another connection, rows this connection changes itself, a
    registration rolled back after a broadcast saw it, and `now` moving by seconds, past the stale window,
    or back."""
    sid, names = crowd
    rng = random.Random(31)
    stale, skew = float(ws.config.stale_after_s), float(ws.config.clock_skew_s)
    kept, other = open_session(ws, sid), open_session(Workspace.open(ws.paths.root), sid)
    now, hits, reads = NOW, 0, []
    if ws.store.kind == "sqlite":  # count the registry reads: a quiet step must answer from what was kept
        from synapolis.store.local.audience import AudienceCache

        real = AudienceCache._read
        monkeypatch.setattr(AudienceCache, "_read", lambda self, *a: reads.append(1) or real(self, *a))
    try:
        for step in range(400):
            kind = rng.choice(["other", "other", "own", "rollback", "time", "time", "none"])
            agent = rng.choice(names)
            status = rng.choice(STATUSES)
            stamp = ts(now + timedelta(seconds=rng.choice([-stale - 5, -stale, -stale / 2, 0.0, skew, skew + 30])))
            if kind == "other":  # another connection commits (as another process would)
                with other.write() as tx:
                    tx.refresh_agent(agent, stamp, status)
            elif kind == "own":  # this connection changes a row itself
                with kept.write() as tx:
                    tx.refresh_agent(agent, stamp, status)
            elif kind == "rollback":  # a registration a broadcast saw, then rolled back
                with pytest.raises(RuntimeError), kept.write() as tx:
                    tx.register_agent(f"ghost{step}", harness="test", substrate="", stamp=ts(now), run_token=f"t{step}")
                    heard = signals.send(tx, caller="a00", recipient="*", content="x", now=now, config=ws.config,
                                         rate_limited=False)[1]
                    assert f"ghost{step}" in heard["live"]
                    raise RuntimeError("rolled back")
            elif kind == "time":
                now += timedelta(seconds=rng.choice([1.0, stale / 3, stale + 1, -stale / 2]))
            sender = rng.choice(["a00", "a03.x.y", "b.c", "a07"])
            before = len(reads)
            got = broadcast(kept, ws, sender, now)
            assert got == expected(kept, ws, sender, now), f"step {step} ({kind})"
            if kind == "none":
                hits += 1
                assert len(reads) == before, f"step {step}: read again with nothing changed"
    finally:
        kept.close()
        other.close()
    assert hits > 20  # the quiet steps happened (each one answered from what was kept, and matched)


def test_an_agent_another_process_starts_is_in_the_next_broadcast(ws, crowd):
    """A real `synapolis start` in another process between two broadcasts of one long-lived store."""
    sid, names = crowd
    with open_session(ws, sid) as store:
        first = broadcast(store, ws, "a00", NOW)
        assert "newcomer" not in first["live"] and len(first["live"]) == len(names) - 1  # all but a00
        done = subprocess.run(synapolis_cmd(ws.paths.root, "start", "--agent-id", "newcomer", "--session-id", sid,
                                            "--json"), env=clean_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        # the newcomer's heartbeat is the real clock's; judge the next broadcast at that moment
        from synapolis.store import clock

        later = clock(ws)
        second = broadcast(store, ws, "a00", later)
        assert "newcomer" in second["live"] + second["waiting"]
        assert second == expected(store, ws, "a00", later)


def test_the_live_window_of_a_moment_is_its_own_within_a_second_and_across():
    """registry_window reuses the edges of the second it last judged (only the microseconds change within one):
    every moment's window is the one formatted afresh, whether its second was seen just before or not, with
    whole and fractional thresholds and a ceiling past the end of time."""
    from types import SimpleNamespace

    from synapolis.status import registry_window
    from synapolis.timeutil import micro_stamp

    rng = random.Random(7)
    for stale, skew, start in ((300, 30, NOW), (300.5, 30, NOW), (90, 0, NOW), (10, 10 ** 12, NOW),
                               (300, 30, NOW.replace(year=1969, month=12, day=31, hour=23, minute=59))):
        config = SimpleNamespace(stale_after_s=stale, clock_skew_s=skew)
        moment = start  # (the last: seconds before the epoch and across it)
        for _ in range(300):
            moment += timedelta(microseconds=rng.choice([1, 999, 250_000, 1_000_000, 3_600_000_000]))
            cutoff = micro_stamp(moment - timedelta(seconds=stale))
            try:
                ceiling = micro_stamp(moment + timedelta(seconds=skew))
            except OverflowError:
                ceiling = "9999-12-31T23:59:59.999999Z"
            assert registry_window(moment, config) == (cutoff, ceiling)


def test_a_postgresql_database_of_schema_11_judges_broadcasts_in_the_send_after_the_upgrade(tmp_path, pg_url):
    """Schema 12 adds agents_by_liveness and synapolis_send's two window parameters (the 15-parameter function
    of a database made before stays, for machines not yet upgraded); a broadcast then answers the rule's audience."""
    import psycopg

    from conftest import use_store
    from synapolis.store import close_all
    from synapolis.store.postgres.schema import SCHEMA_VERSION

    from synapolis import actions

    ws = use_store(tmp_path / "state", pg_url)
    sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]  # the schema made, at 12
    close_all()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP INDEX agents_by_liveness")
        conn.execute("DROP FUNCTION synapolis_send(TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT[], "
                     "DOUBLE PRECISION, DOUBLE PRECISION, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT)")
        conn.execute("UPDATE synapolis_schema SET version = 11")
    ws = Workspace.open(ws.paths.root)
    for name in ("bob", "carol"):
        actions.start(ws, agent_id=name, session_id=sid, env={}, now=NOW)
    with open_session(ws, sid) as store:
        with store.write() as tx:
            tx.refresh_agent("carol", ts(NOW), "sleeping")
        assert broadcast(store, ws, "alice", NOW) == {"live": ["bob"], "waiting": ["carol"],
                                                      "waiting_status": {"carol": "sleeping"}}
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM synapolis_schema").fetchone()[0] == SCHEMA_VERSION == 12
        assert conn.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'agents_by_liveness'").fetchone()
        arities = [row[0] for row in conn.execute("SELECT pronargs FROM pg_proc WHERE proname = 'synapolis_send'")]
        assert 17 in arities
