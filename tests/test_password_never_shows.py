"""The database password never shows (issue 30, contract §12): a store URL that libpq would misread (an `@`,
`/` or space in the password, a bad %-escape, an unclosed IPv6 bracket), a value libpq refuses, a host that
cannot be reached or resolved and a wrong password, each fed through every surface that names the store:
every verb's error (text and --json), a hook, doctor, `serve`'s log (psycopg-pool's warnings included),
`/api/status`'s problems, the dashboard's data and the page a browser renders, an MCP tool's error. All the
output, and every file of the state directory, is searched for either half of the password (a misread URL
shows a part of it: libpq took `u:Sec@ret@host` as the host `ret@host`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request

import anyio
import pytest

from conftest import clean_env, dashboard_page, mcp_http_client, start_server, synapolis_cmd

A, B = "Kx7Qp2vN", "Zr9Wm4tL"  # the password's two halves
MALFORMED = ("at-in-password", "slash-in-password", "space-in-password", "bad-percent-escape", "unclosed-ipv6")
PARSED = ("bad-sslmode", "nothing-listens", "unknown-host", "wrong-password")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shapes(pg_server) -> dict:
    """Each shape's store URL, on the test server's host, port, user and database (wrong password)."""
    from psycopg.conninfo import conninfo_to_dict

    real = conninfo_to_dict(pg_server[0])
    host, port, user, dbname = real.get("host", "127.0.0.1"), real.get("port", "5432"), real["user"], real["dbname"]

    def url(password, where=f"{host}:{port}", query=""):
        return f"postgresql://{user}:{password}@{where}/{dbname}{query}"

    return {
        "at-in-password": url(f"{A}@{B}"),
        "slash-in-password": url(f"{A}/{B}"),
        "space-in-password": url(f"{A} {B}"),
        "bad-percent-escape": url(f"{A}%zz{B}"),
        "unclosed-ipv6": url(A + B, f"[::1:{port}"),
        "bad-sslmode": url(A + B, query="?sslmode=bogus"),
        "nothing-listens": url(A + B, f"127.0.0.1:{_free_port()}"),
        "unknown-host": url(A + B, f"nowhere.invalid:{port}"),
        "wrong-password": url(A + B),
    }


def hidden(text: str, what: str) -> None:
    for half in (A, B):
        assert half not in text, f"{what} shows (part of) the password:\n{text[-2000:]}"


def no_file_shows(root, *, but=()) -> None:
    """No file under the state directory holds either half of the password (`but`: names the user put it
    in themselves, synapolis.json when the URL is set there)."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if name in but or os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            for half in (A, B):
                assert half.encode() not in data, f"{path} holds (part of) the password"


def run(state_dir, *args, env=None, input=None):
    return subprocess.run(synapolis_cmd(state_dir, *args), capture_output=True, text=True, timeout=60,
                          env=clean_env(env), input=input)


def set_store(state_dir, url) -> None:
    path = state_dir / "synapolis.json"
    document = json.loads(path.read_text()) if path.exists() else {}
    document["store"] = url
    path.write_text(json.dumps(document))


VERBS = [("start", "--agent-id", "alice", "--json"), ("start", "--agent-id", "alice"),
         ("beat", "--agent-id", "alice", "--session-id", "s1"), ("status", "--json"), ("list-agents", "--json"),
         ("signal", "*", "hello", "--agent-id", "alice", "--session-id", "s1", "--json"), ("memories", "--json"),
         ("watchdog",), ("doctor", "--json"), ("doctor",)]


@pytest.mark.postgres
@pytest.mark.parametrize("shape", MALFORMED + PARSED)
def test_no_verb_hook_or_doctor_shows_the_password(shapes, shape, tmp_path):
    url = shapes[shape]
    state = tmp_path / "state"
    run(state, "init")
    env = {"SYNAPOLIS_STORE_URL": url}
    for args in VERBS:
        out = run(state, *args, env=env)
        hidden(out.stdout + out.stderr, " ".join(args))
        assert "Traceback" not in out.stderr, out.stderr
        if args[0] == "start":
            # one readable line with the contract's code: 2 for a URL that does not parse (nothing of it
            # quoted), 8 for a store that cannot be reached or refuses the credentials (the host named)
            assert out.returncode == (2 if shape in MALFORMED else 8), out.stderr
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            if "--json" in args:
                assert json.loads(out.stdout)["error"]["exit_code"] == out.returncode
            if shape in MALFORMED:
                assert "does not parse" in out.stderr
            elif shape != "bad-sslmode":
                assert "postgresql://" in out.stderr and "@" in out.stderr  # the rebuilt URL names user and host
    hook = run(state, "hook", "claude-code", env=env,
               input=json.dumps({"session_id": "c1", "hook_event_name": "SessionStart", "cwd": str(tmp_path)}))
    assert hook.returncode == 0
    hidden(hook.stdout + hook.stderr, "a hook")
    no_file_shows(state)

    # the same URL in synapolis.json: refused where the config loads (malformed), or named rebuilt
    set_store(state, url)
    for args in (("start", "--agent-id", "bob", "--json"), ("doctor", "--json"), ("status",)):
        out = run(state, *args)
        hidden(out.stdout + out.stderr, " ".join(args) + " (URL in synapolis.json)")
        assert "Traceback" not in out.stderr
    no_file_shows(state, but=("synapolis.json",))


