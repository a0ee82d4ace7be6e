"""The PostgreSQL store with real processes: two state directories standing for two machines, one database.

Every test here needs a PostgreSQL server (tests/conftest.py `pg_server`: $SYNAPOLIS_TEST_PG_URL or a
throwaway one from scripts/synapolis-test-postgres); without one they skip, in CI they fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from synapolis import actions
from synapolis.sessions import read_session
from synapolis.errors import BusyError
from synapolis.identity import Who
from synapolis.workspace import Workspace

from conftest import (PG_SCRIPT, clean_env, console_script, no_postgres, store_rows, use_store, wait_until,
                      wait_until_async)

FAST = {"rate_limit_per_min": 100000}


def _config(ws, **values) -> Workspace:
    document = json.loads(ws.paths.config.read_text())
    document.update(values)
    ws.paths.config.write_text(json.dumps(document))
    return Workspace.open(ws.root)


@pytest.fixture
def machines(tmp_path, pg_url):
    """Two state directories ("laptop", "runner") pointing at one fresh database."""
    a = _config(use_store(tmp_path / "laptop", pg_url), **FAST)
    b = _config(use_store(tmp_path / "runner", pg_url), **FAST)
    return a, b


def run_cli(ws, *args, input=None, env=None, timeout=60):
    cmd = [sys.executable, "-m", "synapolis", "--state-dir", str(ws.root), *map(str, args)]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=clean_env(env))


def test_cross_machine_signals_are_delivered_exactly_once(machines):
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    bob, alice = Who("bob", sid), Who("alice", sid)
    sent = [actions.signal(runner, bob, to, text, env={}, piggyback=False)["signal"]["id"]
            for to, text in (("alice", "directed"), ("*", "broadcast"), ("alice.tests", "to a sub-agent"))]
    first = actions.signals_pending(laptop, alice, env={})["pending_signals"]
    assert [s["id"] for s in first] == sent
    assert [s["sequence"] for s in first] == sorted(s["sequence"] for s in first)
    assert actions.signals_pending(laptop, alice, env={})["pending_signals"] == []
    rows = store_rows(laptop, sid, "SELECT signal_id, delivery_method FROM signal_deliveries WHERE agent_id = ?",
                      ("alice",))
    assert sorted(r["signal_id"] for r in rows) == sorted(sent) and {r["delivery_method"] for r in rows} == {"poll"}
    # both machines list both agents, and the laptop's session is the runner's
    ids = {a["id"] for a in actions.list_agents(runner, bob, env={})["agents"]}
    assert ids == {"alice", "bob"}
    assert not runner.paths.session_db(sid).exists()  # nothing of the session is in the local files


WRITER = r"""
import json, sys
from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
who = Who(sys.argv[2], sys.argv[3])
for i in range(int(sys.argv[4])):
    out = actions.signal(ws, who, sys.argv[5], f"{sys.argv[2]}-{i}", env={}, piggyback=False)
    print(out["signal"]["id"], flush=True)
