"""Shared fixtures and helpers: a fresh state directory per test, the CLI as a real process (`cli`,
`synapolis_cmd`, `clean_env`), `wait_until`, raw heartbeat files, the stores, MCP clients, hostile processes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from synapolis.timeutil import format_ts
from synapolis.workspace import Workspace

# a fixed "now" for decision tests: time is a parameter, nobody sleeps
NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
# Python 3.12+ opens the SQLite store with NO_CKPT_ON_CLOSE (Connection.setconfig), so session.db-wal and -shm
# outlive a CLI call; on 3.10/3.11 the last connection to close checkpoints and deletes both (docs/SIGNALS.md)
WAL_OUTLIVES_CLOSE = hasattr(sqlite3.Connection, "setconfig")


def ago(seconds: float, now: datetime = NOW) -> str:
    """The RFC 3339 stamp `seconds` before `now` (negative: in the future)."""
    return format_ts(now - timedelta(seconds=seconds))


@pytest.fixture
def state_dir(tmp_path):
    """A state directory path of this test's own (not created: verbs that write create it)."""
    return tmp_path / "state"


def configure(ws, **values):
    """Set keys of the state directory's synapolis.json; the Workspace opened again with them."""
    document = json.loads(ws.paths.config.read_text())
    document.update(values)
    ws.paths.config.write_text(json.dumps(document))
    return Workspace.open(ws.root)


# -- the stores (contract §12): the contract tests of these modules run once per store -----------------

# Modules whose tests (those using `ws`) run against SQLite and PostgreSQL; a test that reads the SQLite
# file itself is marked `sqlite_only`.
BOTH_STORES = {"test_signals", "test_store_pool", "test_delivery", "test_sleep", "test_sessions", "test_board", "test_signals_processes", "test_store",
               "test_claims", "test_mcp", "test_mcp_identity",
               "test_people", "test_guard", "test_retries", "test_pretool", "test_remote", "test_guard_events",
               "test_remote_guard", "test_remote_follow", "test_broadcast_audience"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_SCRIPT = os.path.join(ROOT, "scripts", "synapolis-test-postgres")


def pytest_configure(config):
    config.addinivalue_line("markers", "sqlite_only: reads session.db itself; runs against the SQLite store only")
    config.addinivalue_line("markers", "postgres: needs a PostgreSQL server (skipped without one, unless CI=true)")


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if ("store_kind" in metafunc.fixturenames and module in BOTH_STORES
            and metafunc.definition.get_closest_marker("sqlite_only") is None
            and not hasattr(metafunc.function, "_store_kinds_fixed")):
        metafunc.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)


def no_postgres(reason: str):
    """Skip a PostgreSQL test with a reason; in CI (CI=true) a missing server is a failure instead."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server():
    """(admin URL, cluster dir or None): $SYNAPOLIS_TEST_PG_URL, else a throwaway server started with
    scripts/synapolis-test-postgres for this run (stopped at the end). Under pytest-xdist each worker is a
    session of its own: the workers share the server of $SYNAPOLIS_TEST_PG_URL, or each starts its own (a
    fresh folder, a free port); either way every test makes its own database (`pg_url`)."""
    url = os.environ.get("SYNAPOLIS_TEST_PG_URL")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        no_postgres("psycopg is not installed (pip install -e '.[test]')")
    if url:
        yield url, os.environ.get("SYNAPOLIS_TEST_PG_DIR") or None
        return
    done = subprocess.run(["bash", PG_SCRIPT, "start"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        no_postgres(f"no PostgreSQL server: set SYNAPOLIS_TEST_PG_URL, or make {PG_SCRIPT} work "
                    f"({done.stderr.strip()[-200:]})")
    found = dict(line.split("=", 1) for line in done.stdout.replace("export ", "").replace("'", "").split())
    try:
        yield found["SYNAPOLIS_TEST_PG_URL"], found["SYNAPOLIS_TEST_PG_DIR"]
    finally:
        subprocess.run(["bash", PG_SCRIPT, "destroy", found["SYNAPOLIS_TEST_PG_DIR"]], capture_output=True,
                       timeout=120)


def _with_dbname(url: str, dbname: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(url)
    parts["dbname"] = dbname
    user, password = parts.pop("user", ""), parts.pop("password", "")
    host, port = parts.pop("host", "127.0.0.1"), parts.pop("port", "5432")
    parts.pop("dbname")
    query = "&".join(f"{k}={v}" for k, v in parts.items())
    return f"postgresql://{user}:{password}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")


@pytest.fixture
def pg_url(pg_server):
    """A database of this test's own on the test server (dropped afterwards): a URL with its password."""
    import secrets

    import psycopg

    admin_url = pg_server[0]
    name = "t_" + secrets.token_hex(6)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield _with_dbname(admin_url, name)
    finally:
        from synapolis.store import close_all

        close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def use_store(state_dir, url: str) -> Workspace:
    """Point a state directory at a store (the config key `store`), creating it; the opened Workspace."""
    ws = Workspace.open(state_dir).ensure()
    document = json.loads(ws.paths.config.read_text())
    document["store"] = url
    ws.paths.config.write_text(json.dumps(document))
    return Workspace.open(state_dir)


