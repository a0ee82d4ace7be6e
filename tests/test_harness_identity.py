"""Claude Code's real binary over HTTP keeps its identity (issue 29): it negotiates the 2026-07-28 protocol (no
MCP session), so the agent its `start_session` made must be found again from what its next request carries
(the bearer token and its clientInfo). A local stand-in for the Messages API scripts the model's turns: call
start_session, then note; the note is the started agent's, which the CLI then reads.

Binary: as tests/test_harness_binaries.py finds it (conftest.harness_binary); skipped without one, except in
CI, where .ci/run installs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from http.server import BaseHTTPRequestHandler

import pytest

from conftest import LocalServer, require_harness, respond

pytest.importorskip("mcp")


class ScriptedModel(LocalServer):
    """A Messages API stand-in that answers a request offering the scripted tools with the next tool call (one
    per tool_result the conversation already holds), then with a final text; every request body is kept."""

    def __init__(self, steps):
        self.steps = steps  # [(tool name, input)], in order
        bodies = self.bodies = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                bodies.append(body)
                if "count_tokens" in self.path:
                    return self._json({"input_tokens": 10})
                names = {t.get("name") for t in body.get("tools") or []}
                done = sum(1 for m in body.get("messages", []) if isinstance(m.get("content"), list)
                           for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result")
                if outer.steps[0][0] in names and done < len(outer.steps):
                    name, args = outer.steps[done]
                    self._answer(body, {"type": "tool_use", "id": f"toolu_{done}", "name": name, "input": args},
                                 "tool_use")
                else:
                    self._answer(body, {"type": "text", "text": "done"}, "end_turn")

            def _json(self, obj):
                respond(self, 200, "application/json", json.dumps(obj).encode())

            def _answer(self, body, block, stop):
                message = {"id": "msg_standin", "type": "message", "role": "assistant", "model": body.get("model", "m"),
                           "content": [], "stop_reason": None, "stop_sequence": None,
                           "usage": {"input_tokens": 1, "output_tokens": 1}}
                if not body.get("stream"):
                    return self._json({**message, "content": [block], "stop_reason": stop})
                start = dict(block, input={}) if block["type"] == "tool_use" else dict(block, text="")
                delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                         if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
                events = [("message_start", {"type": "message_start", "message": message}),
                          ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
                          ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                          ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                          ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 1},
                                             "delta": {"stop_reason": stop, "stop_sequence": None}}),
                          ("message_stop", {"type": "message_stop"})]
                out = "".join(f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in events).encode()
                respond(self, 200, "text/event-stream", out)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def tool_results(bodies) -> list[str]:
    """The text of every tool result the harness sent back to the model, in order (the last request has all)."""
    last = bodies[-1]["messages"]
    return [c.get("text", "") if isinstance(c, dict) else str(c)
            for m in last if isinstance(m.get("content"), list)
            for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
            for c in (b["content"] if isinstance(b.get("content"), list) else [{"text": b.get("content")}])]


@pytest.mark.parametrize("pinned", [False, True])
def test_claude_code_over_http_acts_as_the_agent_its_start_session_made(served, cli, tmp_path, pinned):
    claude = require_harness("claude")
    token = served.token("cc", *(["--agent", "cc-agent"] if pinned else []))
    model = ScriptedModel([("mcp__synapolis__start_session", {} if pinned else {"agent_id": "cc-agent"}),
                           ("mcp__synapolis__note", {"text": "the second call"}),
                           ("mcp__synapolis__beat", {"task": "the third call"})])
    project, home = tmp_path / "project", tmp_path / "home"
    (project / ".git").mkdir(parents=True)
    home.mkdir()
    config = tmp_path / "mcp.json"  # the README's entry, with this server's URL and token
    config.write_text(json.dumps({"mcpServers": {"synapolis": {
        "type": "http", "url": served.url + "/mcp", "headers": {"Authorization": f"Bearer {token}"}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNAPOLIS_", "ANTHROPIC_", "CLAUDE_"))}
    # ENABLE_TOOL_SEARCH=false: the MCP tools are offered to the model at once, not behind Claude Code's search
    env.update(HOME=str(home), ANTHROPIC_API_KEY="sk-ant-stand-in", ANTHROPIC_BASE_URL=model.url,
               ENABLE_TOOL_SEARCH="false")
    try:
        done = subprocess.run([claude, "-p", "coordinate", "--mcp-config", str(config), "--strict-mcp-config",
                               "--allowedTools", "mcp__synapolis__start_session,mcp__synapolis__note,"
                               "mcp__synapolis__beat"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL)
    finally:
        model.close()
    assert done.returncode == 0, done.stdout + done.stderr
    results = tool_results(model.bodies)
    assert len(results) == 3, results
    assert all("NoIdentityError" not in r and "Error (exit" not in r for r in results), results
    started = json.loads(results[0])
    assert started["agent_id"] == "cc-agent"
    assert json.loads(results[1])["note"]["agent_id"] == "cc-agent"
    assert json.loads(results[2])["heartbeat"]["agent_id"] == "cc-agent"
    notes = json.loads(cli("read-notes", "--session-id", started["session_id"], "--json").stdout)["notes"]
    assert [(n["agent_id"], n["text"]) for n in notes] == [("cc-agent", "the second call")]
    # it spoke the 2026-07-28 protocol (no MCP session): what it is was kept for its token and client
    kept = json.loads((served.state_dir / "mcp-identities.json").read_text())["clients"]
    assert [e["agent_id"] for e in kept.values()] == ["cc-agent"]