"""


def test_eight_writers_on_two_machines_and_a_draining_reader(machines):
    """Every signal reaches the reader once, none skipped, in strictly increasing `sequence`, while
    eight processes on both machines commit concurrently."""
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="reader", session_id="s1", env={})["session_id"]
    writers = [f"w{i}" for i in range(8)]
    for i, name in enumerate(writers):
        actions.start(laptop if i % 2 else runner, agent_id=name, session_id=sid, env={})
    per_writer = 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str((laptop if i % 2 else runner).root), name, sid,
                               str(per_writer), "reader" if i % 3 else "*"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, name in enumerate(writers)]
    reader = Who("reader", sid)
    got = []
    while any(p.poll() is None for p in procs):
        got += actions.signals_pending(laptop, reader, env={})["pending_signals"]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    got += actions.signals_pending(laptop, reader, env={})["pending_signals"]
    sent = [line for out, _err in outs for line in out.split()]
    assert len(sent) == 8 * per_writer
    ids = [s["id"] for s in got]
    assert len(ids) == len(set(ids)), "a signal was delivered twice"
    assert set(ids) == set(sent), f"{len(set(sent) - set(ids))} signal(s) skipped"
    sequences = [s["sequence"] for s in got]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_a_reader_never_moves_past_an_uncommitted_signal(machines):
    """The sequence/watermark problem, made to happen: a transaction draws a sequence and does not commit;
    a later sender must wait for it (so sequence order is commit order), and a reader draining meanwhile
    sees neither and does not move its watermark past either."""
    import psycopg
    from psycopg.rows import dict_row

    from synapolis.store.postgres import PostgresTransaction

    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    actions.start(runner, agent_id="carol", session_id=sid, env={})
    slow = psycopg.connect(laptop.config.store, row_factory=dict_row)  # a writer stuck mid-transaction
    tx = PostgresTransaction(slow.cursor(), sid, True)
    first = {"id": "a" * 64, "timestamp": "2030-01-01T00:00:00.000000Z", "sender": "bob", "recipient": "alice",
             "type": "inform", "content": "slow", "lamport": 1, "reply_to": None}
    first_seq = tx.insert_signal(first)
    later = {}

    def send_later():
        later.update(actions.signal(runner, Who("carol", sid), "alice", "fast", env={}, piggyback=False)["signal"])

    sender = threading.Thread(target=send_later)
    sender.start()
    with psycopg.connect(laptop.config.store, autocommit=True) as admin:
        wait_until(lambda: admin.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                         "AND wait_event_type = 'Lock'").fetchall(), 10,
                   "the second sender to wait for the uncommitted one's lock")
    assert sender.is_alive(), "a second insert ran while an earlier sequence was uncommitted"
    assert actions.signals_pending(laptop, Who("alice", sid), env={})["pending_signals"] == []
    row = store_rows(laptop, sid, "SELECT delivered_upto FROM agents WHERE id = 'alice'")[0]
    assert row["delivered_upto"] < first_seq
    slow.commit()
    slow.close()
    sender.join(10)
    assert later["sequence"] > first_seq
    got = actions.signals_pending(laptop, Who("alice", sid), env={})["pending_signals"]
    assert [s["content"] for s in got] == ["slow", "fast"]


TIRED = r"""
import json, sys
from synapolis import sleep
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
out = sleep.tired(ws, Who(sys.argv[2], sys.argv[3]), memories=json.loads(sys.argv[4]), env={})
print(json.dumps({"outcome": out["outcome"], "merged": out["merged"]}))
"""


def test_four_agents_tired_at_once_across_machines_consolidate_once(machines):
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="a0", session_id="s1", env={})["session_id"]
    for i in range(1, 4):
        actions.start(laptop if i % 2 == 0 else runner, agent_id=f"a{i}", session_id=sid, env={})
    memories = [json.dumps(["shared fact", f"fact of a{i}"]) for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", TIRED, str((laptop if i % 2 == 0 else runner).root), f"a{i}",
                               sid, memories[i]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    results = [json.loads(o[0]) for o in outs]
    assert [r["outcome"] for r in results].count("consolidated") == 1
    from synapolis.sleep import memories

    ledger = memories(runner)["memories"]
    assert sorted(line["text"] for line in ledger) == sorted(["shared fact"] + [f"fact of a{i}" for i in range(4)])
    assert memories(laptop) == memories(runner)  # one ledger, in the database
    assert not any(ws.paths.memory_ledger.exists() for ws in machines)
    assert store_rows(laptop, sid, "SELECT COUNT(*) AS n FROM staged_memories")[0]["n"] == 0
    assert read_session(runner, sid)["status"] == "ended"


def test_one_watchdog_pass_across_machines(machines):
    import psycopg

    laptop, runner = machines
    holder = psycopg.connect(laptop.config.store, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(hashtextextended('synapolis.pass.watchdog', 0))")
    out = run_cli(runner, "watchdog", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["ran"] is False
    holder.close()  # the pass on the other machine ends
    out = run_cli(runner, "watchdog", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["ran"] is True


def _all_ready(procs) -> None:
    """Wait until every racer has imported and sits on its start line (each says `ready` first)."""
    for proc in procs:
        line = proc.stdout.readline()
        assert line.strip() == "ready", (line, proc.poll() is not None and proc.stderr.read()[-500:])


def _race(procs, timeout: float) -> list[str]:
    """Start every racer at once (each reads `go` after saying `ready`) and return their outputs, all of
    them having exited 0. Every `go` is written before any output is awaited: a `communicate("go")` per
    racer would let each finish before the next one starts."""
    _all_ready(procs)
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [proc.communicate(timeout=timeout) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-500:] for _out, err in outs]
    return [out for out, _err in outs]


ESCALATOR = r"""
import json, sys
from synapolis.escalation import run_escalation
from synapolis.monitor import run_monitor
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # the start line: every pass goes at once
run_monitor(ws)
print(json.dumps(run_escalation(ws)["events"]))
"""


def _notify_into(ws, path) -> Workspace:
    script = "import os, sys; open(sys.argv[1], 'a').write(os.environ['SYNAPOLIS_EVENT'] + '\\n')"
    return _config(ws, escalation={"notify_cmd": [sys.executable, "-c", script, str(path)]})


def _put_copy(url, agent_id, seconds_ago):
    """A heartbeat copy in the database only (an agent on a third machine), `seconds_ago` by the server's clock."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        now = conn.execute("SELECT clock_timestamp() AT TIME ZONE 'UTC'").fetchone()[0]
        from datetime import timedelta, timezone

        from synapolis.timeutil import format_ts

        stamp = format_ts((now - timedelta(seconds=seconds_ago)).replace(tzinfo=timezone.utc))
        doc = {"schema_version": 1, "agent_id": agent_id, "harness": "test", "status": "active", "beat_at": stamp,
               "seq": 1, "host": "third-machine"}
        conn.execute("INSERT INTO heartbeats (agent_id, host, doc, received_at) VALUES (%s, 'third-machine', %s, %s) "
                     "ON CONFLICT (agent_id) DO UPDATE SET doc = excluded.doc, received_at = excluded.received_at",
                     (agent_id, json.dumps(doc), stamp))


