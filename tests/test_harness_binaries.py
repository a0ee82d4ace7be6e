"""The real harnesses agree with synapolis about its hooks: Codex's own `hooks/list` (app-server) reports
the same per-hook hash and trust status that `doctor` computes, before and after `hooks install --trust`.

Needs the Codex binary from npm (`@openai/codex`): $SYNAPOLIS_TEST_CODEX, or `codex` on PATH
(.ci/setup.d/50-codex.sh installs the pinned version in CI when npm is there); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from synapolis import doctor, harness_settings, hook_install

CODEX = os.environ.get("SYNAPOLIS_TEST_CODEX") or shutil.which("codex")
pytestmark = pytest.mark.skipif(not CODEX, reason="no Codex binary (set SYNAPOLIS_TEST_CODEX or put codex on PATH)")


def codex_hooks_list(project, codex_home) -> dict:
    """Codex's own view of the project's hooks: one `hooks/list` over `codex app-server`'s JSON-RPC."""
    env = {**os.environ, "CODEX_HOME": str(codex_home)}
    proc = subprocess.Popen([CODEX, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=project, env=env)
    try:
        def ask(request_id, method, params):
            proc.stdin.write(json.dumps({"id": request_id, "method": method, "params": params}) + "\n")
            proc.stdin.flush()
            while True:
                line = proc.stdout.readline()
                assert line, "codex app-server closed its output"
                message = json.loads(line)
                if message.get("id") == request_id:
                    return message

        ask(1, "initialize", {"clientInfo": {"name": "synapolis-tests", "version": "0"}})
        proc.stdin.write(json.dumps({"method": "initialized"}) + "\n")
        listed = ask(2, "hooks/list", {"cwds": [str(project)]})
        (entry,) = listed["result"]["data"]
        return {h["key"]: h for h in entry["hooks"]}
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_codex_itself_agrees_on_hashes_and_trust(tmp_path, harness_home, monkeypatch):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(codex_home))
    (codex_home / "config.toml").write_text(f'[projects.{json.dumps(str(project))}]\ntrust_level = "trusted"\n')
    hook_install.install("codex", project)
    hooks_file = project / ".codex" / "hooks.json"
    ours = harness_settings.codex_hooks(hooks_file, json.loads(hooks_file.read_text()),
                                        lambda c: hook_install.is_our_command(c, "codex"))
    seen = codex_hooks_list(project, codex_home)
    assert {k: seen[k]["currentHash"] for k in seen} == {h["key"]: h["hash"] for h in ours}
    assert {h["trustStatus"] for h in seen.values()} == {"untrusted"}
    assert any("never trusted" in f["message"] for f in doctor.check_harness(project, "codex"))

    hook_install.install("codex", project, trust=True)
    assert {h["trustStatus"] for h in codex_hooks_list(project, codex_home).values()} == {"trusted"}
    assert not [f for f in doctor.check_harness(project, "codex") if f["status"] == "fail"]

    document = json.loads(hooks_file.read_text())
    document["hooks"]["PostToolUse"][-1]["hooks"][0]["timeout"] = 9
    hooks_file.write_text(json.dumps(document))
    seen = codex_hooks_list(project, codex_home)
    assert sorted(h["trustStatus"] for h in seen.values()) == ["modified", "trusted", "trusted", "trusted"]
    assert any("PostToolUse" in f["message"] and "changed since" in f["message"]
               for f in doctor.check_harness(project, "codex"))