@pytest.fixture
def store_kind(request):
    """"sqlite" (the default) or "postgres": which store `ws` uses (parametrised for BOTH_STORES modules)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def ws(state_dir, store_kind, request):
    """An opened, created Workspace on this test's state directory, on the store of `store_kind`."""
    if store_kind == "postgres":
        return use_store(state_dir, request.getfixturevalue("pg_url"))
    return Workspace.open(state_dir).ensure()


def console_script(name: str) -> str:
    """A console script of this install (`synapolis`, `validate-heartbeat`): the one next to the running
    interpreter, never a name looked up on PATH, which on a fresh machine finds nothing or another install."""
    from pathlib import Path

    return str(Path(sys.executable).parent / name)


# -- the CLI as a real process, its environment, and waiting for what another process does --------------

def synapolis_cmd(state_dir, *args) -> list[str]:
    """The CLI as a real process of this interpreter, on `state_dir`."""
    return [sys.executable, "-m", "synapolis", "--state-dir", str(state_dir), *map(str, args)]


def validate_heartbeat_cmd(state_dir, *args) -> list[str]:
    """The `validate-heartbeat` console script of this install (console_script), on `state_dir`."""
    return [console_script("validate-heartbeat"), "--state-dir", str(state_dir), *map(str, args)]


def clean_env(extra: dict | None = None, **more) -> dict:
    """This process's environment without any SYNAPOLIS_* variable, plus `extra` and `more`: a child process
    of a test must not inherit the developer's identity, store or state directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPOLIS_")}
    env.update(extra or {}, **more)
    return env


_cli_env = clean_env  # its old name, for branches that still use it


def refused(result, code: int = 2, type_name: str = "UsageError") -> str:
    """Assert that a CLI run (text or bytes) failed with exit `code` and one line on stderr, an error of
    `type_name` (the contract's "synapolis: <Type>: <message>"), no traceback and no "unexpected"; the line."""
    err = result.stderr.decode() if isinstance(result.stderr, bytes) else result.stderr
    assert result.returncode == code, (result.returncode, err)
    assert "Traceback" not in err and "unexpected" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"synapolis: {type_name}: "), err
    return lines[0]


def stop(proc, timeout: float = 10) -> int:
    """End a child process a test started, whatever it is doing: SIGTERM, SIGKILL after `timeout`, reaped.
    Its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.fixture
def spawn():
    """spawn(cmd, **Popen options) -> a child process, its environment `clean_env()` unless `env` is given.
    Every one still running when the test ends is stopped (`stop`), whatever the test did: no try/finally."""
    started = []

    def start(cmd, **options):
        options.setdefault("env", clean_env())
        proc = subprocess.Popen([str(part) for part in cmd], **options)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop(proc, timeout=5)


def wait_until(predicate, deadline_s: float = 20, what: str | None = None, interval_s: float = 0.02):
    """Poll `predicate` until it returns something truthy, and return that: for waiting on what another
    process does (a file it writes, a row it commits). Fails the test, saying what it waited for, when
    `deadline_s` passes first: a wait never ends quietly with the test going on as if it had happened."""
    import time

    deadline = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {deadline_s:g} s for {what or getattr(predicate, '__name__', 'a condition')}")
        time.sleep(interval_s)


async def wait_until_async(predicate, deadline_s: float = 20, what: str | None = None, interval_s: float = 0.02):
    """`wait_until` inside an event loop (anyio): the same poll and the same failure, in a worker thread, so the
    loop runs on meanwhile (the tasks the test waits on go on); `predicate` must be safe to call from there."""
    import anyio

    return await anyio.to_thread.run_sync(lambda: wait_until(predicate, deadline_s, what, interval_s))


def processes_running(*words) -> list[int]:
    """The ids of this machine's processes whose command line holds every one of `words` (read from /proc):
    for waiting until a detached process a test cannot hold a handle on (the notification sender) is gone."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if all(word in line for word in words):
            found.append(int(entry))
    return found


@pytest.fixture
def cli(state_dir):
    """Run `python -m synapolis --state-dir <this test's state dir> ARGS...`; a CompletedProcess (text)."""
    def run(*args, input=None, env=None, timeout=60, state=None):
        cmd = synapolis_cmd(state or state_dir, *args)
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=clean_env(env))
    return run


def heartbeat_doc(agent_id: str, beat_at: str, **fields) -> dict:
    """A schema-valid heartbeat document; `fields` override or add keys (None removes one)."""
    doc = {"schema_version": 1, "agent_id": agent_id, "harness": "test", "status": "active",
           "beat_at": beat_at, "seq": 1}
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def set_written_at(path, moment: datetime) -> None:
    """Give a file the modification time `moment` (what a reader with no memory judges a clock that runs
    ahead by): a file written at the test's `now` looks written then, whatever the machine's clock says."""
    os.utime(path, (moment.timestamp(), moment.timestamp()))


