"""doctor and HTTP MCP entries (issue 29): a project whose agents reach synapolis only through `synapolis serve`
is recognised in each harness's own config format (Claude Code's .mcp.json, Gemini CLI's settings.json,
Codex's config.toml), the server's /healthz and the entry's token are checked against a real `serve` process,
and the token never appears in what doctor says."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from conftest import clean_env, synapolis_cmd
from synapolis.harness import doctor

VAR = "SYNAPOLIS_TEAM_TOKEN"


def write_entry(project, harness: str, url: str, *, token_var: str = VAR, literal: str | None = None) -> None:
    """The harness's own HTTP entry for `url`, its bearer token from $token_var (or `literal`, inline)."""
    bearer = f"Bearer {literal}" if literal is not None else None
    if harness == "claude-code":
        entry = {"type": "http", "url": url, "headers": {"Authorization": bearer or f"Bearer ${{{token_var}}}"}}
        (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"synapolis": entry}}))
    elif harness == "gemini-cli":
        (project / ".gemini").mkdir(exist_ok=True)
        entry = {"httpUrl": url, "headers": {"Authorization": bearer or f"Bearer ${token_var}"}}
        (project / ".gemini" / "settings.json").write_text(json.dumps({"mcpServers": {"synapolis": entry}}))
    else:
        (project / ".codex").mkdir(exist_ok=True)
        auth = f'http_headers = {{ "Authorization" = "{bearer}" }}' if bearer else f'bearer_token_env_var = "{token_var}"'
        (project / ".codex" / "config.toml").write_text(f'[mcp_servers.synapolis]\nurl = "{url}"\n{auth}\n')


@pytest.fixture
def project(tmp_path, monkeypatch):
    path = tmp_path / "project"
    path.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))  # no user config of this machine
    return path


HARNESSES = ["claude-code", "gemini-cli", "codex"]


def said(findings) -> str:
    return json.dumps(findings)


@pytest.mark.parametrize("harness", HARNESSES)
def test_an_http_entry_with_a_good_token_is_recognised_and_checked(served, project, harness):
    token = served.token("team")
    write_entry(project, harness, served.url + "/mcp")
    env = {**clean_env(), VAR: token, "CODEX_HOME": str(project / "no-codex-home")}
    findings = doctor.check_harnesses(project, env)
    text = said(findings)
    assert token not in text
    assert "neither beat nor receive" not in text
    oks = [f["message"] for f in findings if f["status"] == "ok"]
    assert any("answers /healthz" in m for m in oks) and any("token" in m and "accepted" in m for m in oks), findings
    assert not [f for f in findings if f["status"] == "fail"], findings
    # no hooks: said truthfully, as a warning with the fix
    (hooks,) = [f for f in findings if "no synapolis hooks" in f["message"]]
    assert hooks["status"] == "warn" and "MCP tools" in hooks["message"] and "hooks install" in hooks["fix"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_refused_token_fails_without_being_shown(served, project, harness):
    served.token("team")
    wrong = "syn_" + "x" * 40
    write_entry(project, harness, served.url + "/mcp", literal=wrong)
    findings = doctor.check_harnesses(project, {**clean_env(), "CODEX_HOME": str(project / "none")})
    assert wrong not in said(findings)
    (refused,) = [f for f in findings if f["status"] == "fail"]
    assert "refuses the token" in refused["message"]


def test_an_unset_token_variable_is_a_warning_naming_it(served, project):
    write_entry(project, "claude-code", served.url + "/mcp")
    findings = doctor.check_harnesses(project, clean_env())
    (unset,) = [f for f in findings if "not set here" in f["message"]]
    assert unset["status"] == "warn" and VAR in unset["message"]


def test_a_server_that_does_not_answer_fails_within_the_timeout(project):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    write_entry(project, "codex", f"http://127.0.0.1:{port}/mcp")
    findings = doctor.check_harnesses(project, {**clean_env(), VAR: "t", "CODEX_HOME": str(project / "none")})
    (down,) = [f for f in findings if f["status"] == "fail"]
    assert "/healthz does not answer" in down["message"] and "synapolis serve" in down["fix"]


def test_the_whole_report_over_the_cli(served, project, tmp_path):
    token = served.token("team")
    write_entry(project, "claude-code", served.url + "/mcp")
    env = clean_env({VAR: token, "HOME": str(tmp_path), "CODEX_HOME": str(tmp_path / "codex-home")})
    done = subprocess.run(synapolis_cmd(served.state_dir, "doctor", "--project-dir", project, "--json"),
                          capture_output=True, text=True, env=env, timeout=120)
    assert token not in done.stdout + done.stderr
    report = json.loads(done.stdout)
    harness = [f for f in report["findings"] if f["check"] == "harness:claude-code"]
    assert any("accepted" in f["message"] and f["status"] == "ok" for f in harness), harness
