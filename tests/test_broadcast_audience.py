"""A broadcast's audience kept between broadcasts by a long-lived store (issue 31) answers exactly what a fresh
read of the registry would: after other connections' and other processes' commits, this connection's own
writes, a rollback, and time moving the live window forward or back."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import timedelta

import pytest

from conftest import NOW, clean_env, synapolis_cmd
from synapolis import signals
from synapolis.sessions import ts
from synapolis.store import open_session
from synapolis.timeutil import parse_ts
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
    """600 random steps, each followed by a broadcast from a long-lived store compared with the rule over the
    registry's rows: registry changes committed by another connection, heartbeats it moves a little (over the
    window's edges, by less and by more than PostgreSQL's epoch jump), rows this connection changes itself, a
    registration rolled back after a broadcast saw it, and `now` moving by seconds, past the stale window,
    or back."""
    sid, names = crowd
    rng = random.Random(31)
    stale, skew = float(ws.config.stale_after_s), float(ws.config.clock_skew_s)
    kept, other = open_session(ws, sid), open_session(Workspace.open(ws.paths.root), sid)
    now, hits, reads, touched = NOW, 0, [], names[1]
    # count the registry reads: a quiet step answers from what was kept (on PostgreSQL, when the window allows)
    if ws.store.kind == "sqlite":
        from synapolis.store.local.audience import AudienceCache

        real = AudienceCache._read
        monkeypatch.setattr(AudienceCache, "_read", lambda self, *a: reads.append(1) or real(self, *a))
    else:
        from synapolis.store.postgres.audience import PostgresAudience

        made = PostgresAudience.__init__
        monkeypatch.setattr(PostgresAudience, "__init__", lambda self, *a: reads.append(1) or made(self, *a))
    # heartbeats on and around the window's edges, and forward or back by more and by less than the audience
    # epoch's jump (PostgreSQL: a move by less draws no epoch)
    jump = 60.0
    offsets = [-stale - 5, -stale - 1, -stale, -stale + 1, -stale / 2, -jump, -jump / 2, 0.0, jump / 2, skew - 1,
               skew, skew + 1, skew + 30]
    try:
        for step in range(600):
            kind = rng.choice(["other", "other", "own", "beat", "beat", "beat", "rollback", "time", "time", "none",
                               "none"])
            # a beat moves the agent another connection changed last, half the time: its way over an edge
            agent = touched if kind == "beat" and rng.random() < 0.5 else rng.choice(names)
            status = rng.choice(STATUSES)
            stamp = ts(now + timedelta(seconds=rng.choice(offsets)))
            if kind == "other":  # another connection commits (as another process would)
                touched = agent
                with other.write() as tx:
                    tx.refresh_agent(agent, stamp, status)
            elif kind == "beat":  # another connection moves a heartbeat a little, its status as it is
                with other.write() as tx:
                    row = tx.agent(agent)
                    if row["last_heartbeat"] is not None:
                        moved = parse_ts(row["last_heartbeat"]) + timedelta(seconds=rng.choice([-1, 1, 2, 30, 59, 61]))
                        tx.refresh_agent(agent, ts(moved), row["status"])
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
                now += timedelta(seconds=rng.choice([1.0, jump / 2, jump + 1, stale / 3, stale + 1, -stale / 2]))
            sender = rng.choice(["a00", "a03.x.y", "b.c", "a07"])
            before = len(reads)
            got = broadcast(kept, ws, sender, now)
            assert got == expected(kept, ws, sender, now), f"step {step} ({kind})"
            if kind == "none" and ws.store.kind == "sqlite":
                assert len(reads) == before, f"step {step}: read again with nothing changed"
            hits += kind != "rollback" and len(reads) == before
    finally:
        kept.close()
        other.close()
    assert hits > 40  # steps answered from what was kept happened (and matched)


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
    """Schema 12 adds agents_by_liveness and synapolis_send's two window parameters, 13 the audience epoch (its
    table, sequence and triggers) and the epoch parameter (the older functions of a database made before stay,
    for machines not yet upgraded); a broadcast then answers the rule's audience, and a registration draws a
    new epoch."""
    import psycopg

    from conftest import use_store
    from synapolis.store import close_all
    from synapolis.store.postgres.schema import SCHEMA_VERSION

    from synapolis import actions

    ws = use_store(tmp_path / "state", pg_url)
    sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]  # the schema made, at 13
    close_all()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP INDEX agents_by_liveness")
        conn.execute("DROP FUNCTION synapolis_send(TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT[], "
                     "DOUBLE PRECISION, DOUBLE PRECISION, TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, BIGINT)")
        conn.execute("DROP TRIGGER agents_audience_joined ON agents")
        conn.execute("DROP TRIGGER agents_audience_moved ON agents")
        conn.execute("DROP TABLE audience_epochs")
        conn.execute("UPDATE synapolis_schema SET version = 11")
    ws = Workspace.open(ws.paths.root)
    actions.start(ws, agent_id="bob", session_id=sid, env={}, now=NOW)
    with psycopg.connect(pg_url) as conn:
        epoch = conn.execute("SELECT epoch FROM audience_epochs WHERE session_id = %s", (sid,)).fetchone()[0]
    actions.start(ws, agent_id="carol", session_id=sid, env={}, now=NOW)
    with open_session(ws, sid) as store:
        with store.write() as tx:
            tx.refresh_agent("carol", ts(NOW), "sleeping")
        assert broadcast(store, ws, "alice", NOW) == {"live": ["bob"], "waiting": ["carol"],
                                                      "waiting_status": {"carol": "sleeping"}}
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM synapolis_schema").fetchone()[0] == SCHEMA_VERSION == 13
        assert conn.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'agents_by_liveness'").fetchone()
        arities = [row[0] for row in conn.execute("SELECT pronargs FROM pg_proc WHERE proname = 'synapolis_send'")]
        assert 18 in arities
        later = conn.execute("SELECT epoch FROM audience_epochs WHERE session_id = %s", (sid,)).fetchone()[0]
        assert later > epoch  # carol's registration and status each drew one


def test_only_changes_that_can_move_an_audience_draw_a_postgresql_epoch(tmp_path, pg_url):
    """Schema 13's triggers, seen in the database's own rows: a registration, a status and a heartbeat moved by
    AUDIENCE_JUMP_S or back each draw a new epoch, at the commit; a send (the caller's clock) and a heartbeat
    moved forward by less draw none; a rolled-back registration leaves the epoch as it was."""
    import psycopg

    from conftest import use_store
    from synapolis import actions
    from synapolis.store.postgres.schema import AUDIENCE_JUMP_S

    ws = use_store(tmp_path / "state", pg_url)
    sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, now=NOW)

    def epoch():
        with psycopg.connect(pg_url) as conn:
            return conn.execute("SELECT epoch FROM audience_epochs WHERE session_id = %s", (sid,)).fetchone()[0]

    def beat(seconds, status="active"):
        with open_session(ws, sid) as store, store.write() as tx:
            tx.refresh_agent("bob", ts(NOW + timedelta(seconds=seconds)), status)

    drawn = [epoch()]
    beat(AUDIENCE_JUMP_S - 1)  # forward by less: nothing
    with open_session(ws, sid) as store:
        broadcast(store, ws, "alice", NOW)  # the caller's clock moves: nothing
    assert epoch() == drawn[-1]
    for seconds, status in ((2 * AUDIENCE_JUMP_S - 1, "active"), (AUDIENCE_JUMP_S, "active"),
                            (AUDIENCE_JUMP_S, "sleeping")):  # forward by the jump, back, a status
        beat(seconds, status)
        drawn.append(epoch())
        assert drawn[-1] > drawn[-2]
    with pytest.raises(RuntimeError), open_session(ws, sid) as store, store.write() as tx:
        tx.register_agent("ghost", harness="test", substrate="", stamp=ts(NOW), run_token="t")
        raise RuntimeError("rolled back")
    assert epoch() == drawn[-1]
    actions.start(ws, agent_id="carol", session_id=sid, env={}, now=NOW)
    assert epoch() > drawn[-1]


MOVER = r"""
import sys
from datetime import timedelta
from synapolis.sessions import ts
from synapolis.store import open_session
from synapolis.timeutil import parse_ts
from synapolis.workspace import Workspace
root, name, sid, base, rounds = sys.argv[1:6]
ws = Workspace.open(root)
with open_session(ws, sid) as store:
    for i in range(int(rounds)):
        # each round one transaction: the agent's heartbeat forward by more than the epoch's jump, its status
        # flipped, every third round a newcomer registered; the epoch's row is the last lock each one takes
        with store.write() as tx:
            stamp = ts(parse_ts(base) + timedelta(seconds=61 * (i + 1)))
            tx.refresh_agent(name, stamp, "idle" if i % 2 else "active")
            if i % 3 == 0:
                tx.register_agent(f"{name}-n{i}", harness="test", substrate="", stamp=stamp, run_token=f"t{i}")
"""


def test_registry_changes_from_six_processes_on_two_machines_never_deadlock_and_the_kept_audience_follows(
        tmp_path, pg_url):
    """Six processes on two state directories change the registry at once, each transaction drawing epochs
    (heartbeats that jump, statuses, registrations), while a long-lived store broadcasts all along: no
    transaction fails (no deadlock, no lost epoch), and the broadcast after them answers the rule's audience."""
    from conftest import use_store
    from synapolis import actions

    laptop, runner = use_store(tmp_path / "laptop", pg_url), use_store(tmp_path / "runner", pg_url)
    sid = actions.start(laptop, agent_id="caller", env={}, now=NOW)["session_id"]
    movers = [f"m{i}" for i in range(6)]
    for i, name in enumerate(movers):
        actions.start(laptop if i % 2 else runner, agent_id=name, session_id=sid, env={}, now=NOW)
    rounds = 12
    later = NOW + timedelta(seconds=61 * rounds)  # every mover's last heartbeat is live then
    with open_session(laptop, sid) as store:
        broadcast(store, laptop, "caller", later)  # kept before the movers start
        procs = [subprocess.Popen([sys.executable, "-c", MOVER, str((laptop if i % 2 else runner).paths.root), name,
                                   sid, ts(NOW), str(rounds)], env=clean_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i, name in enumerate(movers)]
        while any(p.poll() is None for p in procs):
            broadcast(store, laptop, "caller", later)
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [err[-800:] for _out, err in outs]
        heard = broadcast(store, laptop, "caller", later)
        assert heard == expected(store, laptop, "caller", later)
        assert len(heard["live"]) + len(heard["waiting"]) == 6 + 6 * 4  # the movers and their newcomers
        assert set(movers) <= set(heard["live"])
