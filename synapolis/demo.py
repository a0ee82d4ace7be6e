"""`synapolis demo`: a small swarm of real agent processes coordinating in a temporary state directory, narrated.

Each agent is its own Python process (`python -m synapolis.demo --worker STATE AGENT`) that acts
through the library and beats in the background, as an agent harness would; the narrator drives
them one step at a time over their stdin and runs the person's commands (`status`, `watchdog`,
`claim-check`) as real CLI processes. One agent is killed with SIGKILL; the demo's thresholds are
seconds instead of minutes, so its death is noticed after a short real wait rather than faked.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .atomic import atomic_write_json, read_jsonl
from .errors import InternalError, SynapolisError
from .paths import CONFIG_NAME

# seconds instead of the default minutes: the dead agent is dead after a short, real wait
DEMO_CONFIG = {"stale_after_s": 2.5, "dead_after_s": 5, "rate_limit_per_min": 600, "claim_ttl_s": 600}
BEAT_EVERY_S = 0.5
STEP_TIMEOUT_S = 30.0
NAMES = ("ada", "grace", "linus", "barbara", "edsger", "frances", "donald", "margaret")


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("SYNAPOLIS_")}


class AgentProcess:
    """One agent: a real process answering one JSON command per line."""

    def __init__(self, state_dir: Path, agent_id: str):
        self.agent_id = agent_id
        self.proc = subprocess.Popen([sys.executable, "-m", "synapolis.demo", "--worker", str(state_dir), agent_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1, env=_clean_env())
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def do(self, op: str, **args) -> dict:
        """Send one command and wait for its answer; SynapolisError (as the worker raised it) on failure."""
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
            line = self.answers.get(timeout=STEP_TIMEOUT_S)
        except (OSError, queue.Empty) as exc:
            raise InternalError(f"demo agent {self.agent_id} did not answer {op!r}: {exc}") from None
        if line is None:
            raise InternalError(f"demo agent {self.agent_id} exited during {op!r}")
        answer = json.loads(line)
        if not answer["ok"]:
            error = SynapolisError(answer["error"]["message"])
            error.type_name, error.exit_code = answer["error"]["type"], answer["error"]["exit_code"]
            raise error
        return answer["result"]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)


def run_demo(keep: bool = False, agents: int = 3, narrate=print, state_dir: Path | None = None) -> dict:
    """Run the scenario; returns what happened. Raises SynapolisError when a step does not go as told."""
    started = time.monotonic()
    root = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="synapolis-demo-"))
    state = root / "state"
    names = list(NAMES[:max(3, min(agents, len(NAMES)))])
    lead, tester, doomed = names[0], names[1], names[2]
    crowd: dict[str, AgentProcess] = {}
    facts: dict = {"agents": names, "killed": doomed}

    def say(text: str) -> None:
        narrate(f"[{time.monotonic() - started:5.1f}s] {text}")

    def cli(*args: str, show: bool = True, ok=(0,)) -> subprocess.CompletedProcess:
        command = ["synapolis", *args]
        if show:
            narrate(f"        $ {' '.join(command)}")
        done = subprocess.run([sys.executable, "-m", "synapolis", "--state-dir", str(state), *args],
                              capture_output=True, text=True, env=_clean_env(), timeout=60)
        if done.returncode not in ok:
            raise InternalError(f"`{' '.join(command)}` exited {done.returncode}: {done.stderr.strip()}")
        if show:
            for line in (done.stdout.rstrip().splitlines() or [done.stderr.strip()]):
                narrate(f"          {line}")
            if done.returncode:
                narrate(f"          (exit {done.returncode})")
        return done

    try:
        state.mkdir(parents=True)
        atomic_write_json(state / CONFIG_NAME, DEMO_CONFIG)
        say(f"A state directory at {state}, with thresholds in seconds for the demo "
            f"(stale after {DEMO_CONFIG['stale_after_s']}s, dead after {DEMO_CONFIG['dead_after_s']}s).")

        say(f"1. {len(names)} agent processes start and join one session; each beats every {BEAT_EVERY_S}s.")
        for name in names:
            crowd[name] = AgentProcess(state, name)
            joined = crowd[name].do("start")
            narrate(f"        {name}: pid {crowd[name].proc.pid}, session {joined['session_id']}")
        facts["session_id"] = joined["session_id"]

        say(f"2. {lead} broadcasts a plan; the others get it piggybacked on their next command.")
        plan = f"plan: {lead} takes src/api/users.py, {tester} the tests, {doomed} the docs"
        sent = crowd[lead].do("signal", to="*", content=plan)
        narrate(f"        {lead} -> *: {plan!r} (live audience: {', '.join(sent['audience']['live'])})")
        for name in names[1:]:
            heard = crowd[name].do("beat", task="reading the plan")["pending_signals"]
            narrate(f"        {name} hears: {', '.join(repr(s['content']) for s in heard) or 'nothing'}")
        question = crowd[tester].do("signal", to=lead, content="which test runner?", type="query")["signal"]
        answer = crowd[lead].do("signal", to=tester, content="pytest, please", reply_to=question["id"])["signal"]
        narrate(f"        {tester} -> {lead}: 'which test runner?' (lamport {question['lamport']}); "
                f"{lead} -> {tester}: 'pytest, please' (lamport {answer['lamport']}, a reply is always later)")

        say("3. They claim their work items, so no two agents edit one file.")
        for name, item in ((lead, "src/api/users.py"), (tester, "tests/test_users.py"), (doomed, "docs/api.md")):
            record = crowd[name].do("claim", item=item)["claim"]
            narrate(f"        {name} holds {item} (fencing token {record['token']})")
        try:
            crowd[tester].do("claim", item="src/api/users.py")
            raise InternalError("a second agent claimed a held item")
        except SynapolisError as exc:
            if exc.exit_code != 3:
                raise
            narrate(f"        {tester} tries src/api/users.py too: refused (exit 3) — {exc.message}")
        crowd[doomed].do("beat", task="writing docs/api.md")

        say(f"4. {doomed} dies mid-task: SIGKILL, no goodbye, its claim still held.")
        crowd[doomed].kill()
        narrate(f"        kill -9 {crowd[doomed].proc.pid}")
        from .status import status_of_agent
        from .timeutil import utcnow
        from .workspace import Workspace

        ws = Workspace.open(state)
        deadline = time.monotonic() + DEMO_CONFIG["dead_after_s"] + 20
        while status_of_agent(ws.paths, doomed, utcnow(), ws.config) != "dead":
            if time.monotonic() > deadline:
                raise InternalError(f"{doomed} never went dead")
            time.sleep(0.2)
        say(f"   Its heartbeat stopped; {DEMO_CONFIG['dead_after_s']}s later it is dead. The person's view:")
        cli("status", "--width", "78")

        say("5. The watchdog (cron runs it hourly) notices: an incident, and the dead agent's claims go free.")
        cli("watchdog")
        incidents = json.loads(cli("escalations", "--json", show=False).stdout)["incidents"]
        facts["incidents"] = [{"agent_id": i["agent_id"], "level": i["level"], "condition": i["condition"]}
                              for i in incidents]
        for incident in incidents:
            narrate(f"        incident {incident['id'][:12]}: {incident['agent_id']} is {incident['condition']} "
                    f"(level {incident['level']})")
        if not any(i["agent_id"] == doomed for i in incidents):
            raise InternalError(f"the watchdog opened no incident for {doomed}")
        warned = crowd[lead].do("pending")["pending_signals"]
        for s in warned:
            narrate(f"        {lead} hears from {s['sender']}: {s['type']} {s['content'][:90]!r}")

        say(f"6. {tester} takes over docs/api.md; the dead holder's old token is refused from now on.")
        taken = crowd[tester].do("claim", item="docs/api.md")["claim"]
        facts["takeover_token"] = taken["token"]
        narrate(f"        {tester} holds docs/api.md with token {taken['token']}"
                + (f" (taken over from {taken['taken_over_from']})" if taken.get("taken_over_from") else ""))
        cli("claim-check", "docs/api.md", "--token", str(taken["token"] - 1), ok=(7,))
        cli("claim-check", "docs/api.md", "--token", str(taken["token"]))

        say("7. Work done: the survivors release their claims, say they are tired, and the last one to do so "
            "consolidates everyone's memories.")
        for name, items in ((lead, ["src/api/users.py"]), (tester, ["tests/test_users.py", "docs/api.md"])):
            for item in items:
                crowd[name].do("release", item=item)
            narrate(f"        {name} releases {', '.join(items)}")
        memories = {lead: ["users.py: validate emails with the shared helper", "Run the tests with pytest"],
                    tester: ["run the tests with   PYTEST", "tests/test_users.py covers signup and login"]}
        outcomes = []
        for name in [n for n in names if n != doomed]:
            done = crowd[name].do("tired", memories=memories.get(name, [f"{name} was here"]))
            outcomes.append(done["outcome"])
            narrate(f"        {name}: {done['outcome']} (active others {done['active_others']}, staged "
                    f"{done['staged']}, ledger lines written {done['merged']})")
        facts["outcomes"] = outcomes
        if outcomes[-1] != "consolidated":
            raise InternalError("the last agent did not consolidate")
        ledger = state / "memory" / "ledger.jsonl"
        lines = read_jsonl(ledger)
        facts["ledger_lines"] = len(lines)
        for entry in lines:
            narrate(f"        ledger: {entry.get('text')!r} from {', '.join(entry.get('sources') or [])}")

        say("The end state:")
        cli("status", "--width", "78")
    finally:
        for agent in crowd.values():
            agent.close()
        if not keep and not state_dir:
            shutil.rmtree(root, ignore_errors=True)
    facts["seconds"] = round(time.monotonic() - started, 1)
    if keep or state_dir:
        facts["state_dir"] = str(state)
        narrate(f"State directory kept: {state}  (try: synapolis --state-dir {state} status)")
    say(f"Done in {facts['seconds']}s.")
    return facts


# -- the agent process ----------------------------------------------------------------------------------

def _worker(state_dir: str, agent_id: str) -> int:
    from . import actions, sleep
    from .identity import Who
    from .workspace import Workspace

    ws = Workspace.open(state_dir)
    who = Who(agent_id)
    stop_beating = threading.Event()
    beater = threading.Thread(target=lambda: beat_forever(), daemon=True)

    def beat_forever():
        while not stop_beating.wait(BEAT_EVERY_S):
            try:
                actions.beat(ws, who, env={}, piggyback=False)
            except SynapolisError:
                pass  # a busy store now and then: the next beat comes soon

    ops = {
        "start": lambda a: actions.start(ws, agent_id=agent_id, harness="demo", substrate="demo-model", env={},
                                         write_identity=False),
        "beat": lambda a: actions.beat(ws, who, task=a.get("task"), env={}),
        "signal": lambda a: actions.signal(ws, who, a["to"], a["content"], type=a.get("type", "inform"),
                                           reply_to=a.get("reply_to"), env={}),
        "pending": lambda a: actions.signals_pending(ws, who, env={}),
        "claim": lambda a: actions.claim(ws, who, a["item"], env={}),
        "release": lambda a: actions.release(ws, who, a["item"], env={}),
        "tired": lambda a: sleep.tired(ws, who, memories=a.get("memories"), env={}),
    }
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "exit":
            break
        if op == "tired":
            # a tired agent stops declaring itself active; wait out a beat already under way, or it
            # could land after `tired` and mark the agent active again (the next agent would stand by)
            stop_beating.set()
            if beater.is_alive():
                beater.join(STEP_TIMEOUT_S)
        try:
            result = ops[op](request)
            if op == "start":
                who = Who(agent_id, result["session_id"], result["run_token"])
                if not beater.is_alive():
                    beater.start()
            answer = {"ok": True, "result": result}
        except SynapolisError as exc:
            answer = {"ok": False, "error": exc.to_json()["error"]}
        sys.stdout.write(json.dumps(answer, default=str) + "\n")
        sys.stdout.flush()
    stop_beating.set()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m synapolis.demo --worker STATE_DIR AGENT_ID (run `synapolis demo` instead)")
