"""The real harnesses reach a real `synapolis serve` over HTTP with the MCP entries README "Serving a team"
documents, read from the README itself, each with its own per-agent token in $SYNAPOLIS_TOKEN: the binary's
own check (`claude mcp list` and `gemini mcp list` connect to each server and print its status; `codex mcp
list` only prints the config, so Codex's app-server `mcpServerStatus/list`, which starts each server and
lists its tools) reports it connected, and the server saw an authenticated request from that token (its
last-used time is set). With a wrong token the same check reports the refusal and the token stays unused.
None of these commands needs a model API key.

Binaries: as tests/test_harness_binaries.py finds them (conftest.harness_binary); skipped without one,
except in CI, where .ci/run installs them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import CodexAppServer, require_harness

README = Path(__file__).resolve().parents[1] / "README.md"
PLACEHOLDER = "https://team.example:8765/mcp"  # the URL the README's entries use


def readme_entry(label: str) -> str:
    """The fenced block that follows `**<label>**` in README's "Serving a team", the team's URL in it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Serving a team"):]
    section = section[:section.index("\n## ", 1)]
    after = section[section.index(f"**{label}**"):]
    block = re.search(r"```[a-z]*\n(.*?)```", after, re.S).group(1)
    assert PLACEHOLDER in block, block
    return block


def last_used(cli, name: str):
    listed = cli("tokens", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (token,) = [t for t in json.loads(listed.stdout)["tokens"] if t["name"] == name]
    return token["last_used_at"]


def run(cmd, *, cwd, env, timeout=120) -> str:
    """Run a harness command; everything it printed (stdout and stderr: the CLIs differ in which)."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return done.stdout + done.stderr


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    (folder / ".git").mkdir(parents=True)
    return folder


def _env(home, token: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNAPOLIS_", "GEMINI_", "CODEX_"))}
    env.update(HOME=str(home), SYNAPOLIS_TOKEN=token, **extra)
    return env


def _claude_status(claude, project, home, token) -> str:
    out = run([claude, "mcp", "list"], cwd=project, env=_env(home, token))
    line = next((l for l in out.splitlines() if l.startswith("synapolis: ")), None)
    assert line is not None, out
    return line


@pytest.mark.parametrize("entry", ["mcp.json", "mcp add"])
def test_claude_code_connects_with_the_readme_entry(served, cli, project, tmp_path, harness_home, entry):
    claude = require_harness("claude")
    token = served.token("claude-laptop", "--agent", "claude_1")
    url = served.url + "/mcp"
    home = tmp_path / "claude-home"
    (home / ".claude").mkdir(parents=True)
    if entry == "mcp.json":
        (project / ".mcp.json").write_text(readme_entry("Claude Code").replace(PLACEHOLDER, url))
        # what answering "Use this MCP server" at Claude Code's first start records for a project's .mcp.json
        (home / ".claude" / "settings.json").write_text(json.dumps({"enabledMcpjsonServers": ["synapolis"]}))
    else:  # the README's `claude mcp add` line, as a shell would run it (the variable expanded)
        line = re.search(r"`(claude mcp add\s[^`]*)`", README.read_text(encoding="utf-8")).group(1)
        argv = [claude] + [a.replace("$SYNAPOLIS_TOKEN", token) for a in shlex.split(line.replace(PLACEHOLDER, url))[1:]]
        added = subprocess.run(argv, cwd=project, env=_env(home, token), capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stdout + added.stderr

    assert last_used(cli, "claude-laptop") is None
    wrong = _claude_status(claude, project, home, "syn_not-a-token")
    if entry == "mcp.json":  # the header comes from the variable: a wrong one is refused
        assert "Failed to connect" in wrong and "401" in wrong, wrong
        assert last_used(cli, "claude-laptop") is None
    line = _claude_status(claude, project, home, token)
    assert line.endswith("✔ Connected") and url in line, line
    assert last_used(cli, "claude-laptop") is not None


def _gemini_status(gemini, project, home, token) -> str:
    out = run([gemini, "mcp", "list"], cwd=project,
              env=_env(home, token, GEMINI_CLI_HOME=str(home),
                       GEMINI_CLI_SYSTEM_SETTINGS_PATH=str(home / "no-system-settings.json")))
    line = next((l for l in out.splitlines() if "synapolis:" in l), None)
    assert line is not None, out
    return line


def test_gemini_cli_connects_with_the_readme_entry(served, cli, project, tmp_path, harness_home):
    gemini = require_harness("gemini")
    token = served.token("gemini-laptop", "--agent", "gemini_1")
    url = served.url + "/mcp"
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    (project / ".gemini").mkdir()
    (project / ".gemini" / "settings.json").write_text(readme_entry("Gemini CLI").replace(PLACEHOLDER, url))
    # Gemini CLI starts no MCP server of an untrusted folder (it says so and lists it as disabled)
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))

    line = _gemini_status(gemini, project, home, "syn_not-a-token")
    assert line.endswith("Disconnected"), line
    assert last_used(cli, "gemini-laptop") is None
    line = _gemini_status(gemini, project, home, token)
    assert line.startswith("✓ synapolis: " + url) and line.endswith("- Connected"), line
    assert last_used(cli, "gemini-laptop") is not None


def _codex_status(codex, codex_home, project, token) -> dict:
    with CodexAppServer(codex, codex_home, project, env=_env(codex_home, token)) as app:
        answer = app.ask("mcpServerStatus/list", {})
    (status,) = [s for s in answer["result"]["data"] if s["name"] == "synapolis"]
    return status


def test_codex_connects_with_the_readme_entry(served, cli, project, tmp_path, harness_home):
    codex = require_harness("codex")
    token = served.token("codex-laptop", "--agent", "codex_1")
    url = served.url + "/mcp"
    codex_home = tmp_path / "codex-home"  # what ~/.codex is
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(readme_entry("Codex").replace(PLACEHOLDER, url))

    listed = run([codex, "mcp", "list", "--json"], cwd=project, env=_env(codex_home, token, CODEX_HOME=str(codex_home)))
    (configured,) = json.loads(listed[listed.index("["):listed.rindex("]") + 1])
    assert configured["transport"] == {**configured["transport"], "type": "streamable_http", "url": url,
                                       "bearer_token_env_var": "SYNAPOLIS_TOKEN"}

    refused = _codex_status(codex, codex_home, project, "syn_not-a-token")
    assert refused["tools"] == {} and "Auth required" in refused["toolsError"], refused
    assert last_used(cli, "codex-laptop") is None
    status = _codex_status(codex, codex_home, project, token)
    assert not status.get("toolsError"), status["toolsError"]
    assert status["serverInfo"]["name"] == "synapolis" and {"start_session", "signal"} <= set(status["tools"])
    assert last_used(cli, "codex-laptop") is not None
