"""A hook's answer stays under the harness's cap as the harness receives it: the printed, JSON-escaped answer,
whatever the signals hold (issue 30 item 6: 4,500 control characters are 27,000 once escaped)."""

from __future__ import annotations

import json
import subprocess

import pytest

from synapolis import actions
from synapolis.harness import hooks
from synapolis.identity import Who
from synapolis.workspace import Workspace

from conftest import clean_env, synapolis_cmd

CONV = "0e1d2c3b-1111-2222-3333-444455556666"
START = {"claude-code": "SessionStart", "gemini-cli": "SessionStart", "codex": "SessionStart"}
DELIVER = {"claude-code": "PostToolUse", "gemini-cli": "AfterTool", "codex": "PostToolUse"}

# each fits one answer of every harness escaped (so each must be shown in time), and costs far more escaped
# than parsed
NASTY = {
    "control characters": "".join(chr(1 + i % 31) for i in range(1200)),  # 6 characters each once escaped
    "quotes and backslashes": '"\\' * 1500,
    "emoji": "\U0001F600\U0001F4A5" * 900,
    "angle brackets": "<script>" * 600,
    "mixed": ("\x00\x7f\x1b[31m\"'\\\n\t\u2028\u2029<>&\U0001F680数" * 150),
}


@pytest.fixture
def hws(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    (root / "synapolis.json").write_text(json.dumps({"rate_limit_per_min": 100000}))
    return Workspace.open(root).ensure()


def _hook(ws, harness: str, name: str) -> subprocess.CompletedProcess:
    payload = {"session_id": CONV, "hook_event_name": name, "cwd": str(ws.root.parent), "transcript_path": None}
    return subprocess.run(synapolis_cmd(ws.root, "hook", harness), input=json.dumps(payload), capture_output=True,
                          text=True, encoding="utf-8", timeout=60, env=clean_env())


def _received_cost(harness: str, stdout: str) -> int:
    """The answer as the harness reads it from stdout, counted its way (test_hooks.printed_cost is the same
    rule applied to the parsed context; here the whole printed answer)."""
    if harness == "codex":
        return len(stdout.encode("utf-8", "surrogatepass"))
    units = len(stdout.encode("utf-16-le", "surrogatepass")) // 2
    if harness == "gemini-cli":
        units += 3 * (stdout.count("<") + stdout.count(">"))
    return units


@pytest.mark.parametrize("harness", sorted(DELIVER))
@pytest.mark.parametrize("kind", sorted(NASTY))
def test_the_printed_answer_stays_under_the_cap_and_shows_signals_whole(hws, harness, kind):
    started = _hook(hws, harness, START[harness])
    assert started.returncode == 0, started.stderr
    me = hooks.agent_id_for(harness, CONV, env={})
    actions.start(hws, agent_id="bob", env={}, write_identity=False)
    content = NASTY[kind]
    sent = [actions.signal(hws, Who("bob"), me, f"{i}:{content}", env={})["signal"] for i in range(4)]
    seen: list[str] = []
    for _ in range(8):
        done = _hook(hws, harness, DELIVER[harness])
        assert done.returncode == 0, done.stderr
        assert _received_cost(harness, done.stdout) <= hooks.OUTPUT_BUDGETS[harness], (harness, kind)
        answer = json.loads(done.stdout)
        text = (answer.get("hookSpecificOutput") or {}).get("additionalContext", "")
        shown = [s["id"] for s in sent if s["content"] in text]
        for s in sent:  # a signal is whole or absent, never cut
            if s["id"] not in shown:
                assert s["content"][:40] not in text or s["content"][:40] in s["content"][40:]
        seen += [i for i in shown if i not in seen]
        if len(seen) == len(sent):
            break
    # every one of them fits one answer on its own, so each was shown in time
    assert sorted(seen) == sorted(s["id"] for s in sent), (harness, kind)


def test_the_reported_case_4500_control_characters_for_claude_code(hws):
    """The issue's numbers: one pending signal of 4,500 control characters made a 27,986-character answer."""
    _hook(hws, "claude-code", "SessionStart")
    me = hooks.agent_id_for("claude-code", CONV, env={})
    actions.start(hws, agent_id="bob", env={}, write_identity=False)
    actions.signal(hws, Who("bob"), me, "\x01" * 4500, env={})
    done = _hook(hws, "claude-code", "PostToolUse")
    assert done.returncode == 0 and len(done.stdout) <= 10_000, len(done.stdout)
    text = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "\x01" * 4500 not in text and "not shown here" in text and "read-signals" in text