@pytest.fixture
def put_heartbeat(ws):
    """Write a raw heartbeat file (no seq bookkeeping), as if written at `written_at` (default NOW):
    put_heartbeat(agent_id, beat_at, written_at=NOW, **fields) -> path."""
    def put(agent_id: str, beat_at: str, written_at: datetime = NOW, **fields):
        path = ws.paths.heartbeats / f"{agent_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(heartbeat_doc(agent_id, beat_at, **fields)))
        set_written_at(path, written_at)
        return path
    return put


# -- signal protocol helpers (tests/test_sessions.py, test_signals.py, test_delivery.py, ...) -----

@pytest.fixture
def start_agent(ws):
    """start_agent(agent_id, **kw) -> actions.start's answer, with no environment and `now=NOW` by default."""
    from synapolis import actions

    def start(agent_id=None, **kw):
        kw.setdefault("env", {})
        kw.setdefault("now", NOW)
        return actions.start(ws, agent_id=agent_id, **kw)
    return start


_SESSION_TABLES = ("agents", "signals", "signal_reads", "signal_deliveries", "session_state", "staged_memories",
                   "rate_buckets")


def sqlite_rows(ws, session_id, sql, *args) -> list[tuple]:
    """Rows (as tuples) read straight from a session's SQLite `session.db`, bypassing the store."""
    import sqlite3
    conn = sqlite3.connect(str(ws.paths.session_db(session_id)))
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def store_rows(ws, session_id, sql, args=()) -> list[dict]:
    """Rows (as dicts) read straight from the store's database with `sql` (SQLite's `?` placeholders):
    that session's session.db, or the session's rows of the PostgreSQL database (each EP-0118 table name
    in `sql` then means that table's rows of this session)."""
    import sqlite3

    url = ws.config.values.get("store") or "sqlite"
    if url.startswith("postgresql://"):
        import psycopg
        from psycopg import sql as pgsql
        from psycopg.rows import dict_row

        scoped = ", ".join(f"{t} AS (SELECT * FROM public.{t} WHERE session_id = {{sid}})" for t in _SESSION_TABLES)
        query = pgsql.SQL("WITH " + scoped + " ").format(sid=pgsql.Literal(session_id))
        with psycopg.connect(url, row_factory=dict_row) as conn:
            text = query.as_string(conn) + sql.replace("?", "%s")
            return [dict(r) for r in conn.execute(text, args).fetchall()]
    conn = sqlite3.connect(str(ws.paths.session_db(session_id)))
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def claim_events(ws) -> list[dict]:
    """Every claim event the store holds, oldest first, read around the library: `claims.jsonl` on SQLite,
    table `claim_events` on PostgreSQL."""
    url = ws.config.values.get("store") or "sqlite"
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as conn:
            return [json.loads(row[0]) for row in conn.execute("SELECT event FROM claim_events ORDER BY seq")]
    return [json.loads(line) for line in ws.paths.claims_log.read_text().splitlines() if line.strip()]


@pytest.fixture
def db_rows(ws):
    """db_rows(session_id, sql, *args) -> rows (as dicts) read straight from the store (store_rows)."""
    def rows(session_id, sql, *args):
        return store_rows(ws, session_id, sql, args)
    return rows


@pytest.fixture
def backlog(state_dir):
    """backlog(count, to="bob", content=...) -> (ws, session_id): alice and bob registered (no rate limit),
    then `count` signals from alice to `to` stored in one transaction, none delivered."""
    from synapolis import actions, signals
    from synapolis.store import SessionStore

    def make(count: int, to: str = "bob", content=lambda i: f"signal {i}"):
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 10 ** 6}))
        ws = Workspace.open(state_dir).ensure()
        sid = actions.start(ws, agent_id="alice", env={}, now=NOW)["session_id"]
        actions.start(ws, agent_id="bob", session_id=sid, env={}, now=NOW)
        with SessionStore.open(ws, sid) as store, store.write() as conn:
            for i in range(count):
                signals.send(conn, caller="alice", recipient=to, content=content(i), config=ws.config,
                             now=NOW + timedelta(microseconds=i), rate_limited=False)
        return ws, sid
    return make


# -- MCP clients ---------------------------------------------------------------------------------

def ts_sdk1_check(result, output_schema) -> None:
    """Check a tool result the way a TypeScript MCP SDK 1.x client does before the model sees it
    (`Client.callTool`): a tool with an output schema must return structured content unless the result is
    an error, and structured content, when present, must match the schema even on an error. Raises
    AssertionError with the message such a client would show the model instead of the result."""
    import jsonschema

    if not output_schema:
        return
    structured = result.structured_content
    if structured is None:
        assert result.is_error, "-32602 Tool has an output schema but did not return structured content"
        return
    validator = jsonschema.validators.validator_for(output_schema)(output_schema)
    problems = [e.message for e in validator.iter_errors(structured)]
    assert not problems, f"-32602 Structured content does not match the tool's output schema: {problems}"


# -- the team server (synapolis serve) ------------------------------------------------------------