def test_escalation_passes_racing_on_two_machines_open_one_incident(machines, tmp_path):
    """Six monitor+escalate passes (three per machine) released at once, then both machines' watchdogs: one
    incident for the agent, one `opened` event in the database and one notification; every machine lists it
    and mirrors it into its own escalations/ file (§12); a recovery seen on one is seen on the other."""
    import psycopg

    told = tmp_path / "notified.txt"
    laptop, runner = (_notify_into(ws, told) for ws in machines)
    url = laptop.config.store
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    _put_copy(url, "ghost", 7200)  # dead: beyond dead_after_s
    procs = [subprocess.Popen([sys.executable, "-c", ESCALATOR, str(ws.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ws in (laptop, runner, laptop, runner, laptop, runner)]
    events = [e for out in _race(procs, timeout=60) for e in json.loads(out)]
    assert [(e["event"], e["agent_id"]) for e in events] == [("opened", "ghost")]
    for ws in (laptop, runner):  # sequential passes on both machines add nothing
        out = run_cli(ws, "watchdog", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["ran"] is True, out.stderr
        assert json.loads(out.stdout)["escalation"]["events"] == []
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key_name, id, status FROM escalation_incidents").fetchall()
        logged = conn.execute("SELECT event, incident_id FROM escalation_events").fetchall()
    assert len(rows) == 1 and rows[0][0] == "ghost" and rows[0][2] == "open"
    incident_id = rows[0][1]
    assert logged == [("opened", incident_id)]
    assert told.read_text().split() == ["opened"]
    for ws in (laptop, runner):
        listed = json.loads(run_cli(ws, "escalations", "--json").stdout)["incidents"]
        assert [(i["id"], i["agent_id"], i["level"]) for i in listed] == [(incident_id, "ghost", 2)]
        assert json.loads((ws.paths.escalations / "ghost.json").read_text())["id"] == incident_id
    local_lines = [line for ws in (laptop, runner) if ws.paths.escalations_log.exists()
                   for line in ws.paths.escalations_log.read_text().splitlines()]
    assert len(local_lines) == 1  # the event is in the log of the machine whose pass opened it

    # acked on one machine, recovered and resolved on the other: both see it
    out = run_cli(runner, "escalations", "ack", incident_id[:8], "--json")
    assert out.returncode == 0, out.stderr
    _put_copy(url, "ghost", 0)
    out = run_cli(runner, "watchdog", "--json")
    assert [e["event"] for e in json.loads(out.stdout)["escalation"]["events"]] == ["resolved"]
    assert json.loads(run_cli(laptop, "escalations", "--json").stdout)["incidents"] == []
    every = json.loads(run_cli(laptop, "escalations", "--all", "--json").stdout)["incidents"]
    assert [(i["id"], i["status"], bool(i["acked_at"])) for i in every] == [(incident_id, "resolved", True)]
    run_cli(laptop, "watchdog")
    assert json.loads((laptop.paths.escalations / "ghost.json").read_text())["status"] == "resolved"
    assert told.read_text().split() == ["opened", "acked", "resolved"]


SENDER_LOOP = r"""
import sys
from synapolis import actions
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
i = 0
while True:
    out = actions.signal(ws, Who("bob", sys.argv[2]), "alice", f"n{i}", env={}, piggyback=False)
    print(out["signal"]["id"], flush=True)
    i += 1
"""


def test_sigkill_mid_send_keeps_every_acknowledged_signal_once(machines):
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    proc = subprocess.Popen([sys.executable, "-c", SENDER_LOOP, str(runner.root), sid], stdout=subprocess.PIPE,
                            text=True)
    acknowledged = []
    while len(acknowledged) < 30:
        acknowledged.append(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read().split()
    proc.wait()
    acknowledged += rest
    got = actions.signals_pending(laptop, Who("alice", sid), env={})["pending_signals"]
    ids = [s["id"] for s in got]
    assert len(ids) == len(set(ids))
    assert set(acknowledged) <= set(ids)
    # the next call on the killed machine works without any manual step
    again = actions.signal(runner, Who("bob", sid), "alice", "after the kill", env={}, piggyback=False)
    assert again["signal"]["sequence"] > max(s["sequence"] for s in got)


def test_a_duplicate_id_leaves_no_gap_on_either_send_path(machines):
    """The same message twice in one microsecond: the insert meets the stored id through the unique index
    (ON CONFLICT), which draws a number first; the retry with the next microsecond's id takes that number,
    on the one-call send (no reply_to) and on the composed one (a reply) alike."""
    from datetime import datetime, timezone

    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    moment = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def send(ws, who, to, text, **kw):
        return actions.signal(ws, Who(who, sid), to, text, env={}, piggyback=False, now=moment, **kw)["signal"]

    first, twin = send(laptop, "alice", "bob", "hello"), send(laptop, "alice", "bob", "hello")
    reply, reply_twin = (send(runner, "bob", "alice", "re", reply_to=first["id"]),
                         send(runner, "bob", "alice", "re", reply_to=first["id"]))
    assert len({first["id"], twin["id"], reply["id"], reply_twin["id"]}) == 4
    assert twin["timestamp"] > first["timestamp"] and reply_twin["timestamp"] > reply["timestamp"]
    stored = store_rows(laptop, sid, "SELECT sequence, id FROM signals ORDER BY sequence")
    assert [r["id"] for r in stored] == [first["id"], twin["id"], reply["id"], reply_twin["id"]]
    numbers = [r["sequence"] for r in stored]
    assert numbers == list(range(numbers[0], numbers[0] + 4))
    assert [first["sequence"], twin["sequence"], reply["sequence"], reply_twin["sequence"]] == numbers


def test_a_connection_dropped_inside_a_transaction_or_at_its_commit(machines):
    """BEGIN and COMMIT go through libpq itself (store/postgres/driver.py `_command`), so their failures must come out as
    psycopg's would: a COMMIT the server refuses (a deferred constraint) is an error of its SQLSTATE's class and
    stores nothing; a connection killed inside a write transaction fails the verb with BusyError (exit 8), stores
    nothing, and the next call works on a new connection with no manual step."""
    import psycopg
    from psycopg import errors as pg_errors

    from synapolis import signals
    from synapolis.errors import InternalError
    from synapolis.store import clock, open_session, store_for
    from synapolis.store.postgres import _command

    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    admin = psycopg.connect(laptop.config.store, autocommit=True)
    try:
        # the server refuses a COMMIT: a constraint checked only then
        admin.execute("CREATE TABLE parent (id INT PRIMARY KEY)")
        admin.execute("CREATE TABLE child (id INT REFERENCES parent DEFERRABLE INITIALLY DEFERRED)")
        store = open_session(laptop, sid)
        with pytest.raises(InternalError, match="foreign key"):
            with store.write() as tx:
                signals.send(tx, caller="alice", recipient="bob", content="before a refused commit",
                             now=clock(laptop), config=laptop.config)
                tx.cur.execute("INSERT INTO child VALUES (1)")
        assert store_rows(laptop, sid, "SELECT content FROM signals") == []
        conn = psycopg.connect(laptop.config.store, autocommit=True)
        _command(conn, b"BEGIN")
        conn.execute("INSERT INTO child VALUES (2)")
        with pytest.raises(pg_errors.ForeignKeyViolation):
            _command(conn, b"COMMIT")
        # a connection killed inside a transaction: the COMMIT meets a lost connection
        with pytest.raises(BusyError, match="failed"):
            with store.write() as tx:
                signals.send(tx, caller="alice", recipient="bob", content="lost with its connection",
                             now=clock(laptop), config=laptop.config)
                mine = tx.cur.connection.info.backend_pid
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (mine,))
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            _command(conn, b"BEGIN")
        sent = actions.signal(laptop, Who("alice", sid), "bob", "after", env={}, piggyback=False)["signal"]
        assert store_for(laptop).connection().info.backend_pid != mine
        assert [r["content"] for r in store_rows(laptop, sid, "SELECT content FROM signals")] == ["after"]
        assert sent["sequence"] > 0
    finally:
        admin.close()


def test_the_sends_prepared_statement_lives_with_its_connection(machines):
    """The one-call send goes through libpq itself (store/postgres/driver.py `_execute_send`): unprepared on a
    connection's first send (a CLI call prepares nothing), prepared at its second; a rolled-back transaction
    keeps it (the store rolls back past psycopg, which would DEALLOCATE ALL); a statement dropped anyway fails
    one send with a one-line error, storing nothing, and the next send prepares it again. Text with a NUL is
    refused whole, not cut short at it as libpq would cut a text parameter."""
    from synapolis import signals
    from synapolis.errors import InternalError, UsageError
    from synapolis.store import clock, open_session, store_for

    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    store = open_session(laptop, sid)

    def send(content, type_="inform"):
        with store.write() as tx:
            return signals.send(tx, caller="alice", recipient="bob", content=content, now=clock(laptop),
                                config=laptop.config, type_=type_)[0]

    def prepared(ours=True):
        names = [r["name"] for r in store_for(laptop).connection().execute("SELECT name FROM pg_prepared_statements")]
        return [n for n in names if n == "synapolis_send"] if ours else names

    send("one")
    assert prepared() == []
    send("two")
    assert prepared() == ["synapolis_send"]
    for _ in range(6):  # a query psycopg prepares for itself: it would deallocate all at a rollback it saw
        with store.write() as tx:
            tx.agent("alice")
    assert len(prepared(ours=False)) > 1
    with pytest.raises(UsageError):
        send("refused inside the transaction", type_="shout")
    with pytest.raises(UsageError, match="NUL character"):
        send("cut\x00short")
    assert prepared() == ["synapolis_send"]
    send("three")
    with store.write() as tx:
        tx.cur.execute("DEALLOCATE ALL")
    with pytest.raises(InternalError, match="prepared statement") as refused:
        send("lost with the statement")
    assert "\n" not in str(refused.value)
    after = send("after")
    assert prepared() == ["synapolis_send"]
    stored = store_rows(laptop, sid, "SELECT sequence, content FROM signals ORDER BY sequence")
    assert [r["content"] for r in stored] == ["one", "two", "three", "after"]
    assert stored[-1]["sequence"] == after["sequence"]


def test_candidates_reach_the_server_as_themselves(pg_url):
    """A directed send's candidates go to the server as a text[] literal built by the store (psycopg's list
    adaptation cost a third of the statement): every string, quoted and escaped, comes back as itself."""
    import psycopg

    from synapolis.store.postgres import _text_array

    items = ["a", "a.b", "NULL", "null", 'q"x', "b\\s", "", " sp ", "{,}", "é", "a,b"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT %s::text[]", (_text_array(items),)).fetchone()[0] == items
        assert conn.execute("SELECT %s::text[]", (_text_array([]),)).fetchone()[0] == []
        assert conn.execute("SELECT %s::text[] IS NULL", (_text_array(None),)).fetchone()[0] is True


SPENDER = r"""
import json, sys
from datetime import datetime, timezone
from synapolis import actions
from synapolis.errors import RateLimitedError
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # the start line: every spender goes at once
moment = datetime(2030, 1, 1, tzinfo=timezone.utc)  # one instant for all: no token is refilled meanwhile
sent, refused = [], 0
for i in range(6):
    try:
        out = actions.signal(ws, Who("alice", sys.argv[2]), "bob", f"{sys.argv[3]}-{i}", env={}, piggyback=False,
                             now=moment)
        sent.append(out["signal"]["sequence"])
    except RateLimitedError:
        refused += 1
print(json.dumps({"sent": sent, "refused": refused}))
"""


def test_one_agents_tokens_spent_from_two_machines_at_once(machines):
    """The bucket is read, spent and written in one statement holding its row (synapolis_send): six processes
    of one agent on two machines, 36 sends at one instant, store exactly `rate_limit_per_min` of them."""
    laptop, runner = machines
    laptop, runner = _config(laptop, rate_limit_per_min=10), _config(runner, rate_limit_per_min=10)
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    procs = [subprocess.Popen([sys.executable, "-c", SPENDER, str((laptop if i % 2 else runner).root), sid, f"p{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    results = [json.loads(out) for out in _race(procs, timeout=120)]
    sent = [n for r in results for n in r["sent"]]
    assert len(sent) == 10 and sum(r["refused"] for r in results) == 26
    stored = store_rows(laptop, sid, "SELECT sequence FROM signals WHERE sender = ?", ("alice",))
    assert sorted(r["sequence"] for r in stored) == sorted(sent)
    left = store_rows(runner, sid, "SELECT tokens FROM rate_buckets WHERE agent_id = ?", ("alice",))
    assert [r["tokens"] for r in left] == [0.0]


def test_schema_created_by_four_processes_at_once(pg_url, tmp_path):
    dirs = [use_store(tmp_path / f"m{i}", pg_url) for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-m", "synapolis", "--state-dir", str(ws.root), "start", "--agent-id",
                               f"a{i}", "--session-id", "s1", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env()) for i, ws in enumerate(dirs)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1][-300:] for o in outs]
    created = [json.loads(o[0])["created_session"] for o in outs]
    assert created.count(True) == 1
    import psycopg

    with psycopg.connect(pg_url) as conn:
        from synapolis.store.postgres import SCHEMA_VERSION

        assert conn.execute("SELECT version FROM synapolis_schema").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT COUNT(*) FROM agents WHERE session_id = 's1'").fetchone()[0] == 4


# -- faults: bounded, exit 8, one line naming the host, never the password -----------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_busy_line(out, host_port: str, password: str | None):
    assert out.returncode == 8, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert host_port in lines[0]
    if password:
        assert password not in out.stderr and password not in out.stdout


def test_nothing_listening_is_exit_8_quickly(tmp_path):
    port = _free_port()
    ws = use_store(tmp_path / "state", f"postgresql://synapolis:s3cret-pw@127.0.0.1:{port}/synapolis")
    began = time.monotonic()
    out = run_cli(ws, "start", "--agent-id", "alice")
    assert time.monotonic() - began < 15
    _assert_busy_line(out, f"127.0.0.1:{port}", "s3cret-pw")
    assert "refused" in out.stderr.lower()
    # the hook still exits 0
    hook = run_cli(ws, "hook", "claude-code", input=json.dumps({"session_id": "c1", "hook_event_name": "SessionStart",
                                                                "cwd": str(tmp_path)}))
    assert hook.returncode == 0 and "s3cret-pw" not in hook.stderr + hook.stdout


def test_a_pooled_store_with_nothing_listening_fails_in_bounded_time_naming_the_cause(tmp_path, monkeypatch):
    from synapolis import store

    port = _free_port()
    ws = use_store(tmp_path / "state", f"postgresql://synapolis:s3cret-pw@127.0.0.1:{port}/synapolis")
    store.close_all()
    monkeypatch.setattr(store, "_LONG_LIVED", True)
    try:
        began = time.monotonic()
        with pytest.raises(BusyError) as caught:
            actions.start(ws, agent_id="alice", session_id="s1", env={})
        assert time.monotonic() - began < 15
        assert f"127.0.0.1:{port}" in caught.value.message and "refused" in caught.value.message.lower()
        assert "s3cret-pw" not in caught.value.message
    finally:
        store.close_all()


def test_wrong_password_is_exit_8_and_never_shows_it(pg_url, tmp_path):
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_url)
    bad = pg_url.replace(f":{parts['password']}@", ":wrong-Passw0rd@")
    ws = use_store(tmp_path / "state", bad)
    out = run_cli(ws, "start", "--agent-id", "alice", "--json")
    _assert_busy_line(out, f"{parts['host']}:{parts['port']}", "wrong-Passw0rd")
    assert "password authentication failed" in out.stderr
    assert json.loads(out.stdout)["error"]["type"] == "BusyError"
    with pytest.raises(BusyError) as caught:
        actions.start(ws, agent_id="alice", env={})
    assert "wrong-Passw0rd" not in str(caught.value)


@pytest.fixture
def private_pg():
    """(URL, cluster folder) of a PostgreSQL server of this test's own (scripts/synapolis-test-postgres), which
    the test may stop and start (`pg_script("stop", folder)`) without disturbing the other tests' server;
    destroyed afterwards."""
    done = subprocess.run(["bash", PG_SCRIPT, "start"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        no_postgres(f"cannot start a private PostgreSQL server: {done.stderr[-200:]}")
    found = dict(line.split("=", 1) for line in done.stdout.replace("export ", "").replace("'", "").split())
    try:
        yield found["SYNAPOLIS_TEST_PG_URL"], found["SYNAPOLIS_TEST_PG_DIR"]
    finally:
        from synapolis.store import close_all

        close_all()
        subprocess.run(["bash", PG_SCRIPT, "destroy", found["SYNAPOLIS_TEST_PG_DIR"]], capture_output=True,
                       timeout=120)


def pg_script(*args) -> None:
    """Run scripts/synapolis-test-postgres with `args` (stop DIR, start DIR), which must succeed."""
    subprocess.run(["bash", PG_SCRIPT, *args], check=True, capture_output=True, timeout=120)


def postmaster_started(url):
    """When the server's postmaster started: it moves on at each restart."""
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]


def test_server_stopped_and_started_between_calls(tmp_path, monkeypatch, private_pg):
    url, folder = private_pg
    ws = use_store(tmp_path / "state", url)
    assert run_cli(ws, "start", "--agent-id", "alice", "--session-id", "s1").returncode == 0
    pg_script("stop", folder)
    out = run_cli(ws, "beat", "--agent-id", "alice", "--session-id", "s1")
    _assert_busy_line(out, "127.0.0.1:", url.split(":")[2].split("@")[0])
    assert json.loads(ws.paths.heartbeat("alice").read_text())["agent_id"] == "alice"  # the local beat landed
    pg_script("start", folder)
    out = run_cli(ws, "signal", "--agent-id", "alice", "--session-id", "s1", "*", "back again")
    assert out.returncode == 0, out.stderr
    # a long-lived process (this one) whose connections died with the server while idle: the next call
    # starts its transaction again on a new connection, and works at once; with one connection, then
    # with the pool of `synapolis mcp` / `serve`
    from synapolis import store

    for pooled in (False, True):
        store.close_all()
        monkeypatch.setattr(store, "_LONG_LIVED", pooled)
        assert store.store_for(ws).pooled is pooled
        actions.beat(ws, Who("alice", "s1"), env={})
        pg_script("stop", folder)
        pg_script("start", folder)
        assert actions.beat(ws, Who("alice", "s1"), env={})["registered"] is True
        sent = actions.signal(ws, Who("alice", "s1"), "*", f"after a restart, pooled={pooled}", env={})
        assert sent["signal"]["sequence"] > 0


@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")  # the handshake-era subscribe, on purpose
def test_a_real_mcp_process_outlives_a_server_restart(tmp_path, private_pg):
    """A real `synapolis mcp` over stdio (it pools its connections: keep_connections()) keeps running while
    the PostgreSQL server restarts under it: the next tool call works with no manual step, every signal
    acknowledged before the restart is there exactly once, and its subscriber is pushed again."""
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from synapolis.mcp.watch import inbox_uri

    url, folder = private_pg
    ws = _config(use_store(tmp_path / "state", url), **FAST)
    assert run_cli(ws, "start", "--agent-id", "alice", "--session-id", "s1").returncode == 0
    params = StdioServerParameters(command=console_script("synapolis"), args=["--state-dir", str(ws.root), "mcp"],
                                   env=clean_env())
    errlog_path = tmp_path / "mcp-stderr.txt"
    pushed: list[str] = []

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/resources/updated":
            pushed.append(message.params.uri)

    async def tool(client, name, **args) -> dict:
        result = await client.call_tool(name, args)
        assert not result.is_error, result.content[0].text
        return result.structured_content

    async def cli(*args):
        done = await anyio.to_thread.run_sync(lambda: run_cli(ws, *args))
        assert done.returncode == 0, done.stderr
        return done

    async def main():
        with open(errlog_path, "w") as errlog, anyio.fail_after(120):
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=on_message) as bob:
                assert (await tool(bob, "start_session", agent_id="bob", session_id="s1"))["session_id"] == "s1"
                for i in range(3):
                    await cli("signal", "--agent-id", "alice", "--session-id", "s1", "bob", f"before {i}")
                before = (await tool(bob, "read_signals"))["signals"]
                assert [s["content"] for s in before] == ["before 0", "before 1", "before 2"]
                acked = (await tool(bob, "ack_signals", signal_ids=[s["id"] for s in before]))["acked"]
                assert sorted(acked) == sorted(s["id"] for s in before)
                mine = inbox_uri("s1", "bob")
                await bob.subscribe_resource(mine)

                # the server goes away and comes back (a new postmaster: every connection of the pool, and
                # the listener's, is dead) while the MCP process keeps running
                started_at = await anyio.to_thread.run_sync(postmaster_started, url)
                await anyio.to_thread.run_sync(lambda: pg_script("stop", folder))
                await anyio.to_thread.run_sync(lambda: pg_script("start", folder))
                assert await anyio.to_thread.run_sync(postmaster_started, url) > started_at

                # the next tool call works at once, and sees every acknowledged signal once, still read
                after = (await tool(bob, "read_signals", unread_only=False))["signals"]
                assert [s["id"] for s in after] == [s["id"] for s in before]
                assert all(s["read"] is True for s in after)
                assert (await tool(bob, "beat"))["pending_signals"] == []
                # and its subscriber hears a signal stored after the restart (the listener reconnected)
                await cli("signal", "--agent-id", "alice", "--session-id", "s1", "bob", "after the restart")
                await wait_until_async(lambda: mine in pushed, 15, "the push of the signal after the restart")
                fresh = (await tool(bob, "read_signals"))["signals"]
                assert [s["content"] for s in fresh] == ["after the restart"]

    anyio.run(main)
    assert "Traceback" not in errlog_path.read_text()
    # in the database itself: each signal once, each acknowledgement once
    rows = store_rows(ws, "s1", "SELECT id, content FROM signals ORDER BY sequence")
    assert [r["content"] for r in rows] == ["before 0", "before 1", "before 2", "after the restart"]
    reads = store_rows(ws, "s1", "SELECT signal_id FROM signal_reads WHERE agent_id = ?", ("bob",))
    assert sorted(r["signal_id"] for r in reads) == sorted(r["id"] for r in rows[:3])


def test_a_long_lived_process_pools_its_connections(machines, monkeypatch):
    """keep_connections() (what `synapolis mcp` and `serve` call): threads of one process run transactions at
    once on connections of a pool, where one shared connection would make a read wait for a held write."""
    from synapolis import store
    from synapolis.store import open_session

    laptop, _runner = machines
    store.close_all()
    monkeypatch.setattr(store, "_LONG_LIVED", True)
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    assert store.store_for(laptop).pooled
    held, release, read_done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with open_session(laptop, sid).write() as tx:
            tx.exclusive("held by a test")
            held.set()
            release.wait(20)

    def read():
        actions.read_signals(laptop, Who("alice", sid), env={})
        read_done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        threading.Thread(target=read, daemon=True).start()
        assert read_done.wait(10), "a read waited for another thread's transaction"
        import psycopg

        with psycopg.connect(laptop.config.store) as conn:
            mine = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'synapolis' "
                                "AND datname = current_database()").fetchone()[0]  # not another test's
        assert mine >= 2
    finally:
        release.set()
        holder.join(20)


def test_a_cli_call_opens_one_connection_and_imports_no_pool(machines):
    laptop, _runner = machines
    code = ("import sys\nfrom synapolis.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('MODULES', 'psycopg' in sys.modules, 'psycopg_pool' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "--state-dir", str(laptop.root), "start", "--agent-id",
                          "alice", "--session-id", "s1"], capture_output=True, text=True, timeout=60, env=clean_env())
    assert out.stdout.strip().splitlines()[-1] == "MODULES True False", out.stderr


def test_postgres_url_without_the_driver_is_exit_2_with_the_install_command(tmp_path):
    ws = use_store(tmp_path / "state", "postgresql://u:pw@127.0.0.1:1/db")
    code = ("import sys; sys.modules['psycopg'] = None; from synapolis.cli import main; "
            f"sys.argv = ['synapolis', '--state-dir', {str(ws.root)!r}, 'start', '--agent-id', 'alice']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env())
    assert out.returncode == 2
    assert 'pip install "synapolis[postgres]"' in out.stderr and "Traceback" not in out.stderr


def _subscribed_to_alice(machines):
    """alice on the laptop, bob on the runner, and a subscription to alice's inbox: (laptop, runner, sid, uri,
    subscriptions)."""
    from synapolis.mcp.watch import Subscriptions, current_value

    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    uri = f"synapolis://session/{sid}/inbox/alice"
    subscriptions = Subscriptions()
    subscriptions.add(uri, "client-1", current_value(laptop, uri))
    return laptop, runner, sid, uri, subscriptions


def _listening(url) -> bool:
    """Whether a synapolis listener has run its LISTEN on the database (as its server sees it; the server's
    other databases are other tests', running beside this one under pytest-xdist)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return bool(conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = 'synapolis-listen' "
                                 "AND datname = current_database() AND query LIKE 'LISTEN%'").fetchall())


def test_push_from_another_machines_cli_reaches_a_subscriber(machines):
    """LISTEN/NOTIFY: a signal sent by the runner's CLI wakes the laptop's MCP watcher for alice's inbox."""
    from synapolis.mcp.watch import SessionWatcher

    laptop, runner, sid, uri, subscriptions = _subscribed_to_alice(machines)
    woken = threading.Event()
    notified = []

    def notify(uris):
        notified.extend(uris)
        woken.set()

    watcher = SessionWatcher(laptop, subscriptions, notify).start()
    try:
        wait_until(lambda: _listening(laptop.config.store), 20, "the watcher's LISTEN on the database")
        assert notified == []
        out = run_cli(runner, "signal", "--agent-id", "bob", "--session-id", sid, "alice", "pushed")
        assert out.returncode == 0, out.stderr
        assert woken.wait(10), "no push reached the subscriber"
        assert notified == [uri]
    finally:
        watcher.stop()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)
def test_memories_lists_the_ledger_from_either_store(ws, cli, store_kind):
    actions.start(ws, agent_id="alice", session_id="s1", env={})
    from synapolis.sleep import tired

    tired(ws, Who("alice", "s1"), memories=[{"text": "CI needs docker", "key": "ci", "tags": ["infra"]}, "use uv"],
          env={})
    out = cli("memories", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [(m["text"], m["key"], m["tags"], m["sources"]) for m in got["memories"]] == [
        ("CI needs docker", "ci", ["infra"], ["alice"]), ("use uv", None, [], ["alice"])]
    assert got["total"] == 2 and all(m["merged_at"] for m in got["memories"])
    newest = json.loads(cli("memories", "--limit", "1", "--json").stdout)["memories"]
    assert [m["text"] for m in newest] == ["use uv"]
    text = cli("memories").stdout
    assert "[ci] CI needs docker  (from alice)" in text
    assert cli("memories", "--limit", "0").returncode == 2
    # on PostgreSQL the ledger is in the database, not in this machine's files
    assert ws.paths.memory_ledger.exists() == (store_kind == "sqlite")


def test_every_machine_sees_every_agents_heartbeat(machines):
    """The beat lands in the local file first, then its copy in the database: list-agents and the monitor on
    the other machine see the agent (not `missing`), with the host it runs on."""
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(runner, agent_id="bob", session_id=sid, env={})
    actions.beat(runner, Who("bob", sid), task="remote work", env={})
    assert runner.paths.heartbeat("bob").exists() and not laptop.paths.heartbeat("bob").exists()
    listed = {a["id"]: a for a in actions.list_agents(laptop, Who("alice", sid), env={})["agents"]}
    assert listed["bob"]["effective_status"] == "active"
    import psycopg

    with psycopg.connect(laptop.config.store, autocommit=True) as conn:  # the runner is another box
        conn.execute("UPDATE heartbeats SET doc = jsonb_set(doc::jsonb, '{host}', '\"runner-box\"')::text "
                     "WHERE agent_id = 'bob'")
    listed = {a["id"]: a for a in actions.list_agents(laptop, Who("alice", sid), env={})["agents"]}
    assert listed["bob"]["host"] == "runner-box" and listed["alice"]["host"] == os.uname().nodename
    out = run_cli(laptop, "monitor", "--json")
    assert out.returncode == 0, out.stderr
    monitor = json.loads(laptop.paths.monitor.read_text())
    agents = {a["agent_id"]: a for a in monitor["agents"]}
    assert set(agents) == {"alice", "bob"}
    assert agents["bob"]["effective_status"] == "active" and agents["bob"].get("task") == "remote work"

    with psycopg.connect(laptop.config.store) as conn:
        host, doc = conn.execute("SELECT host, doc FROM heartbeats WHERE agent_id = 'bob'").fetchone()
    assert json.loads(doc)["task"] == "remote work" and host == os.uname().nodename


def test_a_beat_in_no_session_reaches_the_other_machine(machines):
    """§12: the beat writes the local file first, then its copy, even for an agent that is in no session
    (no session transaction to carry it): the other machine's monitor sees it."""
    laptop, runner = machines
    actions.start(laptop, agent_id="alice", session_id="s1", env={})
    out = run_cli(runner, "beat", "--agent-id", "carol", "--task", "between sessions", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["registered"] is False and runner.paths.heartbeat("carol").exists()
    assert run_cli(laptop, "monitor", "--json").returncode == 0
    agents = {a["agent_id"]: a for a in json.loads(laptop.paths.monitor.read_text())["agents"]}
    assert agents["carol"]["effective_status"] == "active" and agents["carol"]["task"] == "between sessions"


RACER = r"""
import json, sys
from synapolis import claims
from synapolis.errors import ConflictError
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
me = sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()  # the start line: every racer goes at once
won = {}
for item in [f"ticket:{i}" for i in range(10)]:
    try:
        won[item] = claims.claim(ws, item, me, ttl_s=600)["token"]
    except ConflictError:
        pass
print(json.dumps(won))
"""


def test_eight_processes_race_for_ten_claims_across_machines(machines):
    """One winner per item, whatever machine; the fencing tokens only grow across take-overs."""
    import psycopg

    from synapolis import claims

    laptop, runner = machines
    for i in range(8):  # every racer is a live agent, so nobody may take another's claim
        actions.beat(laptop if i % 2 else runner, Who(f"r{i}", None), env={})
        actions.start(laptop if i % 2 else runner, agent_id=f"r{i}", session_id="s1", env={})
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str((laptop if i % 2 else runner).root), f"r{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    won = [json.loads(out) for out in _race(procs, timeout=120)]
    for i in range(10):
        winners = [w[f"ticket:{i}"] for w in won if f"ticket:{i}" in w]
        assert winners == [1], f"ticket:{i} won {len(winners)} times"
    # the record is in the database, the same for both machines
    listed = {c["item"]: c for c in claims.list_claims(laptop)}
    assert {c["item"]: c["claimed_by"] for c in claims.list_claims(runner)} == \
        {k: v["claimed_by"] for k, v in listed.items()}
    # a release and a new claim: token 2, and a stale holder's token 1 is refused everywhere
    holder = listed["ticket:0"]["claimed_by"]
    claims.release(runner, "ticket:0", holder)
    assert claims.claim(laptop, "ticket:0", "r0" if holder != "r0" else "r1", ttl_s=600)["token"] == 2
    with pytest.raises(Exception) as stale:
        claims.check(runner, "ticket:0", 1)
    assert type(stale.value).__name__ == "StaleToken"
    with psycopg.connect(laptop.config.store) as conn:
        tokens = [json.loads(e)["token"] for (e,) in conn.execute(
            "SELECT event FROM claim_events WHERE item = 'ticket:0' ORDER BY seq")]
    assert tokens == [1, 1, 2] and not laptop.paths.claims_log.exists()


def test_claim_expiry_is_judged_by_the_servers_clock(machines):
    """A lease expires by the database server's time, not the local clock of whoever looks."""
    from datetime import timedelta

    from synapolis import claims
    from synapolis.store import store_for
    from synapolis.timeutil import parse_ts

    laptop, runner = machines
    actions.beat(laptop, Who("alice", None), env={})
    record = claims.claim(laptop, "job:1", "alice", ttl_s=1)
    server_now = store_for(runner).now()
    assert claims.check(runner, "job:1", record["token"])["claimed_by"] == "alice"  # server time: live
    # the lease ends by the server's clock; a caller may still pin `now` (time is a parameter)
    expires = parse_ts(record["expires_at"])
    wait_until(lambda: store_for(runner).now() > expires, 10, "the server's clock to pass the lease's end")
    with pytest.raises(Exception) as gone:
        claims.check(runner, "job:1", record["token"])
    assert type(gone.value).__name__ == "StaleToken"
    assert claims.check(runner, "job:1", record["token"], now=server_now + timedelta(seconds=0.5))


def test_doctor_checks_the_store(machines, tmp_path):
    laptop, _runner = machines
    out = run_cli(laptop, "doctor", "--json")
    found = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "store"]
    from synapolis.store.postgres import SCHEMA_VERSION

    assert [f["status"] for f in found] == ["ok", "ok"]
    assert found[0]["schema_version"] == SCHEMA_VERSION and abs(found[1]["skew_s"]) < 5
    assert "@" in found[0]["url"] and laptop.config.store.split(":")[2].split("@")[0] not in out.stdout
    down = use_store(tmp_path / "down", f"postgresql://u:hidden-pw@127.0.0.1:{_free_port()}/db")
    out = run_cli(down, "doctor", "--json")
    found = [f for f in json.loads(out.stdout)["findings"] if f["check"] == "store"]
    assert out.returncode == 1 and found[0]["status"] == "fail" and "refused" in found[0]["message"].lower()
    assert "hidden-pw" not in out.stdout + out.stderr
    plain = run_cli(use_store(tmp_path / "plain", "sqlite"), "doctor", "--json")
    assert [f["status"] for f in json.loads(plain.stdout)["findings"] if f["check"] == "store"] == ["ok"]


def test_a_subscriber_that_lost_its_connection_rechecks_when_back(machines):
    """The listener's connection is cut (a server restart, a dropped network); a signal stored meanwhile
    sends its NOTIFY to nobody, yet the subscriber is told once the listener is back."""
    import psycopg

    from synapolis.mcp.watch import SessionWatcher

    laptop, runner, sid, uri, subscriptions = _subscribed_to_alice(machines)
    woken = threading.Event()
    watcher = SessionWatcher(laptop, subscriptions, lambda uris: woken.set()).start()
    admin = psycopg.connect(laptop.config.store, autocommit=True)
    try:
        # this test's listener only: the server is shared with the other tests (and pytest-xdist's workers)
        mine = "application_name = 'synapolis-listen' AND datname = current_database()"
        listening = f"SELECT count(*) FROM pg_stat_activity WHERE {mine}"
        wait_until(lambda: admin.execute(f"{listening} AND query ILIKE 'LISTEN%'").fetchone()[0], 10,
                   "the listener to connect")
        # cut the listener, and store a signal while it is away (it waits retry_s = 1 s before reconnecting); on a
        # machine so loaded that the signal took longer than that, cut it again: the signal must land while it is away
        for _attempt in range(5):
            wait_until(lambda: admin.execute(listening).fetchone()[0], 10, "the listener to be connected")
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {mine}")
            wait_until(lambda: admin.execute(listening).fetchone()[0] == 0, 10, "the listener's connection to end")
            woken.clear()
            actions.signal(runner, Who("bob", sid), "alice", "while you were away", env={}, piggyback=False)
            if admin.execute(listening).fetchone()[0] == 0:
                break
        assert admin.execute(listening).fetchone()[0] == 0, "the listener was back before the signal, 5 times"
        assert woken.wait(10), "the subscriber was not told after the listener came back"
    finally:
        admin.close()
        watcher.stop()
