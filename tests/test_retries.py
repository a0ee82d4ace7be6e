"""Retries that never double (issue 30 item 4): `signal` and `note` with an idempotency key answer a retry as
the first call did and store nothing twice, on both stores, from any machine, and when the answer to the
COMMIT itself was lost (a proxy between client and PostgreSQL cuts the connection right after the COMMIT)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path
from urllib.parse import quote

import pytest

from synapolis import actions
from synapolis.errors import ConflictError, UsageError
from synapolis.identity import Who
from synapolis.workspace import Workspace

from conftest import clean_env, configure, store_rows, synapolis_cmd, use_store

FAST = {"rate_limit_per_min": 100000}


def _signals(ws, sid, content):
    return store_rows(ws, sid, "SELECT id, sequence FROM signals WHERE content = ?", (content,))


def _notes(ws, who, text):
    return [n for n in actions.read_notes(ws, who, limit=1000, env={}, piggyback=False)["notes"] if n["text"] == text]


@pytest.fixture
def pair(ws):
    ws = configure(ws, **FAST)
    sid = actions.start(ws, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    return ws, sid


def test_a_signal_retried_with_its_key_is_stored_once_and_answered_alike(pair):
    ws, sid = pair
    alice = Who("alice", sid)
    first = actions.signal(ws, alice, "bob", "deploy at 5", env={}, idempotency_key="k-1")
    again = actions.signal(ws, alice, "bob", "deploy at 5", env={}, idempotency_key="k-1")
    assert again["replayed"] is True and "replayed" not in first
    assert again["signal"] == first["signal"] and again["audience"]["live"] == first["audience"]["live"]
    assert first["signal"]["idempotency_key"] == "k-1"
    assert len(_signals(ws, sid, "deploy at 5")) == 1
    # without a key, or with another key, the same words are a new signal
    actions.signal(ws, alice, "bob", "deploy at 5", env={})
    actions.signal(ws, alice, "bob", "deploy at 5", env={}, idempotency_key="k-2")
    assert len(_signals(ws, sid, "deploy at 5")) == 3
    # bob receives it once, however often alice retried
    pending = actions.signals_pending(ws, Who("bob", sid), env={})["pending_signals"]
    assert [s["id"] for s in pending].count(first["signal"]["id"]) == 1



def test_a_broadcast_retried_with_its_key_is_stored_once_and_lists_everyone_alike(pair):
    """A broadcast through the store's own audience (SQLite: from the liveness index) keeps the key's promise:
    the retry stores nothing, and both answers list every recipient, the waiting ones with why."""
    ws, sid = pair
    alice = Who("alice", sid)
    actions.start(ws, agent_id="carol", session_id=sid, env={})
    actions.beat(ws, Who("carol", sid), status="sleeping", env={})
    first = actions.signal(ws, alice, "*", "standup now", env={}, idempotency_key="b-1")
    again = actions.signal(ws, alice, "*", "standup now", env={}, idempotency_key="b-1")
    assert again["replayed"] is True and again["signal"] == first["signal"]
    assert first["audience"] == again["audience"] == {"live": ["bob"], "waiting": ["carol"],
                                                      "waiting_status": {"carol": "sleeping"}}
    assert len(_signals(ws, sid, "standup now")) == 1
    for reader in ("bob", "carol"):
        pending = actions.signals_pending(ws, Who(reader, sid), env={})["pending_signals"]
        assert [s["id"] for s in pending].count(first["signal"]["id"]) == 1

def test_a_note_retried_with_its_key_is_appended_once(pair):
    ws, sid = pair
    alice = Who("alice", sid)
    first = actions.note(ws, alice, "parser is mine", env={}, idempotency_key="n-1")
    again = actions.note(ws, alice, "parser is mine", env={}, idempotency_key="n-1")
    assert again["note"] == first["note"] and again["replayed"] is True
    assert len(_notes(ws, alice, "parser is mine")) == 1


def test_a_key_is_the_callers_own(pair):
    """Two agents choosing the same key make two calls; a key reused for another call is refused (exit 3)."""
    ws, sid = pair
    actions.signal(ws, Who("alice", sid), "bob", "same words", env={}, idempotency_key="shared")
    actions.signal(ws, Who("bob", sid), "alice", "same words", env={}, idempotency_key="shared")
    assert len(_signals(ws, sid, "same words")) == 2
    for call in (lambda: actions.signal(ws, Who("alice", sid), "bob", "other words", env={}, idempotency_key="shared"),
                 lambda: actions.signal(ws, Who("alice", sid), "*", "same words", env={}, idempotency_key="shared")):
        with pytest.raises(ConflictError, match="idempotency key 'shared'"):
            call()
    assert len(_signals(ws, sid, "other words")) == 0
    # notes keep their own keys: the same key on a note is that note's
    actions.note(ws, Who("alice", sid), "same words", env={}, idempotency_key="shared")
    with pytest.raises(ConflictError, match="different note"):
        actions.note(ws, Who("alice", sid), "other words", env={}, idempotency_key="shared")
    assert len(_notes(ws, Who("alice", sid), "same words")) == 1 and _notes(ws, Who("alice", sid), "other words") == []


@pytest.mark.parametrize("key", ["", " padded", "a\nb", "x" * 201, "tab\there"])
def test_a_malformed_key_is_refused_before_anything_is_written(pair, key):
    ws, sid = pair
    with pytest.raises(UsageError, match="idempotency key"):
        actions.signal(ws, Who("alice", sid), "bob", "never", env={}, idempotency_key=key)
    with pytest.raises(UsageError, match="idempotency key"):
        actions.note(ws, Who("alice", sid), "never", env={}, idempotency_key=key)
    assert _signals(ws, sid, "never") == [] and _notes(ws, Who("alice", sid), "never") == []


def test_a_retry_is_not_rate_limited(pair):
    """The retry of a stored send is not a new send: answered even when the bucket is empty."""
    ws, sid = pair
    ws = configure(ws, rate_limit_per_min=1)
    alice = Who("alice", sid)
    first = actions.signal(ws, alice, "bob", "only one", env={}, idempotency_key="r-1")
    assert actions.signal(ws, alice, "bob", "only one", env={}, idempotency_key="r-1")["signal"] == first["signal"]
    from synapolis.errors import RateLimitedError

    with pytest.raises(RateLimitedError):
        actions.signal(ws, alice, "bob", "a new one", env={}, idempotency_key="r-2")


def test_the_cli_takes_the_key_and_says_it_replayed(pair):
    ws, sid = pair
    base = ["--agent-id", "alice", "--session-id", sid]
    runs = [subprocess.run(synapolis_cmd(ws.root, "signal", "bob", "from the shell", *base, "--idempotency-key", "c-1",
                                         "--json"), capture_output=True, text=True, timeout=60, env=clean_env())
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    first, again = (json.loads(r.stdout) for r in runs)
    assert again["replayed"] is True and again["signal"]["id"] == first["signal"]["id"]
    text = subprocess.run(synapolis_cmd(ws.root, "note", "from the shell", *base, "--idempotency-key", "c-2"),
                          capture_output=True, text=True, timeout=60, env=clean_env())
    text2 = subprocess.run(synapolis_cmd(ws.root, "note", "from the shell", *base, "--idempotency-key", "c-2"),
                           capture_output=True, text=True, timeout=60, env=clean_env())
    assert "added" in text.stdout and "before (the same idempotency key)" in text2.stdout
    assert len(_signals(ws, sid, "from the shell")) == 1 and len(_notes(ws, Who("alice", sid), "from the shell")) == 1
    bad = subprocess.run(synapolis_cmd(ws.root, "note", "x", *base, "--idempotency-key", "c-2"), capture_output=True,
                         text=True, timeout=60, env=clean_env())
    assert bad.returncode == 3 and "ConflictError" in bad.stderr and "Traceback" not in bad.stderr


RACER = r"""
import json, sys
from synapolis import actions
from synapolis.errors import SynapolisError
from synapolis.identity import Who
from synapolis.workspace import Workspace
ws = Workspace.open(sys.argv[1])
out = []
for i in range(int(sys.argv[3])):
    try:
        answer = actions.signal(ws, Who("alice", sys.argv[2]), "bob", f"race {i}", env={}, idempotency_key=f"race-{i}",
                                piggyback=False)
        out.append(answer["signal"]["id"])
    except SynapolisError as exc:
        out.append(type(exc).__name__)