class Served:
    """A running `synapolis serve` process: its base URL, its state directory, a way to make tokens."""

    def __init__(self, proc, url, state_dir, cli):
        self.proc, self.url, self.state_dir, self._cli = proc, url, state_dir, cli

    def token(self, name, *extra) -> str:
        made = self._cli("tokens", "create", name, *extra, "--json")
        assert made.returncode == 0, made.stderr
        return json.loads(made.stdout)["token"]


def start_server(state_dir, *args, timeout=30, env=None, preexec_fn=None):
    """Start `synapolis serve --port 0 ARGS` on `state_dir`; (process, base URL) once it listens.
    Everything it says on stderr collects in `process.said` (drained, so it never blocks on a full pipe).
    `preexec_fn`: run in the child before it starts (e.g. to lower its open-file limit)."""
    import re
    import threading
    import time

    cmd = synapolis_cmd(state_dir, "serve", "--port", "0", *args)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env(env),
                            preexec_fn=preexec_fn)
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(r"listening on (https?://\S+)", line)
        if found:
            proc.said = seen
            # `proc.reader`: joined once the process has exited, everything it said is in `proc.said`
            proc.reader = threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True)
            proc.reader.start()
            return proc, found.group(1)
    proc.kill()
    proc.wait()
    raise AssertionError(f"synapolis serve did not start: {''.join(seen)}")


def everything_said(proc, timeout: float = 10) -> str:
    """All a server of `start_server` said on stderr, once it has exited: its reader has reached the end of
    the pipe (joined), so no last line is still on its way."""
    assert proc.poll() is not None, "the server is still running: stop it first"
    proc.reader.join(timeout)
    assert not proc.reader.is_alive(), f"the server's stderr was still open {timeout:g} s after it exited"
    return "".join(proc.said)


@pytest.fixture
def served(state_dir, cli):
    """A `synapolis serve` on this test's state directory (loopback, any free port), stopped afterwards."""
    Workspace.open(state_dir).ensure()
    proc, url = start_server(state_dir)
    try:
        yield Served(proc, url, state_dir, cli)
    finally:
        stop(proc)


def mcp_http_client(url: str, token: str | None, mode: str = "legacy", **client_options):
    """The MCP SDK's client over streamable HTTP to `url`/mcp, with `token` as its bearer header."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # the SDK's own transport timeouts: 30 s, and 300 s to read (a response stream may stay open)
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    transport = streamable_http_client(url + "/mcp", http_client=http)
    return Client(transport, mode=mode, **client_options)


# -- MCP tool calls and pushes, whatever the transport (tests/test_mcp*.py) -------------------------

DEADLINE_S = 10  # generous bound for "promptly" on a loaded 2-core machine; typical is ~20 ms


async def ok(client, tool, **args) -> dict:
    """Call a tool that must succeed; its structured result (which always carries pending_signals)."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    data = result.structured_content
    assert "pending_signals" in data and json.loads(result.content[0].text) == data
    return data


_SCHEMAS: dict = {}


async def output_schema(client, tool):
    if not _SCHEMAS:
        _SCHEMAS.update({t.name: t.output_schema for t in (await client.list_tools()).tools})
    return _SCHEMAS.get(tool)


async def fails(client, tool, type_name, exit_code, **args) -> str:
    """Call a tool that must fail with the contract's error; its one-line message, which is what a
    TypeScript SDK 1.x client shows the model too (no structured content breaking the output schema)."""
    result = await client.call_tool(tool, args)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert text.startswith(f"{type_name} (exit {exit_code}): "), text
    assert "\n" not in text and "Traceback" not in text
    ts_sdk1_check(result, await output_schema(client, tool))
    return text


class Inbox:
    """Collects `notifications/resources/updated` URIs and lets a test wait for one."""

    def __init__(self):
        import anyio

        self.uris: list[str] = []
        self._event = anyio.Event()

    async def __call__(self, message):
        if getattr(message, "method", None) == "notifications/resources/updated":
            self.uris.append(message.params.uri)
            self._event.set()

    async def wait_for(self, uri, deadline_s: float = DEADLINE_S):
        import anyio

        with anyio.fail_after(deadline_s):
            while uri not in self.uris:
                await self._event.wait()
                self._event = anyio.Event()


# -- processes under hostile conditions (tests/test_integrity.py, test_hostile_files.py, test_faults.py) ---

def run_limited(state_dir, *args, fsize: int | None = None, memory: int | None = None, input=None,
                timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    """Run the CLI with RLIMIT_FSIZE `fsize` (no file may grow past that many bytes; SIGXFSZ ignored, so a
    write past it fails with EFBIG as on a quota) and RLIMIT_AS `memory` (a reader that tried to take in
    /dev/zero fails fast instead of swapping the machine); the CompletedProcess (text)."""
    import resource
    import signal as signals

    def limits():
        if fsize is not None:
            signals.signal(signals.SIGXFSZ, signals.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(synapolis_cmd(state_dir, *args), input=input, capture_output=True, text=True,
                          timeout=timeout, env=clean_env(env), preexec_fn=limits)


class Holder:
    """A child process holding something until the `with` ends: `Holder.store(db)` a write transaction
    on a session store, `Holder.flock(path)` an exclusive flock on a file (a lock, or a log itself)."""

    _STORE = ("import sqlite3, sys, time\n"
              "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "conn.execute('BEGIN IMMEDIATE')\n"
              "print('holding', flush=True)\n"
              "time.sleep(120)\n")
    _FLOCK = ("import fcntl, os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "print('holding', flush=True)\n"
              "time.sleep(120)\n")

    def __init__(self, script: str, target):
        self.proc = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True,
                                     env=clean_env())

    @classmethod
    def store(cls, db_path) -> "Holder":
        return cls(cls._STORE, db_path)

    @classmethod
    def flock(cls, path) -> "Holder":
        return cls(cls._FLOCK, path)

    def __enter__(self):
        assert self.proc.stdout.readline().strip() == "holding"
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=10)