def _get(url, token) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


async def _tool_errors(base, token) -> list[str]:
    async with mcp_http_client(base, token) as client:
        said = []
        for tool, args in (("list_agents", {}), ("read_notes", {"session_id": "s1"})):
            result = await client.call_tool(tool, args)
            said.append(result.content[0].text if result.content else "")
            assert result.is_error, (tool, said[-1])
        return said


@pytest.mark.postgres
def test_serve_never_shows_the_password(shapes, state_dir, cli):
    """One server, the store URL changed under it in synapolis.json (which it re-reads): its answers, its MCP
    tools' errors and its log (uvicorn's, ours and psycopg-pool's warnings while it retries) stay clean."""
    cli("init")
    token = json.loads(cli("tokens", "create", "ops", "--json").stdout)["token"]
    proc, base = start_server(state_dir)
    try:
        for shape in MALFORMED + PARSED:
            set_store(state_dir, shapes[shape])
            status, body = _get(base + "/api/status", token)
            hidden(body, f"/api/status ({shape})")
            if status == 200:
                assert json.loads(body)["problems"], body  # the store's trouble is told, without the password
            else:
                assert json.loads(body)["error"]["message"], body
            hidden(_get(base + "/api/dashboard", token)[1], f"/api/dashboard ({shape})")
            for text in anyio.run(_tool_errors, base, token):
                hidden(text, f"an MCP tool's error ({shape})")
                assert "Traceback" not in text
        healthy = _get(base + "/healthz", token)
        assert healthy[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    log = "".join(proc.said)
    hidden(log, "serve's log")
    no_file_shows(state_dir, but=("synapolis.json",))


@pytest.mark.postgres
@pytest.mark.parametrize("shape", ["at-in-password", "unclosed-ipv6", "wrong-password"])
def test_serve_started_on_such_a_url(shapes, shape, state_dir, cli):
    """SYNAPOLIS_STORE_URL fixed for the server's life: one that does not parse is refused before it listens
    (one line, exit 2, no traceback); one that parses serves, its log naming the store without the password."""
    cli("init")
    token = json.loads(cli("tokens", "create", "ops", "--json").stdout)["token"]
    env = {"SYNAPOLIS_STORE_URL": shapes[shape]}
    if shape != "wrong-password":
        out = subprocess.run(synapolis_cmd(state_dir, "serve", "--port", "0"), capture_output=True, text=True,
                             timeout=60, env=clean_env(env))
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "does not parse" in out.stderr, out.stderr
        hidden(out.stdout + out.stderr, "serve")
        return
    proc, base = start_server(state_dir, env=env)
    try:
        status, body = _get(base + "/api/status", token)
        assert status == 200 and "password authentication failed" in body, body
        hidden(body, "/api/status")
        for text in anyio.run(_tool_errors, base, token):
            hidden(text, "an MCP tool's error")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    log = "".join(proc.said)
    assert "password authentication failed" in log  # psycopg-pool's warnings are there, and clean
    hidden(log, "serve's log")
    no_file_shows(state_dir)


GOOD_URLS = ["postgresql://", "postgresql://localhost", "postgres://localhost:5433/mydb", "postgresql://u@h",
             "postgresql://u:se%40cr%2Fet@h/db", "postgresql://u:a?b#c@h/db", "postgresql://u:pa:ss@h/db?sslmode=require",
             "postgresql://h1:123,h2:456/db?target_session_attrs=any&application_name=app",
             "postgresql:///db?host=/var/run/postgresql", "postgresql://%2Fvar%2Frun%2Fpostgresql/db",
             "postgresql://[2001:db8::1234]:5432/db", "postgresql://[fe80::1%25eth0]/db", "postgresql://h/db?ssl=true"]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_every_url_libpq_reads_as_written_still_parses(url):
    """The strict reading refuses only what libpq would misread: every form in libpq's documentation parses,
    to the same user, password and database, and is shown without the password."""
    from synapolis import pgurl

    psycopg = pytest.importorskip("psycopg")
    libpq = psycopg.conninfo.conninfo_to_dict(url)
    parts = pgurl.parse(url)
    assert (parts["user"], parts["password"], parts["dbname"]) == \
        (libpq.get("user"), libpq.get("password"), libpq.get("dbname"))
    shown = pgurl.describe(url)
    assert shown.startswith("postgresql://") and "(a URL that does not parse)" not in shown
    if parts["password"]:
        assert parts["password"] not in shown and "%40cr" not in shown


@pytest.mark.postgres
def test_the_dashboard_a_browser_renders_never_shows_the_password(shapes, served, browser):
    """The page as headless Chromium renders it (its DOM, after it fetched its data) with the store broken in
    each way: signed in first while the store is fine, then the URL changed under it."""
    page = dashboard_page(browser, served, served.token("ops"))
    for shape in ("at-in-password", "unclosed-ipv6", "wrong-password"):
        set_store(served.state_dir, shapes[shape])
        with page.expect_response(lambda r: r.url.endswith("/api/dashboard"), timeout=30_000):
            page.reload()
        page.wait_for_timeout(300)  # the page renders what it fetched
        hidden(page.content(), f"the dashboard's page ({shape})")