print(json.dumps(out))
"""


def test_processes_racing_with_the_same_keys_store_each_once(pair, tmp_path):
    """Four processes send the same 15 keyed signals at once (a retry storm): 15 rows, and every process that
    got an answer got the one stored signal's id."""
    import sys

    ws, sid = pair
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(ws.root), sid, "15"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env()) for _ in range(4)]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        answers.append(json.loads(out))
    for i in range(15):
        rows = _signals(ws, sid, f"race {i}")
        assert len(rows) == 1, (i, rows)
        got = {a[i] for a in answers if a[i] != "BusyError"}
        assert got == {rows[0]["id"]}


# -- PostgreSQL: two machines, and a COMMIT whose answer is lost ------------------------------------------

@pytest.fixture
def machines(tmp_path, pg_url):
    laptop = configure(use_store(tmp_path / "laptop", pg_url), **FAST)
    runner = configure(use_store(tmp_path / "runner", pg_url), **FAST)
    return laptop, runner


def test_a_retry_from_another_machine_is_stored_once(machines):
    laptop, runner = machines
    sid = actions.start(laptop, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(laptop, agent_id="bob", session_id=sid, env={})
    first = actions.signal(laptop, Who("alice", sid), "bob", "twice?", env={}, idempotency_key="m-1")
    again = actions.signal(runner, Who("alice", sid), "bob", "twice?", env={}, idempotency_key="m-1")
    assert again["signal"] == first["signal"] and again["replayed"]
    actions.note(laptop, Who("alice", sid), "noted", env={}, idempotency_key="m-2")
    actions.note(runner, Who("alice", sid), "noted", env={}, idempotency_key="m-2")
    assert len(_signals(laptop, sid, "twice?")) == 1 and len(_notes(runner, Who("alice", sid), "noted")) == 1


COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # the simple-query message the store sends to commit
ARMING = (b"synapolis_send(", b"INSERT INTO notes")  # a write the COMMIT then carries


class CommitCutter:
    """A TCP proxy in front of PostgreSQL that, once armed, forwards the first COMMIT after a write (a send, a
    note) to the server and then closes both sides before the server's answer reaches the client: the COMMIT
    happened, its answer is lost."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.armed = False
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            state = {"wrote": False, "dead": False}
            threading.Thread(target=self._pump, args=(client, server, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, state, False), daemon=True).start()

    def _pump(self, src, dst, state, upstream: bool):
        try:
            while True:
                data = src.recv(65536)
                if not data or state["dead"]:
                    break
                if upstream and self.armed and not self.cut.is_set():
                    if any(marker in data for marker in ARMING):
                        state["wrote"] = True
                    if state["wrote"] and COMMIT in data:
                        state["dead"] = True  # from now on nothing goes back to the client
                        dst.sendall(data)
                        self.cut.set()
                        threading.Event().wait(0.5)  # let the server commit
                        break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def cutter(pg_url):
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_url)
    proxy = CommitCutter(parts.get("host") or "127.0.0.1", int(parts.get("port") or 5432))
    url = (f"postgresql://{quote(parts['user'], safe='')}:{quote(parts.get('password') or '', safe='')}"
           f"@127.0.0.1:{proxy.port}/{parts['dbname']}?sslmode=disable&gssencmode=disable")
    try:
        yield proxy, url
    finally:
        proxy.close()


@pytest.mark.parametrize("verb", ["signal", "note"])
def test_a_lost_commit_answer_is_exit_8_and_the_keyed_retry_stores_once(tmp_path, pg_url, cutter, verb):
    proxy, proxied = cutter
    direct = configure(use_store(tmp_path / "direct", pg_url), **FAST)
    sid = actions.start(direct, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(direct, agent_id="bob", session_id=sid, env={})
    through = configure(use_store(tmp_path / "through", proxied), **FAST)
    words = f"lost answer {verb}"
    args = (["signal", "bob", words] if verb == "signal" else ["note", words]) + [
        "--agent-id", "alice", "--session-id", sid, "--idempotency-key", "lost-1", "--json"]

    def count():
        if verb == "signal":
            return len(_signals(direct, sid, words))
        return len(_notes(direct, Who("alice", sid), words))

    proxy.armed = True
    first = subprocess.run(synapolis_cmd(through.root, *args), capture_output=True, text=True, timeout=60,
                           env=clean_env())
    assert proxy.cut.is_set(), "the proxy never saw the COMMIT"
    assert first.returncode == 8, (first.returncode, first.stderr)
    assert json.loads(first.stdout)["error"]["type"] == "BusyError"
    assert count() == 1  # exit 8, and yet the COMMIT happened: what a retry must not double
    proxy.armed = False
    again = subprocess.run(synapolis_cmd(through.root, *args), capture_output=True, text=True, timeout=60,
                           env=clean_env())
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["replayed"] is True
    assert count() == 1


# -- SQLite: another process holding the write lock at any moment -------------------------------------------

LOCKER = r"""
import random, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
print("holding", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    conn.execute(random.choice(["BEGIN IMMEDIATE", "BEGIN EXCLUSIVE"]))
    time.sleep(random.uniform(0.01, 0.12))
    conn.execute("COMMIT")
    time.sleep(random.uniform(0.0, 0.03))
"""


@pytest.mark.sqlite_only
def test_under_a_lock_holder_every_exit_8_is_retried_with_its_key_and_nothing_doubles(tmp_path):
    """A process takes and drops the store's write lock at random moments while notes and signals are sent
    through the CLI with a short busy timeout; each call that exits 8 is retried with its key until it is
    answered. Every note and every signal is there exactly once, and an answered retry is the stored one."""
    import sys

    ws = configure(Workspace.open(tmp_path / "state").ensure(), busy_timeout_ms=40, **FAST)
    sid = actions.start(ws, agent_id="alice", session_id="s1", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(ws.paths.session_db(sid)), "120"],
                              stdout=subprocess.PIPE, text=True, env=clean_env())
    busy = 0
    try:
        assert locker.stdout.readline().strip() == "holding"
        for i in range(12):
            for verb in (["signal", "bob"], ["note"]):
                args = [*verb, f"{verb[0]} {i}", "--agent-id", "alice", "--session-id", sid,
                        "--idempotency-key", f"{verb[0]}-{i}", "--json"]
                for attempt in range(50):
                    done = subprocess.run(synapolis_cmd(ws.root, *args), capture_output=True, text=True, timeout=60,
                                          env=clean_env())
                    if done.returncode != 8:
                        break
                    busy += 1
                assert done.returncode == 0, done.stderr
    finally:
        locker.kill()
        locker.wait(timeout=10)
    assert busy > 0, "the lock holder never made a call wait past its busy timeout"
    for i in range(12):
        assert len(_signals(ws, sid, f"signal {i}")) == 1
        assert len(_notes(ws, Who("alice", sid), f"note {i}")) == 1


# -- the dashboard: a post sent again with the page's key -----------------------------------------------------

@pytest.mark.parametrize("pinned", [None, "alice"], ids=["a-person", "a-pinned-token"])
def test_a_dashboard_post_sent_again_with_its_key_is_stored_once(served, cli, pinned):
    import httpx2

    session = json.loads(cli("start", "--agent-id", "alice", "--json").stdout)["session_id"]
    token = served.token("team", *(["--agent", pinned] if pinned else []))
    with httpx2.Client(base_url=served.url, timeout=30, headers={"authorization": f"Bearer {token}"}) as http:
        for form in ({"kind": "note", "text": "posted twice"},
                     {"kind": "signal", "to": "alice", "content": "signalled twice", "text": "signalled twice"}):
            answers = [http.post("/api/post", data={**form, "session_id": session,
                                                    "idempotency_key": "page-key-" + form["kind"]})
                       for _ in range(2)]
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            assert "replayed" not in answers[0].json() and answers[1].json()["replayed"] is True
            first, again = (a.json().get("note") or a.json()["signal"] for a in answers)
            assert first["id" if "id" in first else "seq"] == again["id" if "id" in again else "seq"]
            assert (first.get("person") == "team") == (pinned is None)
        # the same key for another post is a conflict, not a replay
        other = http.post("/api/post", data={"kind": "note", "text": "something else", "session_id": session,
                                             "idempotency_key": "page-key-note"})
        assert other.status_code == 409 and other.json()["error"]["type"] == "ConflictError", other.text
    ws = Workspace.open(served.state_dir)
    assert len(_notes(ws, Who("alice", session), "posted twice")) == 1
    assert len(_signals(ws, session, "signalled twice")) == 1
    page = (Path(actions.__file__).parent / "web" / "dashboard.html").read_text()
    assert 'form.set("idempotency_key"' in page  # the page sends one with every post