def jsonl_is_whole(path) -> list[dict]:
    """Every line of a JSON-lines file, asserting none is torn: each parses and the file ends in a newline."""
    if not os.path.exists(path):
        return []
    raw = open(path, "rb").read()
    assert raw == b"" or raw.endswith(b"\n"), f"{path} ends in a torn line: {raw[-80:]!r}"
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def pad_jsonl(path, size: int, record: dict | None = None) -> None:
    """Grow a JSON-lines file with whole, valid lines to `size` bytes (when it is smaller)."""
    record = record or {"pad": "x" * 900}
    line = (json.dumps(record) + "\n").encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as handle:
        have = handle.tell()
        handle.write(line * max(0, (size - have) // len(line)))
        rest = size - handle.tell() - len('{"pad":""}\n')
        if rest >= 0:  # one shorter line to land on `size` exactly
            handle.write(('{"pad":"' + "x" * rest + '"}\n').encode())


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs mounted for this test (root only; skipped with the reason otherwise): a disk that fills."""
    import shutil

    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill_to(folder, free_bytes: int) -> None:
    """Fill the filesystem of `folder` until about `free_bytes` are left (a file named filler)."""
    filler = os.path.join(folder, "filler")
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    with open(filler, "ab") as handle:
        try:
            handle.write(b"\0" * max(0, free - free_bytes))
            handle.flush()
        except OSError:
            pass


# The CLI in a child process whose I/O steps are counted: every os.write, os.replace, os.link and
# os.fsync, and every BEGIN and COMMIT of a session store. At step `at` the child raises OSError (mode
# "raise": a failing disk) or kills itself with SIGKILL (mode "kill": a crash); at=0 counts only. The
# last line of stderr is "FAULT-STEPS n" whenever the child exits by itself.
_FAULTY = r"""
import atexit, errno, os, signal, sqlite3, sys
mode, at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
steps = []

def step(name):
    steps.append(name)
    if len(steps) == at:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.EIO, f"injected fault at step {at} ({name})")

def counted(module, attr):
    real = getattr(module, attr)
    def wrapper(*a, **k):
        step(attr)
        return real(*a, **k)
    setattr(module, attr, wrapper)

for attr in ("write", "replace", "link", "fsync"):
    counted(os, attr)

class Counted(sqlite3.Connection):
    def execute(self, sql, *a):
        head = sql.split(None, 1)[0].upper() if sql.strip() else ""
        if head in ("BEGIN", "COMMIT"):
            step(head)
        return super().execute(sql, *a)

_connect = sqlite3.connect
def connect(*a, **k):
    k.setdefault("factory", Counted)
    return _connect(*a, **k)
sqlite3.connect = connect
atexit.register(lambda: sys.stderr.write(f"\nFAULT-STEPS {len(steps)} {' '.join(steps)}\n"))
from synapolis.cli import main
main(args)
"""


def run_faulty(state_dir, *args, at: int = 0, mode: str = "raise", input=None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI on `state_dir` with a fault at step `at` (see _FAULTY); returncode -9 when killed."""
    return subprocess.run([sys.executable, "-c", _FAULTY, mode, str(at), "--state-dir", str(state_dir),
                           *map(str, args)], input=input, capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


def fault_steps(out: subprocess.CompletedProcess) -> int:
    """How many steps a run of run_faulty counted."""
    for line in reversed(out.stderr.splitlines()):
        if line.startswith("FAULT-STEPS "):
            return int(line.split()[1])
    raise AssertionError(f"no step count: {out.stderr[-1000:]}")


@pytest.fixture
def harness_home(tmp_path, monkeypatch):
    """An empty home directory and no harness variables, so the user's own ~/.codex, ~/.gemini and
    /etc/gemini-cli settings stay out of what is checked (and out of reach of what is written); and a
    temporary folder of the test's own (TMPDIR), where a harness leaves its files (Gemini CLI writes an
    error report to os.tmpdir() for each failed model call) instead of in the machine's /tmp."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("CODEX_HOME", "GEMINI_CLI_HOME", "GEMINI_CLI_TRUST_WORKSPACE", "GEMINI_CLI_TRUSTED_FOLDERS_PATH",
                 "GEMINI_CLI_SYSTEM_DEFAULTS_PATH", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GEMINI_CLI_SYSTEM_SETTINGS_PATH", str(tmp_path / "etc-gemini-cli" / "settings.json"))
    # synapolis on PATH, as on the machine of a teammate who installed it: the project's hook files run the
    # portable `synapolis` (hooks install --scope project)
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(console_script("synapolis")),
                                                os.environ.get("PATH", "")]))
    return path


# -- the real harness binaries (tests/test_harness_*.py) -------------------------------------------

def respond(handler, status: int, content_type: str, body: bytes) -> None:
    """Answer the request a BaseHTTPRequestHandler is handling with `body` (a local stand-in's reply)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class LocalServer:
    """A ThreadingHTTPServer for `handler` on a free loopback port, served on a daemon thread (a stand-in for a
    model API): `url`, and `close()`."""

    def __init__(self, handler):
        import threading
        from http.server import ThreadingHTTPServer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


HARNESS_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".ci", "cache", "harnesses")


def harness_binary(name: str) -> str | None:
    """A harness's CLI (`claude`, `gemini`, `codex`): $SYNAPOLIS_TEST_<NAME>, else the pinned one that
    .ci/setup.d/50-harnesses.sh installed under this checkout's .ci/cache, else one on PATH; else None."""
    import shutil

    pinned = os.path.join(HARNESS_CACHE, name, "node_modules", ".bin", name)
    return (os.environ.get(f"SYNAPOLIS_TEST_{name.upper()}") or (pinned if os.access(pinned, os.X_OK) else None)
            or shutil.which(name))


def require_harness(name: str) -> str:
    """`harness_binary(name)`, or the test skips (fails in CI, where .ci/run installs them with npm)."""
    found = harness_binary(name)
    if found is None:
        message = f"no {name} binary (set SYNAPOLIS_TEST_{name.upper()}, or run .ci/setup.d/50-harnesses.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


class CodexAppServer:
    """`codex app-server` (Codex's own JSON-RPC over stdio), initialized: `ask(method, params)` is one
    request's answer (notifications in between are passed over)."""

    def __init__(self, codex: str, codex_home, cwd, env=None):
        env = {**os.environ, **(env or {}), "CODEX_HOME": str(codex_home)}
        self.proc = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=cwd, env=env)
        self._next = 0
        self.ask("initialize", {"clientInfo": {"name": "synapolis-tests", "version": "0"}})
        self._send({"method": "initialized"})

    def _send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def ask(self, method: str, params: dict) -> dict:
        self._next += 1
        self._send({"id": self._next, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            assert line, "codex app-server closed its output"
            message = json.loads(line)
            if message.get("id") == self._next:
                return message

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=30)


# -- a webhook receiver on 127.0.0.1 (notifications, contract §15) --------------------------------------

class Receiver:
    """A real HTTP server in a thread of the test: records every POST (path, headers, body, time) and answers
    with the next status of `script` for its path (then 200), or `hang` seconds of silence first."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict] = []
        self.script: dict[str, list[int]] = {}
        self.hang: dict[str, float] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                import time

                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "at": time.monotonic()})
                    statuses = receiver.script.get(self.path) or []
                    status = statuses.pop(0) if statuses else 200
                if receiver.hang.get(self.path):
                    time.sleep(receiver.hang[self.path])
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def at(self, path: str) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


# -- a real browser (headless Chromium through Playwright) ---------------------------------------------
# what the brief for a test browser asks: nothing in the background, nothing from the network but the page
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    found = os.environ.get("SYNAPOLIS_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return found if found and os.path.exists(found) else None


def _need(what: str, ok: bool):
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing in CI (.ci/setup.d/40-chromium.sh and the test extra install it)")
        pytest.skip(f"{what} is not installed here (CI installs it)")


@pytest.fixture
def browser(tmp_path):
    """A fresh headless Chromium profile (its own --user-data-dir); yields the Playwright context."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    _need("the playwright package", sync_playwright is not None)
    chromium = _chromium()
    _need("chromium", chromium is not None)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800})
        try:
            yield context
        finally:
            context.close()


