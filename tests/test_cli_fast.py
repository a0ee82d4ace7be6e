"""The hot verbs' click-free path (synapolis.cli.fast) answers exactly as click's does: the same stdout,
stderr and exit code for the same call on the same state, and anything it does not parse itself (help,
typos, bad values) goes to click. Each call runs twice, as real processes on two identical copies of one
state directory: once through `python -m synapolis` (which takes the fast path when it can), once
through click's own entry point."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from synapolis import actions
from synapolis.cli import fast
from synapolis.identity import Who
from synapolis.workspace import Workspace

from conftest import clean_env

CLICK = "import sys; from synapolis.cli import _click_main; _click_main(sys.argv[1:])"
# what differs between two runs of one call: the clock (timestamps and what is derived from them)
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_HEX = re.compile(r"\b[0-9a-f]{12}(?:[0-9a-f]{52})?\b")
_PID = re.compile(r'"pid": \d+')
_AGE = re.compile(r"\b(?:\d+[smhd] ago|in \d+[smhd])\b")  # "0s ago" in one run is "1s ago" in the next


def _norm(text: str) -> str:
    return _AGE.sub("<age>", _PID.sub('"pid": 0', _HEX.sub("<id>", _STAMP.sub("<at>", text))))


@pytest.fixture
def twins(tmp_path):
    """Two identical state directories with alice and bob in one session, two signals and a note for bob."""
    first = tmp_path / "fast"
    ws = Workspace.open(first).ensure()
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, write_identity=False)
    for text in ("one", "two \x1b[2J"):
        actions.signal(ws, Who("alice", sid), "bob", text, env={})
    actions.note(ws, Who("alice", sid), "a note", env={})
    shutil.copytree(first, tmp_path / "click")
    return tmp_path / "fast", tmp_path / "click"


def both(twins, *args, stdin=None):
    """(fast run, click run) of `synapolis --state-dir <twin> ARGS`."""
    runs = []
    for state, cmd in zip(twins, ([sys.executable, "-m", "synapolis"], [sys.executable, "-c", CLICK])):
        runs.append(subprocess.run([*cmd, "--state-dir", str(state), *map(str, args)], input=stdin,
                                   capture_output=True, text=True, timeout=60, env=clean_env()))
    return runs


SAME = [
    ["beat", "--agent-id", "bob", "--task", "t", "--json"],
    ["beat", "--agent-id", "bob", "--status=idle", "--ttl", "90", "--note", "n"],
    ["beat", "--agent-id", "nobody"],
    ["beat", "--agent-id", "bob", "--run-token", "wrong", "--json"],
    ["beat", "--agent-id", "bob", "--status", "bad"],
    ["beat", "--agent-id", "bob", "--ttl", "soon", "--json"],
    ["beat", "--agent-id"],
    ["beat", "--help"],
    ["signal", "bob", "hello", "--agent-id", "alice", "--type", "query", "--json"],
    ["signal", "--agent-id", "alice", "bob", "hello"],
    ["signal", "nobody", "x", "--agent-id", "alice"],
    ["signal", "nobody", "x", "--agent-id", "alice", "--json"],
    ["signal", "bob", "--agent-id", "alice"],
    ["signal", "bob", "-5", "--agent-id", "alice"],
    ["signal", "bob", "x", "--agent-id", "alice", "--sender-id", "carol"],
    ["read-signals", "--agent-id", "bob"],
    ["read-signals", "--agent-id", "bob", "--all", "--limit", "1", "--json"],
    ["read-signals", "--agent-id", "bob", "--after", "0", "--limit", "1"],
    ["read-signals", "--agent-id", "bob", "--after", "-1"],
    ["read-signals", "--agent-id", "bob", "--limit", "0", "--json"],
    ["read-signals", "--agent-id", "bob", "--all", "--unread-only"],
    ["signals-pending", "--agent-id", "bob", "--limit", "1"],
    ["signals-pending", "--agent-id", "bob", "--no-piggyback", "--json"],
    ["ack-signals", "--agent-id", "bob", "--all", "--json"],
    ["ack-signals", "--agent-id", "bob"],
    ["ack-signals", "0000000000", "--agent-id", "bob", "--json"],
    ["note", "hello there", "--agent-id", "bob"],
    ["note", "--agent-id", "bob", "--json"],
    ["note", "x", "--agent-id", "bob", "--agent-id", "alice"],
]


def _same_answer(quick, slow) -> None:
    """The fast path's run and click's: the same exit code, stdout and stderr (timestamps and ids aside), no
    traceback on either."""
    assert quick.returncode == slow.returncode, (quick.stderr, slow.stderr)
    assert _norm(quick.stdout) == _norm(slow.stdout)
    assert _norm(quick.stderr) == _norm(slow.stderr)
    assert "Traceback" not in quick.stderr + slow.stderr


@pytest.mark.parametrize("args", SAME, ids=" ".join)
def test_fast_and_click_give_the_same_answer(twins, args):
    _same_answer(*both(twins, *args))


def test_content_from_stdin_is_the_same_both_ways(twins):
    quick, slow = both(twins, "signal", "bob", "-", "--agent-id", "alice", "--json", stdin="from stdin\n")
    assert quick.returncode == slow.returncode == 0
    assert _norm(quick.stdout) == _norm(slow.stdout) and '"content": "from stdin"' in quick.stdout
    quick, slow = both(twins, "note", "-", "--agent-id", "alice", stdin=b"\xff".decode("latin-1"))
    assert quick.returncode == slow.returncode


def test_parse_takes_only_the_plain_forms():
    assert fast.parse(["beat", "--agent-id", "a"]) == (None, "beat", {"agent_id": "a"})
    assert fast.parse(["--state-dir=/x", "read-signals", "--all", "--limit=3"]) == \
        ("/x", "read-signals", {"mode": "all", "limit": 3})
    assert fast.parse(["signal", "b", "-", "--type", "ack"]) == \
        (None, "signal", {"to": "b", "content": "-", "type_": "ack"})
    for args in (["beat", "--help"], ["beat", "-h"], ["beat", "--status", "nope"], ["beat", "--ttl"],
                 ["signal", "b"], ["signal", "b", "c", "d"], ["signal", "b", "--", "-x"], ["monitor"],
                 ["read-signals", "--follow"], ["beat", "--json=1"], ["beat", "--task", "a", "--task", "b"],
                 ["--state-dir", "", "beat"], ["--version"], []):
        assert fast.parse(args) is None, args


# -- the claim verbs (contract §9): an agent claims, renews and releases around its edits -----------------

@pytest.fixture
def claim_twins(tmp_path):
    """Two identical state directories: alice holds src/held.py (token 1), src/done.py was claimed and
    released by alice, and bob has an unread signal (a claim's answer carries it)."""
    first = tmp_path / "fast"
    ws = Workspace.open(first).ensure()
    sid = actions.start(ws, agent_id="alice", env={}, write_identity=False)["session_id"]
    actions.start(ws, agent_id="bob", session_id=sid, env={}, write_identity=False)
    actions.claim(ws, Who("alice", sid), "src/held.py", env={})
    actions.claim(ws, Who("alice", sid), "src/done.py", env={})
    actions.release(ws, Who("alice", sid), "src/done.py", env={})
    actions.signal(ws, Who("alice", sid), "bob", "src/held.py is mine", env={})
    shutil.copytree(first, tmp_path / "click")
    return tmp_path / "fast", tmp_path / "click"


CLAIM_SAME = [
    ["claim", "src/a.py", "--agent-id", "bob"],
    ["claim", "src/a.py", "--agent-id", "bob", "--ttl", "60", "--wait=0", "--json"],
    ["claim", "--agent-id", "bob", "--no-piggyback", "src/a.py", "--ttl=1e3"],
    ["claim", "src/held.py", "--agent-id", "alice", "--json"],  # a renewal: same token
    ["claim", "src/held.py", "--agent-id", "bob"],  # held by a live other: exit 3
    ["claim", "src/held.py", "--agent-id", "bob", "--wait", "0.2", "--json"],
    ["claim", "src/done.py", "--agent-id", "bob", "--json"],  # released before: token 2
    ["claim", "src/a.py", "--agent-id", "bob", "--ttl", "0"],
    ["claim", "src/a.py", "--agent-id", "bob", "--ttl", "nan", "--json"],
    ["claim", "src/a.py", "--agent-id", "bob", "--wait", "-1"],
    ["claim", "src/a.py", "--agent-id", "bob", "--ttl", "soon"],
    ["claim", "src/a.py", "--agent-id", "bob", "--ttl"],
    ["claim", "src/a.py", "--agent-id", "bob", "--force"],
    ["claim", "src/a.py", "src/b.py", "--agent-id", "bob"],
    ["claim", "--agent-id", "bob"],
    ["claim", "../etc/passwd", "--agent-id", "bob", "--json"],
    ["claim", "src/a.py", "--agent-id", "no body"],
    ["claim", "src/a.py", "--agent-id", "bob", "--run-token", "wrong", "--json"],
    ["claim", "src/a.py", "--ttl", "5", "--ttl", "6", "--agent-id", "bob"],
    ["claim", "--help"],
    ["release", "src/held.py", "--agent-id", "alice"],
    ["release", "src/held.py", "--agent-id", "alice", "--json"],
    ["release", "src/held.py", "--agent-id", "bob"],  # another's claim: exit 7
    ["release", "src/held.py", "--agent-id", "bob", "--force"],  # without a reason: exit 2
    ["release", "src/held.py", "--agent-id", "bob", "--force", "--reason", "alice is on leave", "--json"],
    ["release", "src/held.py", "--agent-id", "bob", "--force", "--reason=  "],
    ["release", "src/done.py", "--agent-id", "alice"],  # already released: nothing changes
    ["release", "never:claimed", "--agent-id", "bob", "--json"],
    ["release", "src/held.py", "--agent-id", "alice", "--force=yes"],
    ["release", "src/held.py", "--agent-id", "alice", "--reason", "a", "--reason", "b"],
    ["release", "--help"],
    ["claim-check", "src/held.py", "--token", "1"],
    ["claim-check", "src/held.py", "--token=1", "--json"],
    ["claim-check", "src/held.py", "--token", "2", "--json"],  # stale: exit 7
    ["claim-check", "src/done.py", "--token", "1"],
    ["claim-check", "never:claimed", "--token", "1", "--json"],  # exit 6
    ["claim-check", "src/held.py"],  # --token is required: click's message
    ["claim-check", "src/held.py", "--token", "one"],
    ["claim-check", "src/held.py", "--token", "1", "--agent-id", "bob"],  # acts as nobody: no such option
    ["claim-check", "src/held.py", "--token", "1", "--no-piggyback"],
    ["claim-check", "--token", "1"],
]


@pytest.mark.parametrize("args", CLAIM_SAME, ids=" ".join)
def test_claim_verbs_give_the_same_answer_both_ways(claim_twins, args):
    _same_answer(*both(claim_twins, *args))
    # what each left on disk is the same too: the claim file of the item (or its absence)
    for name in ("src%2Fheld.py.json", "src%2Fa.py.json", "src%2Fdone.py.json"):
        fast_doc, click_doc = [_norm(path.read_text()) if path.exists() else None
                               for path in (state / "claims" / name for state in claim_twins)]
        assert fast_doc == click_doc, name


def test_the_claim_verbs_take_the_fast_path(claim_twins):
    """The plain forms parse without click; the control: what parse leaves to click does go there."""
    assert fast.parse(["claim", "t:1", "--agent-id", "a", "--ttl", "60"]) == \
        (None, "claim", {"item": "t:1", "agent_id": "a", "ttl": 60.0})
    assert fast.parse(["--state-dir", "/s", "release", "t:1", "--force", "--reason=why", "--json"]) == \
        ("/s", "release", {"item": "t:1", "force": True, "reason": "why", "as_json": True})
    assert fast.parse(["claim-check", "t:1", "--token", "4"]) == (None, "claim-check", {"item": "t:1", "token": 4})
    for args in (["claim"], ["claim", "t:1", "--wait"], ["claim", "t:1", "--wait", "x"], ["claim", "t:1", "-h"],
                 ["release", "t:1", "--force=1"], ["claim-check", "t:1"], ["claim-check", "t:1", "--token", "1.5"],
                 ["claim-check", "t:1", "--token", "1", "--agent-id", "a"], ["claims"], ["claim", "t:1", "--", "x"]):
        assert fast.parse(args) is None, args
