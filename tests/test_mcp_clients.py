"""Independent MCP clients against synapolis (issue 12): tests/clients/check.mjs, on the TypeScript SDK 1.x
(the SDK Gemini CLI and the MCP Inspector use), over stdio (`synapolis mcp`) and over HTTP (`synapolis
serve` with a token): every tool succeeding and failing, every result validated against its output schema
by that client, our one-line errors reaching it, and the notification of a signal the CLI sends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import clean_env
import pytest

CLIENTS = Path(__file__).parent / "clients"


def _node() -> str:
    node = shutil.which("node")
    ready = node is not None and (CLIENTS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir()
    if not ready:
        if os.environ.get("CI") == "true":
            pytest.fail("node or tests/clients/node_modules is missing in CI (.ci/setup.d/30-node.sh installs them)")
        pytest.skip("node and `npm ci` in tests/clients are needed (CI installs them)")
    return node


def _check(*args) -> dict:
    env = clean_env()
    done = subprocess.run([_node(), "check.mjs", *map(str, args)], cwd=CLIENTS, capture_output=True, text=True,
                          timeout=180, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_typescript_sdk_1x_client_over_stdio(state_dir):
    checked = _check("stdio", sys.executable, state_dir)
    assert checked == {"tools": 16, "successes": 16, "errors": 16, "notified": True}


def test_typescript_sdk_1x_client_over_http(served):
    token = served.token("ts-client")
    checked = _check("http", served.url, token, sys.executable, served.state_dir)
    assert checked == {"tools": 16, "successes": 16, "errors": 16, "notified": True}