def dashboard_page(browser, served, token: str):
    """A page of `browser` signed in to `served`'s dashboard with `token`, its event stream live."""
    page = browser.new_page()
    page.goto(served.url + "/")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#live:text-is('live')", timeout=10_000)
    return page


class ScriptedModel:
    """A local stand-in for a model API that plays a script: the answer to a request that carries N tool
    results is the (N+1)th tool call of `calls` (each `(tool name, arguments)`), and past the last one a plain
    final text. Every request body is recorded (`bodies`), so a test reads exactly what the harness sent its
    model: a hook's refusal, its context. Speaks Anthropic's Messages API (`anthropic`, streamed or not),
    Gemini's generateContent (`gemini`, streamed as SSE or not) and OpenAI's Responses API (`openai`, SSE).

    `hold` (a threading.Event, optional): the answer to a request with results of all calls waits for it to
    be set, so a harness session stays alive (between tool calls, as a working agent is) until the test lets
    it finish."""

    status = 200

    def __init__(self, protocol: str, calls, hold=None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.protocol, self.calls, self.hold = protocol, list(calls), hold
        self.bodies: list[str] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
                model.bodies.append(raw)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                ctype, out = model.answer(self.path, body, raw)
                self.send_response(model.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def results_in(self, raw: str) -> int:
        marker = {"anthropic": '"type":"tool_result"', "gemini": '"functionResponse"',
                  "openai": '"type":"function_call_output"'}[self.protocol]
        count = raw.replace(" ", "").count(marker)
        if self.protocol == "openai":
            count += raw.replace(" ", "").count('"type":"custom_tool_call_output"')
        return count

    def with_result(self, n: int) -> list[str]:
        """The recorded requests that carry exactly `n` tool results (the requests right after call n)."""
        return [b for b in self.bodies if self.results_in(b) == n]

    def answer(self, path: str, body: dict, raw: str) -> tuple[str, bytes]:
        done = self.results_in(raw)
        wants_tools = bool(body.get("tools")) or self.protocol == "openai"
        call = self.calls[done] if wants_tools and done < len(self.calls) else None
        if call is None and self.hold is not None and done >= len(self.calls) and wants_tools:
            self.hold.wait(timeout=300)
        return getattr(self, f"_{self.protocol}")(path, body, call, done)

    @staticmethod
    def _sse(events, named: bool = True) -> bytes:
        return "".join((f"event: {e['type']}\n" if named else "") + f"data: {json.dumps(e)}\n\n" for e in events).encode()

    def _anthropic(self, path, body, call, done):
        if call is None:
            blocks, stop = [{"type": "text", "text": "done"}], "end_turn"
        else:
            blocks, stop = [{"type": "tool_use", "id": f"toolu_{done:02d}", "name": call[0], "input": call[1]}], "tool_use"
        message = {"id": f"msg_{done}", "type": "message", "role": "assistant", "model": body.get("model", "m"),
                   "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 5}}
        if not body.get("stream"):
            return "application/json", json.dumps({**message, "content": blocks, "stop_reason": stop}).encode()
        events = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}]
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                events += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                           {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}]
            else:
                events += [{"type": "content_block_start", "index": i,
                            "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}},
                           {"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}}]
            events.append({"type": "content_block_stop", "index": i})
        events += [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5}}, {"type": "message_stop"}]
        return "text/event-stream", self._sse(events)

    def _gemini(self, path, body, call, done):
        part = {"text": "done"} if call is None else {"functionCall": {"name": call[0], "args": call[1]}}
        chunk = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 5, "totalTokenCount": 10},
                 "modelVersion": "gemini-2.5-pro"}
        if "alt=sse" in path:
            return "text/event-stream", self._sse([chunk], named=False)
        return "application/json", json.dumps(chunk).encode()

    def _openai(self, path, body, call, done):
        rid = f"resp_{len(self.bodies)}"
        if call is None:
            item = {"type": "message", "id": f"msg_{done}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}]}
        elif call[0] == "apply_patch" and isinstance(call[1], str):
            item = {"type": "custom_tool_call", "id": f"ctc_{done}", "call_id": f"call_{done}", "name": call[0],
                    "input": call[1], "status": "completed"}
        else:
            item = {"type": "function_call", "id": f"fc_{done}", "call_id": f"call_{done}", "name": call[0],
                    "arguments": json.dumps(call[1]), "status": "completed"}
        usage = {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10}
        events = [{"type": "response.created", "response": {"id": rid}},
                  {"type": "response.output_item.done", "output_index": 0, "item": item},
                  {"type": "response.completed", "response": {"id": rid, "usage": usage, "output": [item]}}]
        return "text/event-stream", self._sse(events)

class ModelStandIn:
    """A local stand-in for a model API over HTTP: records each request body (as text, in `bodies`) and answers
    with `respond(body bytes) -> (status, content type, bytes)`. By default it refuses every request (400, an
    error object Gemini's and Anthropic's clients both read), so a CLI stops after its first turn; what the
    model would have been sent is what a test reads."""

    def __init__(self, respond=None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        bodies = self.bodies = []
        respond = respond or self.refuse

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                bodies.append(raw.decode("utf-8", "replace"))
                status, kind, out = respond(raw)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    @staticmethod
    def refuse(_body: bytes):
        return 400, "application/json", json.dumps({"type": "error", "error": {
            "code": 400, "type": "invalid_request_error", "message": "stand-in", "status": "INVALID_ARGUMENT"}}).encode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# -- a harness's pre-tool hook, as a real process (contract §14) -------------------------------------------

def claude_edit(project, rel: str, conversation: str = "conv-of-bob-0001") -> str:
    """Claude Code's PreToolUse event for an Edit of `rel` under `project` (as its docs give it)."""
    return json.dumps({"session_id": conversation, "hook_event_name": "PreToolUse", "cwd": str(project),
                       "transcript_path": "/tmp/t.jsonl", "permission_mode": "default", "tool_use_id": "toolu_01",
                       "tool_name": "Edit", "tool_input": {"file_path": str(project / rel), "old_string": "a",
                                                          "new_string": "b"}})


def hook_denies(state_dir, project, rel: str, conversation: str = "conv-of-bob-0001") -> dict:
    """Run the console script `synapolis hook claude-code` on an edit of `rel`; its answer, which must deny."""
    done = subprocess.run(synapolis_cmd(state_dir, "hook", "claude-code"), input=claude_edit(project, rel, conversation),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    answer = json.loads(done.stdout)
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny", answer
    return answer


def refuse_a_deadlock(state_dir) -> subprocess.CompletedProcess:
    """alice holds ticket:1 and waits (a real `claim --wait` process) for bob's ticket:2; bob's own wait for
    ticket:1 (a second real process, --json) would close the cycle and is refused: its finished process."""
    def waits(agent, item, *more):
        return subprocess.Popen(synapolis_cmd(state_dir, "claim", item, "--agent-id", agent, "--wait", "60", *more),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())

    alice = waits("alice", "ticket:2")
    try:
        def alice_waits():
            listed = subprocess.run(synapolis_cmd(state_dir, "claims", "--json"), capture_output=True, text=True,
                                    env=clean_env(), timeout=30)
            return [w for w in json.loads(listed.stdout)["waiting"] if w["agent_id"] == "alice"]
        wait_until(alice_waits, 30, "alice recorded as a waiter")
        bob = waits("bob", "ticket:1", "--json")
        out, err = bob.communicate(timeout=30)
        return subprocess.CompletedProcess(bob.args, bob.returncode, out, err)
    finally:
        alice.kill()
        alice.wait(timeout=10)


# -- the remote mode (contract §16): a team server and a sandbox that has only its URL and a token ----------

# what a sandbox's state directory may hold: its own files, nothing of a store
SANDBOX_OWN = {"identity.json", "heartbeats", "hooks", ".locks"}


class Team(Served):
    """The team's server (a real `synapolis serve` on the test's state directory) and a sandbox beside it."""

    def __init__(self, server_dir, sandbox_dir, url, proc, cli):
        super().__init__(proc, url, server_dir, cli)
        self.server_dir, self.sandbox_dir = server_dir, sandbox_dir

    def here(self, *args, input=None, env=None):
        """A CLI call on the server's machine (beside the store)."""
        return self._cli(*args, input=input, env=env)

    def there(self, token, *args, input=None, env=None, server=None, timeout=60):
        """A CLI call in the sandbox: only SYNAPOLIS_SERVER and SYNAPOLIS_TOKEN."""
        extra = {"SYNAPOLIS_SERVER": server or self.url}
        if token is not None:
            extra["SYNAPOLIS_TOKEN"] = token
        extra.update(env or {})
        return subprocess.run(synapolis_cmd(self.sandbox_dir, *args), input=input, capture_output=True,
                              text=True, timeout=timeout, env=clean_env(extra))

    def sandbox_holds(self) -> set:
        return set(os.listdir(self.sandbox_dir)) if os.path.isdir(self.sandbox_dir) else set()


@pytest.fixture
def team(ws, tmp_path, cli):
    """A real `synapolis serve` on the test's state directory (`ws`: SQLite or PostgreSQL) and a sandbox."""
    proc, url = start_server(ws.root)
    try:
        yield Team(ws.root, tmp_path / "sandbox" / "state", url, proc, cli)
    finally:
        stop(proc)


def succeeded(result) -> dict | str:
    """A CLI run's output (its JSON object, or its text) once it exited 0."""
    assert result.returncode == 0, (result.returncode, result.stderr)
    return json.loads(result.stdout) if result.stdout.startswith("{") else result.stdout




def tool_call_stand_in(tool: str, arguments: dict, before=None) -> ModelStandIn:
    """A local stand-in for an OpenAI-compatible chat API, streaming (opencode's and Copilot CLI's BYOK provider):
    the first turn with tools asks for one call of `tool` with `arguments` (running `before()` just before, e.g.
    to have a signal sent while the tool runs); any turn after a tool result answers "done"; a turn without
    tools (opencode's title) answers a title."""

    def chunk(delta, finish=None):
        return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

    def respond(raw: bytes):
        request = json.loads(raw)
        if not request.get("tools"):
            out = chunk({"role": "assistant", "content": "a title"}) + chunk({}, "stop")
        elif not any(m.get("role") == "tool" for m in request.get("messages", [])):
            if before is not None:
                before()
            call = {"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(arguments)}}
            out = chunk({"role": "assistant", "tool_calls": [call]}) + chunk({}, "tool_calls")
        else:
            out = chunk({"role": "assistant", "content": "done"}) + chunk({}, "stop")
        return 200, "text/event-stream", (out + "data: [DONE]\n\n").encode()

    return ModelStandIn(respond)


def held_project(project, cli, harness: str):
    """`project` (the state directory's parent) as a git repository with `harness`'s hooks installed, whose
    src/held.py (text "one") bob, a live agent, holds; the file's path."""
    subprocess.run(["git", "init", "-q", str(project)], check=True, capture_output=True)
    held = project / "src" / "held.py"
    held.parent.mkdir(exist_ok=True)
    held.write_text("one\n")
    cli("hooks", "install", harness, "--project-dir", project)
    cli("start", "--agent-id", "bob")
    cli("claim", "src/held.py", "--agent-id", "bob")
    return held
