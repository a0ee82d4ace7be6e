"""Start-up cost, by what loads: the paths a harness runs on every tool call (beat, signal, read-signals,
claim, release, hook) and --help import none of the heavy libraries, a hook does not import click, and the
hot paths skip the stdlib modules that were measured to cost most (benchmarks/RESULTS.md has the timings).

Real processes under `python -X importtime`, which names every module a run imports; no timing here.
They run with `-S` and the site directories on PYTHONPATH: what a clean virtualenv loads. Site-wide
.pth files (this machine's global interpreter has some) import pathlib and more before synapolis
starts, which would hide what synapolis itself imports.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, configure
from synapolis import actions, claims
from synapolis.atomic import locked
from synapolis.harness.hooks import agent_id_for
from synapolis.identity import Who
from synapolis.workspace import Workspace

# never on these paths (docs/DESIGN.md, start-up cost): each costs tens of milliseconds or more
HEAVY = {"jsonschema", "dateutil", "watchdog", "mcp", "filelock", "asyncio"}
# stdlib modules kept off the hot paths on purpose, each worth a few percent of a bare `import click`:
# pathlib (with urllib.parse and ipaddress: use Workspace.files), OpenSSL behind hashlib/hmac/secrets
# (only where a SHA-256 is due: a signal's id, a run token's hash; names.sha256_hex imports it there),
# ctypes (store.py calls sqlite3_db_config through _ctypes), dataclasses (plain classes instead)
WEIGHTY = {"pathlib", "urllib", "ipaddress", "hashlib", "hmac", "secrets", "ctypes", "dataclasses"}
# what a hook's quiet path does without, on top of those: no store (sqlite3, threading), no click, and no
# datetime (its stamp comes from `time`) or contextlib (atomic's context managers are classes)
QUIET_NEVER = {"sqlite3", "threading", "click", "datetime", "contextlib"}
CONVERSATION = "0f7e6d5c-1111-2222-3333-444455556666"
# this checkout first, then the installed libraries, as plain folders: no .pth file runs
CLEAN_PATH = os.pathsep.join([str(Path(__file__).resolve().parents[1]), *site.getsitepackages()])


def _env(**extra) -> dict:
    env = clean_env()
    env.update(PYTHONPATH=CLEAN_PATH, **extra)
    return env


# what the console script runs (without `-m`, whose runpy imports contextlib and more before synapolis starts)
AS_SCRIPT = ["-c", "from synapolis.cli import main; main()"]


def loaded(*args: str, stdin: str | None = None, env: dict | None = None) -> tuple[set[str], subprocess.CompletedProcess]:
    """Run `python -S -X importtime` on the console script's entry point with ARGS; (top-level names of every
    module it imported, the run)."""
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", *AS_SCRIPT, *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env or _env())
    names = set()
    for line in done.stderr.splitlines():
        fields = line.split("|")
        if line.startswith("import time:") and len(fields) == 3 and fields[1].strip().isdigit():
            names.add(fields[2].strip().split(".")[0])
    assert names, f"no -X importtime output: {done.stderr[-500:]}"
    return names, done


def _stderr(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))


@pytest.fixture
def pair(state_dir):
    """alice and bob registered in one session (through the library: quick, and nothing to measure)."""
    ws = Workspace.open(state_dir).ensure()
    sid = actions.start(ws, agent_id="alice", env={})["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={})
    return ws, sid


def _hook_event(name: str, **fields) -> str:
    return json.dumps({"session_id": CONVERSATION, "hook_event_name": name, "cwd": "/nonexistent", **fields})


# -- beat, signal, read-signals ----------------------------------------------------------------------

@pytest.mark.parametrize("verb", [
    ["beat", "--task", "startup test"],
    ["signal", "bob", "hello from a test"],
    ["read-signals", "--all"],
    ["signals-pending"],
    ["ack-signals", "--all"],
    ["note", "a note from a test"],
], ids=lambda verb: verb[0])
def test_agent_verbs_load_nothing_heavy(pair, state_dir, verb):
    _ws, sid = pair
    names, done = loaded("--state-dir", str(state_dir), *verb, "--agent-id", "alice", "--session-id", sid, "--json")
    assert done.returncode == 0, _stderr(done)
    json.loads(done.stdout)  # a real answer, not an error that stopped early
    assert not names & HEAVY, sorted(names & HEAVY)
    # a signal's id is a SHA-256 (contract §7), through hashlib; no other hot verb without a token hashes
    assert not names & (WEIGHTY - {"hashlib"}), sorted(names & WEIGHTY)
    assert ("hashlib" in names) == (verb[0] == "signal")
    assert "threading" not in names  # the store's lock is a _thread.RLock (threading is ~1 ms)
    assert "click" not in names  # the plain form of a hot verb never needs it (synapolis.cli.fast)
    # the store's transactions, as_agent and the notes appender are classes (contextlib is ~3 M instructions)
    assert "contextlib" not in names
    # what only one verb runs is imported where it runs: liveness for a send's audience, the board for a note
    modules = _modules(done)
    assert ("synapolis.status" in modules) == (verb[0] == "signal")
    assert ("synapolis.board" in modules) == (verb[0] == "note")
    assert "sqlite3" in names  # the control: importtime saw the whole run


def test_a_beat_with_a_run_token_and_no_session_named_stays_light(pair, state_dir):
    """Identity from the environment (as `eval "$(synapolis start --export)"` sets it): the search for the
    agent's session loads no pathlib; the token's SHA-256 is checked through hashlib (the one weighty module due)."""
    ws, _sid = pair
    token = json.loads(open(ws.files.identity, encoding="utf-8").read())["run_token"]  # bob's, written last
    names, done = loaded("--state-dir", str(state_dir), "beat", env=_env(SYNAPOLIS_AGENT_ID="bob",
                                                                        SYNAPOLIS_RUN_TOKEN=token))
    assert done.returncode == 0, _stderr(done)
    assert "hashlib" in names  # the control: the token was hashed and checked
    assert not names & (HEAVY | WEIGHTY - {"hashlib"}), sorted(names & (HEAVY | WEIGHTY))


def test_a_first_beat_into_a_fresh_state_dir_stays_light(tmp_path):
    names, done = loaded("--state-dir", str(tmp_path / "fresh"), "beat", "--agent-id", "newcomer")
    assert done.returncode == 0, _stderr(done)
    assert (tmp_path / "fresh" / "heartbeats" / "newcomer.json").is_file()
    assert not names & (HEAVY | WEIGHTY), sorted(names & (HEAVY | WEIGHTY))


# what the collector looks like once everything else at exit has run: this handler is registered before main()
_GC_AT_EXIT = ("import atexit, gc, sys; atexit.register(lambda: sys.stderr.write("
               "f'GC enabled={gc.isenabled()} frozen={gc.get_freeze_count()}\\n')); "
               "from synapolis.cli import main; main()")


def _gc_at_exit(*args: str, stdin: str | None = None) -> tuple[str, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-S", "-c", _GC_AT_EXIT, *args], input=stdin, capture_output=True,
                          text=True, timeout=60, env=_env())
    lines = [line for line in done.stderr.splitlines() if line.startswith("GC ")]
    assert lines, done.stderr[-500:]
    return lines[-1], done


def test_a_one_call_process_runs_without_the_cyclic_collector(pair, state_dir):
    """A hot verb and a hook end with the process: no cyclic collection while they run and none over the
    heap at exit (cli.one_call: gc.disable, gc.freeze in atexit), and still every atexit handler runs and
    the answer is whole. Anything through click (servers, --watch) keeps the collector."""
    _ws, sid = pair
    state, done = _gc_at_exit("--state-dir", str(state_dir), "beat", "--agent-id", "alice", "--session-id", sid,
                              "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["heartbeat"]["agent_id"] == "alice", done.stderr
    assert state.startswith("GC enabled=False frozen=") and not state.endswith("frozen=0"), state
    state, done = _gc_at_exit("--state-dir", str(state_dir), "hook", "claude-code", stdin=_hook_event("Stop"))
    assert done.returncode == 0 and json.loads(done.stdout) == {}, done.stderr
    assert state.startswith("GC enabled=False frozen=") and not state.endswith("frozen=0"), state

    state, done = _gc_at_exit("--state-dir", str(state_dir), "list-agents", "--session-id", sid, "--json")
    assert done.returncode == 0 and {"alice", "bob"} <= {a["id"] for a in json.loads(done.stdout)["agents"]}
    assert state == "GC enabled=True frozen=0", state


# -- claims -----------------------------------------------------------------------------------------

# the claim verb's own modules: claims.py split by idea (issue 34) into the API, its operations, the `with`
# lease and the pure rules (synapolis.rules itself a beat loads already: the signal rules), and the claim files
# they keep through the store (issue 34)
CLAIM_MODULES = {"synapolis.claims", "synapolis.claim_ops", "synapolis.claim_lease", "synapolis.rules.claims",
                 "synapolis.store.local.claims", "synapolis.store.claim_keys"}


def test_claim_verbs_load_nothing_heavy(pair, state_dir):
    """claim, a renewal, claim-check and release, uncontended: the item's lock is atomic.locked's try, so no
    filelock (it only waits for another holder); no click (cli.fast); no hashlib (only an item name too long
    for a file name is hashed); no threading (the renewal thread is the context manager's, not the CLI's)."""
    ws, sid = pair
    me = ("--agent-id", "alice", "--session-id", sid)
    _names, done = loaded("--state-dir", str(state_dir), "beat", *me)
    assert done.returncode == 0, _stderr(done)
    beat_modules = _modules(done)
    for verb, expect in ((["claim", "src/api.py", *me], "claimed"), (["claim", "src/api.py", *me], "renewed"),
                         (["claim-check", "src/api.py", "--token", "1"], None),
                         (["release", "src/api.py", *me], "released")):
        names, done = loaded("--state-dir", str(state_dir), *verb, "--json")
        assert done.returncode == 0, _stderr(done)
        answer = json.loads(done.stdout)  # a real answer, not an error that stopped early
        assert answer["claim"]["token"] == 1 and answer.get("event") == expect, answer
        assert not names & (HEAVY | WEIGHTY | {"click", "threading"}), sorted(names & (HEAVY | WEIGHTY))
        # a claim loads what a beat loads and its own module: no contextlib (the lock and the slot are
        # classes), no status (asked only when a claim meets another's lease), no random (--wait's jitter);
        # a path item (contract §14) also its index, its pattern rules and the project's root
        path_modules = {"synapolis.claim_index", "synapolis.pathpatterns", "synapolis.project",
                        "synapolis.store.local.claim_index"}
        assert _modules(done) - beat_modules <= CLAIM_MODULES | path_modules, \
            sorted(_modules(done) - beat_modules)
    assert json.loads((ws.paths.claims / "src%2Fapi.py.json").read_text())["released_by"] == "alice"
    # a name's claim loads none of the path machinery: as cheap as before path patterns
    names, done = loaded("--state-dir", str(state_dir), "claim", "ticket:142", *me, "--json")
    assert done.returncode == 0, _stderr(done)
    assert _modules(done) - beat_modules == CLAIM_MODULES, sorted(_modules(done) - beat_modules)

    # the controls: a name past 180 characters is hashed (hashlib loads), and a held lock is waited for
    # through filelock, which the run then loads
    names, done = loaded("--state-dir", str(state_dir), "claim", "x" * 200, *me)
    assert done.returncode == 0 and "hashlib" in names and "filelock" not in names, _stderr(done)
    configure(ws, busy_timeout_ms=300)
    with locked(claims._lock_file(ws, "src/api.py"), blocking=False) as mine:
        assert mine
        names, done = loaded("--state-dir", str(state_dir), "claim", "src/api.py", *me)
    assert done.returncode == 8 and "BusyError" in _stderr(done)
    assert "filelock" in names and "click" not in names

    # and a claim that meets another's live lease asks the monitor's rules (status) about its holder
    names, done = loaded("--state-dir", str(state_dir), "claim", "src/api.py", *me)
    assert done.returncode == 0, _stderr(done)
    names, done = loaded("--state-dir", str(state_dir), "claim", "src/api.py", "--agent-id", "bob",
                         "--session-id", sid)
    assert done.returncode == 3 and "held by alice" in _stderr(done)
    assert "synapolis.status" in _modules(done)


# -- hooks ------------------------------------------------------------------------------------------

def test_hook_calls_load_neither_click_nor_anything_heavy(pair, state_dir):
    ws, _sid = pair
    args = ("--state-dir", str(state_dir), "hook", "claude-code")
    names, done = loaded(*args, stdin=_hook_event("SessionStart", source="startup"))
    assert done.returncode == 0 and "additionalContext" in done.stdout, _stderr(done)
    assert not names & (HEAVY | {"click"}), sorted(names & (HEAVY | {"click"}))

    me = agent_id_for("claude-code", CONVERSATION, env={})
    actions.signal(ws, Who("alice"), me, "review src/api.py please", env={})
    names, done = loaded(*args, stdin=_hook_event("PostToolUse", tool_name="Bash", tool_input={"command": "ls"}))
    assert done.returncode == 0 and "review src/api.py please" in done.stdout, _stderr(done)
    # a delivering hook proves its run token (a SHA-256, through hashlib), and loads nothing else weighty
    assert not names & (HEAVY | WEIGHTY - {"hashlib"} | {"click"}), sorted(names & (HEAVY | WEIGHTY | {"click"}))

    names, done = loaded(*args, stdin=_hook_event("Stop"))
    assert done.returncode == 0 and json.loads(done.stdout) == {}, _stderr(done)
    # a delivering hook proves its run token (a SHA-256, through hashlib), and loads nothing else weighty
    assert not names & (HEAVY | WEIGHTY - {"hashlib"} | {"click"}), sorted(names & (HEAVY | WEIGHTY | {"click"}))


def _modules(done: subprocess.CompletedProcess) -> set[str]:
    """Every module (full dotted name) a run under -X importtime imported."""
    return {line.split("|")[2].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2 and line.split("|")[1].strip().isdigit()}


def test_a_hook_with_nothing_new_loads_no_store(pair, state_dir):
    """The quiet path (harness.quiet): nothing sent since the last drain, so neither sqlite3, the store,
    the verbs, `threading` (the hook's timer is a `_thread`), datetime nor contextlib are imported. The
    control: after a send, the same event takes the full path and does open the store."""
    ws, _sid = pair
    args = ("--state-dir", str(state_dir), "hook", "claude-code")
    tool = _hook_event("PostToolUse", tool_name="Bash", tool_input={"command": "ls"})
    _names, done = loaded(*args, stdin=_hook_event("SessionStart", source="startup"))
    assert done.returncode == 0 and "additionalContext" in done.stdout, _stderr(done)
    names, done = loaded(*args, stdin=tool)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and _stderr(done) == ""
    modules = _modules(done)
    assert not names & (QUIET_NEVER | WEIGHTY), sorted(names & (QUIET_NEVER | WEIGHTY))
    assert not {m for m in modules if m.startswith(("synapolis.store", "synapolis.actions", "synapolis.agent_call",
                                                    "synapolis.signals", "synapolis.sessions"))}
    assert "synapolis.harness.quiet" in modules and "synapolis.heartbeat" in modules  # it did refresh

    actions.signal(ws, Who("alice"), agent_id_for("claude-code", CONVERSATION, env={}), "news", env={})
    names, done = loaded(*args, stdin=tool)
    assert done.returncode == 0 and "news" in done.stdout, _stderr(done)
    assert "sqlite3" in names  # the full path: the store and the drain
    assert "threading" not in names  # its lock is a _thread.RLock


def test_a_pre_tool_event_with_nothing_held_loads_no_store(pair, state_dir, tmp_path):
    """The guard's quiet path (harness.pretool.nothing_held): an edit while no path claim is held is let
    through from the claims index alone: no store, no claims code, no datetime. The control: with a claim
    held, the same event takes the full path (and is refused)."""
    from synapolis import claim_index
    from synapolis.harness import pretool

    assert pretool.INDEX_FILE == claim_index.INDEX_FILE
    ws, _sid = pair
    claims.claim(ws, "src/held.py", "alice")
    claims.release(ws, "src/held.py", "alice")  # the index exists, and is empty again
    args = ("--state-dir", str(state_dir), "hook", "claude-code")
    edit = _hook_event("PreToolUse", tool_name="Edit", cwd=str(tmp_path),
                       tool_input={"file_path": str(tmp_path / "src" / "held.py"), "old_string": "a", "new_string": "b"})
    names, done = loaded(*args, stdin=edit)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and _stderr(done) == ""
    assert not names & (QUIET_NEVER | WEIGHTY), sorted(names & (QUIET_NEVER | WEIGHTY))
    assert not {m for m in _modules(done) if m.startswith(("synapolis.store", "synapolis.claim", "synapolis.guard",
                                                           "synapolis.pathpatterns", "synapolis.status"))}
    claims.claim(ws, "src/held.py", "alice")
    names, done = loaded(*args, stdin=edit)
    assert done.returncode == 0, _stderr(done)
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_hook_without_click_keeps_the_contract(state_dir):
    """The click-free path: garbage in is exit 0 with `{}` and a line on stderr; `--state-dir=DIR` and
    $SYNAPOLIS_STATE_DIR both name the state directory."""
    names, done = loaded("--state-dir", str(state_dir), "hook", "claude-code", stdin="{not json")
    assert done.returncode == 0 and json.loads(done.stdout) == {}
    assert "not JSON" in _stderr(done) and "Traceback" not in done.stderr
    assert "click" not in names

    names, done = loaded(f"--state-dir={state_dir}", "hook", "gemini-cli", stdin=_hook_event("SessionStart"))
    assert done.returncode == 0 and "additionalContext" in done.stdout and "click" not in names, _stderr(done)
    names, done = loaded("hook", "codex", stdin=_hook_event("SessionStart"), env=_env(SYNAPOLIS_STATE_DIR=str(state_dir)))
    assert done.returncode == 0 and "click" not in names, _stderr(done)
    # one conversation state per harness, same state dir, and each one's index entry (harness.quiet)
    assert len([n for n in os.listdir(state_dir / "hooks") if n.endswith(".json")]) == 2
    assert len(os.listdir(state_dir / "hooks" / "conversations")) == 2

    names, done = loaded("hook", "no-such-harness", stdin=_hook_event("Stop"), env=_env(SYNAPOLIS_STATE_DIR=str(state_dir)))
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "unknown harness" in _stderr(done)


def test_hook_spellings_click_parses_behave_the_same(pair, state_dir):
    """Anything but the plain `[--state-dir DIR] hook HARNESS` goes through click, to the same handler."""
    names, done = loaded("--state-dir", str(state_dir), "hook", "--", "claude-code", stdin=_hook_event("Stop"))
    assert done.returncode == 0 and json.loads(done.stdout) == {}, _stderr(done)
    assert "click" in names  # it did take the other road
    assert not names & HEAVY

    _names, done = loaded("--state-dir", str(state_dir), "hook")
    assert done.returncode == 2 and "Missing argument 'HARNESS'" in _stderr(done)
    _names, done = loaded("--state-dir", str(state_dir), "hook", "claude-code", "extra")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    _names, done = loaded("hook", "--help")
    assert done.returncode == 0 and "Example:" in done.stdout


# -- help -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["beat", "--help"], ["signal", "--help"], ["hook", "--help"]],
                         ids=" ".join)
def test_help_loads_nothing_heavy(args):
    names, done = loaded(*args)
    assert done.returncode == 0 and "Usage:" in done.stdout, _stderr(done)
    assert not names & HEAVY, sorted(names & HEAVY)
