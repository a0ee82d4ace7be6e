#!/usr/bin/env python3
"""synapolis side by side with MCP Agent Mail (PyPI `mcp-agent-mail`), both over stdio, one SDK client.

Agent Mail runs from its own virtualenv (`--agent-mail-python`, default /tmp/agentmail-venv/bin/python;
make it with `python3.13 -m venv /tmp/agentmail-venv && /tmp/agentmail-venv/bin/pip install mcp-agent-mail`),
its server built by `mcp_agent_mail.app.build_mcp_server()` on stdio, with its SQLite database and its Git
archive in a temporary folder. synapolis runs `synapolis mcp`. The same client (this interpreter's `mcp`
SDK, `mcp.Client` on `stdio_client`) drives both. Measured:
- send: p50 of `--sends` messages from one agent to another (`send_message` / `signal`);
- N concurrent senders: N server processes, each one agent sending `--each` messages at once; how many
  were stored, and the wall time;
- fetch of a backlog of 100 / 10,000 / 100,000 messages stored directly in each one's database (Agent
  Mail's `messages` + `message_recipients` rows; synapolis's `signals` through its store): Agent Mail's
  `fetch_inbox(limit=N, include_bodies=True)` in one answer, synapolis paging `read_signals` through all N.
Skipped with a reason in RESULTS.md when Agent Mail's interpreter is missing. Writes its section.

    python benchmarks/bench_agent_mail.py [--sends 30] [--senders 8 32] [--each 10] [--fetch 100 10000 100000]
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from _common import bench_env, bench_parser, machine, publish, synapolis_cmd

import anyio  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

SECTION = "bench_agent_mail"
LAUNCH = "from mcp_agent_mail.app import build_mcp_server; build_mcp_server().run('stdio')"


class AgentMail:
    def __init__(self, python: str, root: Path):
        self.python, self.root = python, root
        self.project = str(root / "project")
        # its tool log and rich console write to stdout, into the stdio stream: off, or the client skips lines
        self.env = {"DATABASE_URL": f"sqlite+aiosqlite:///{root / 'am.sqlite3'}", "STORAGE_ROOT": str(root / "archive"),
                    "HOME": str(root), "PATH": "/usr/bin:/bin", "TOOLS_LOG_ENABLED": "false",
                    "LOG_RICH_ENABLED": "false"}

    def client(self):
        params = StdioServerParameters(command=self.python, args=["-c", LAUNCH], env=self.env, cwd=str(self.root))
        return Client(stdio_client(params, errlog=open(os.devnull, "w")), mode="legacy")

    async def setup(self, client, names):
        for name in names:
            await ok(client, "register_agent", project_key=self.project, program="bench", model="m", name=name)

    async def send(self, client, sender, to, text):
        await ok(client, "send_message", project_key=self.project, sender_name=sender, to=[to], subject="bench",
                 body_md=text)

    async def fetch_all(self, client, agent, count) -> int:
        result = await ok(client, "fetch_inbox", project_key=self.project, agent_name=agent, limit=count,
                          include_bodies=True)
        return len(json.loads(result.content[0].text))

    def stored(self) -> int:
        with sqlite3.connect(self.root / "am.sqlite3") as conn:
            return conn.execute("SELECT count(*) FROM messages").fetchone()[0]

    def backlog(self, sender: str, agent: str, count: int) -> None:
        """`count` messages from `sender` to `agent`, as rows of its own tables (its send writes Git too)."""
        with sqlite3.connect(self.root / "am.sqlite3") as conn:
            ids = dict(conn.execute("SELECT name, id FROM agents").fetchall())
            project = conn.execute("SELECT id FROM projects").fetchone()[0]
            top = conn.execute("SELECT COALESCE(max(id), 0) FROM messages").fetchone()[0]
            now = datetime.now(timezone.utc)
            conn.executemany("INSERT INTO messages (id, project_id, sender_id, thread_id, subject, body_md, importance, "
                             "ack_required, created_ts, attachments) VALUES (?, ?, ?, NULL, ?, ?, 'normal', 0, ?, '[]')",
                             [(top + i + 1, project, ids[sender], "bench", f"backlog message {i}",
                               (now + timedelta(microseconds=i)).strftime("%Y-%m-%d %H:%M:%S.%f"))
                              for i in range(count)])
            conn.executemany("INSERT INTO message_recipients (message_id, agent_id, kind) VALUES (?, ?, 'to')",
                             [(top + i + 1, ids[agent]) for i in range(count)])


class Synapolis:
    def __init__(self, root: Path, env: dict):
        from synapolis import actions
        from synapolis.workspace import Workspace

        self.root, self.env = root, env
        root.mkdir(parents=True, exist_ok=True)
        (root / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 10 ** 6}))
        self.ws = Workspace.open(root)
        self.sid = actions.start(self.ws, agent_id="alice", env={}, write_identity=False)["session_id"]
        actions.start(self.ws, agent_id="bob", session_id=self.sid, env={}, write_identity=False)

    def client(self, agent: str = "alice"):
        cmd = synapolis_cmd()
        params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "--state-dir", str(self.root), "mcp"],
                                       env=dict(self.env, SYNAPOLIS_AGENT_ID=agent, SYNAPOLIS_SESSION_ID=self.sid))
        return Client(stdio_client(params, errlog=sys.stderr), mode="legacy")

    async def setup(self, client, names):
        from synapolis import actions

        for name in names:
            if name not in ("alice", "bob"):
                actions.start(self.ws, agent_id=name, session_id=self.sid, env={}, write_identity=False)

    async def send(self, client, sender, to, text):
        await ok(client, "signal", to=to, content=text, agent_id=sender)

    async def fetch_all(self, client, agent, count) -> int:
        seen, after = 0, None
        while True:
            result = await ok(client, "read_signals", agent_id=agent, **({"after": after} if after else {}))
            page = result.structured_content
            seen += len(page["signals"])
            if page["next_after"] is None:
                return seen
            after = page["next_after"]

    def stored(self) -> int:
        from synapolis.store import open_session

        with open_session(self.ws, self.sid) as store, store.read() as tx:
            return tx.max_sequence()

    def backlog(self, sender: str, agent: str, count: int) -> None:
        from synapolis.signals import signal_id
        from synapolis.store import open_session
        from synapolis.timeutil import format_ts, utcnow

        base = utcnow()
        with open_session(self.ws, self.sid) as store, store.write() as tx:
            for i in range(count):
                stamp = format_ts(base + timedelta(microseconds=i), micro=True)
                text = f"backlog message {i}"
                tx.insert_signal({"id": signal_id(sender, agent, "inform", text, stamp), "timestamp": stamp,
                                  "sender": sender, "recipient": agent, "type": "inform", "content": text,
                                  "lamport": i + 1, "reply_to": None})


async def ok(client, tool, **args):
    result = await client.call_tool(tool, args)
    if result.is_error:
        raise RuntimeError(f"{tool}: {result.content[0].text[:300]}")
    return result


async def sends(system, count: int) -> float:
    async with system.client() as client:
        await system.setup(client, ["alice", "bob"] if isinstance(system, Synapolis) else ["BlueLake", "RedFox"])
        sender, to = ("alice", "bob") if isinstance(system, Synapolis) else ("BlueLake", "RedFox")
        await system.send(client, sender, to, "warm-up")
        times = []
        for i in range(count):
            started = time.perf_counter()
            await system.send(client, sender, to, f"message {i}")
            times.append(time.perf_counter() - started)
    return statistics.median(times)


async def concurrent(system, senders: int, each: int) -> tuple[int, float]:
    names = [f"sender{i}" if isinstance(system, Synapolis) else f"Sender{chr(65 + i // 26)}{chr(65 + i % 26)}"
             for i in range(senders)]
    to = "bob" if isinstance(system, Synapolis) else "RedFox"
    async with system.client() as client:
        await system.setup(client, names + ([] if isinstance(system, Synapolis) else ["RedFox"]))
    before = system.stored()

    async def one(name):
        async with system.client(name) if isinstance(system, Synapolis) else system.client() as client:
            for i in range(each):
                try:
                    await system.send(client, name, to, f"{name} message {i}")
                except Exception:  # noqa: BLE001 - a refused or failed send is counted as not stored
                    pass

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for name in names:
            group.start_soon(one, name)
    return system.stored() - before, time.perf_counter() - started


async def fetch(system, count: int) -> float:
    sender, agent = ("alice", "bob") if isinstance(system, Synapolis) else ("BlueLake", "RedFox")
    system.backlog(sender, agent, count)
    async with system.client(agent) if isinstance(system, Synapolis) else system.client() as client:
        started = time.perf_counter()
        seen = await system.fetch_all(client, agent, count)
        elapsed = time.perf_counter() - started
    if seen < count:
        raise RuntimeError(f"{type(system).__name__} fetched {seen} of {count}")
    return elapsed


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--agent-mail-python", default="/tmp/agentmail-venv/bin/python")
    parser.add_argument("--sends", type=int, default=30)
    parser.add_argument("--senders", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--each", type=int, default=10)
    parser.add_argument("--fetch", type=int, nargs="*", default=[100, 10_000, 100_000])
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="N `python -c 'while 1: pass'` processes for the whole run (a loaded machine)")
    args = parser.parse_args()
    command = (f"`python benchmarks/bench_agent_mail.py --sends {args.sends} --senders "
               f"{' '.join(map(str, args.senders))} --each {args.each} --fetch {' '.join(map(str, args.fetch))}"
               f"{f' --load {args.load}' if args.load else ''}`")
    head = ["## Side by side with MCP Agent Mail (bench_agent_mail.py)", "",
            f"Machine: {machine()}  ", f"Command: {command}  "]
    if not Path(args.agent_mail_python).exists():
        publish(SECTION, "\n".join(head + ["", f"Skipped: no Agent Mail interpreter at {args.agent_mail_python} "
                                                "(see the script's docstring to make one)."]), write=not args.no_write)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-mail-"))
    rows = []
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.load)]
    try:
        env = bench_env(tmp)

        def fresh(kind: str, tag: str):
            root = tmp / f"{kind}-{tag}"
            if kind == "am":
                root.mkdir(parents=True)
                return AgentMail(args.agent_mail_python, root)
            return Synapolis(root, env)

        am_send = anyio.run(sends, fresh("am", "send"), args.sends)
        syn_send = anyio.run(sends, fresh("syn", "send"), args.sends)
        rows.append(f"| send, p50 of {args.sends} | {am_send * 1000:.1f} ms | {syn_send * 1000:.1f} ms |")
        for n in args.senders:
            am_stored, am_wall = anyio.run(concurrent, fresh("am", f"c{n}"), n, args.each)
            syn_stored, syn_wall = anyio.run(concurrent, fresh("syn", f"c{n}"), n, args.each)
            total = n * args.each
            rows.append(f"| {n} concurrent senders x {args.each}: stored, wall | {am_stored} of {total}, "
                        f"{am_wall:.1f} s | {syn_stored} of {total}, {syn_wall:.1f} s |")
        for count in args.fetch:
            am = fresh("am", f"f{count}")
            anyio.run(_register_pair, am)
            am_fetch = anyio.run(fetch, am, count)
            syn_fetch = anyio.run(fetch, fresh("syn", f"f{count}"), count)
            rows.append(f"| fetch a backlog of {count:,} (Agent Mail: one `fetch_inbox`; synapolis: paging "
                        f"`read_signals`) | {am_fetch:.2f} s | {syn_fetch:.2f} s ({syn_fetch / am_fetch:.2f}x) |")
    except Exception as exc:  # noqa: BLE001 - what ran is reported, with why the rest did not
        rows.append(f"| (stopped: {type(exc).__name__}: {str(exc)[:200]}) | | |")
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(head + [f"Agent Mail: `mcp-agent-mail` from PyPI in its own virtualenv ({args.agent_mail_python}); "
                             "both servers over stdio, driven by the same SDK client; load average "
                             f"{os.getloadavg()[0]:.1f} at the end.", "",
                             "| what | MCP Agent Mail | synapolis |", "|---|---|---|", *rows])
    publish(SECTION, text, write=not args.no_write)
    return 0


async def _register_pair(system) -> None:
    async with system.client() as client:
        await system.setup(client, ["BlueLake", "RedFox"])


if __name__ == "__main__":
    sys.exit(main())
