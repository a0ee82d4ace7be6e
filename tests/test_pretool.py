"""The pre-tool hook (contract §14): each harness's documented PreToolUse / BeforeTool event in, the guard's
answer out in that harness's own shape. Held by a live other: refused, naming path, holder, expiry and the
signal command; everything else (a free path, one's own claim, a gone holder, a path outside the project, a
tool that writes nothing, our own failure) lets the tool run. `guard.mode` warn/off, `guard.auto_claim`,
and the quiet path that opens no store while nothing is held."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta

import pytest

from conftest import NOW, clean_env, configure, synapolis_cmd
from synapolis import actions, autoclaim, claims
from synapolis.harness import hooks, pretool
from synapolis.harness.patch_paths import patch_paths
from synapolis.identity import Who
from synapolis.workspace import Workspace

CONV = "7a1b2c3d-aaaa-bbbb-cccc-0123456789ab"
OTHER_CONV = "9e8d7c6b-aaaa-bbbb-cccc-0123456789ab"
EVENT = {"claude-code": "PreToolUse", "gemini-cli": "BeforeTool", "codex": "PreToolUse"}


def event(harness: str, project, tool: str, tool_input, conversation: str = CONV, **more) -> str:
    """A pre-tool event as each harness documents it (fields beyond these are ignored by the hook)."""
    base = {"session_id": conversation, "hook_event_name": EVENT[harness], "cwd": str(project),
            "tool_name": tool, "tool_input": tool_input}
    if harness == "claude-code":
        base.update(transcript_path="/tmp/t.jsonl", permission_mode="default", tool_use_id="toolu_01")
    elif harness == "codex":
        base.update(transcript_path=None, model="gpt-5-codex", permission_mode="default", turn_id="t1",
                    tool_use_id="call_1")
    else:
        base.update(transcript_path="/tmp/t.json", timestamp="2030-01-01T12:00:00.000Z")
    base.update(more)
    return json.dumps(base)


def edit_of(harness: str, project, rel: str, conversation: str = CONV) -> str:
    """The harness's usual edit of `rel` (a path relative to the project)."""
    path = str(project / rel)
    if harness == "claude-code":
        return event(harness, project, "Edit", {"file_path": path, "old_string": "a", "new_string": "b"}, conversation)
    if harness == "gemini-cli":
        return event(harness, project, "replace", {"file_path": path, "old_string": "a", "new_string": "b"},
                     conversation)
    patch = f"*** Begin Patch\n*** Update File: {rel}\n@@\n-a\n+b\n*** End Patch\n"
    return event(harness, project, "apply_patch", {"command": patch}, conversation)


@pytest.fixture
def project(ws):
    """The project the state directory guards: its parent folder (no git work tree above it)."""
    root = ws.paths.root.parent
    (root / "src").mkdir(exist_ok=True)
    return root


def held_by_alice(ws, item="src/api/**", now=NOW):
    actions.start(ws, agent_id="alice", env={}, write_identity=False, now=now)
    return claims.claim(ws, item, "alice", ttl_s=3600, now=now)


def run(harness, raw, ws, now=NOW) -> dict:
    return hooks.handle(harness, raw, state_dir=ws.paths.root, env={}, now=now)


@pytest.mark.parametrize("harness", ["claude-code", "gemini-cli", "codex"])
def test_an_edit_of_a_file_another_live_agent_holds_is_refused_in_the_harness_shape(ws, project, harness):
    held_by_alice(ws)
    result = run(harness, edit_of(harness, project, "src/api/users.py"), ws)
    out = result["output"]
    if harness == "gemini-cli":
        assert set(out) == {"decision", "reason"} and out["decision"] == "deny"
        reason = out["reason"]
    else:
        spec = out["hookSpecificOutput"]
        assert spec["hookEventName"] == "PreToolUse" and spec["permissionDecision"] == "deny"
        reason = spec["permissionDecisionReason"]
    expires = claims.file_document(ws, "src/api/**")[0]["expires_at"] if ws.config.values.get("store", "sqlite") == "sqlite" \
        else result["blocked"][0]["expires_at"]
    assert "src/api/users.py" in reason and "alice" in reason and expires in reason
    assert 'synapolis signal alice "may I edit src/api/users.py?"' in reason
    assert result["problems"] == []


@pytest.mark.parametrize("harness", ["claude-code", "gemini-cli", "codex"])
def test_what_the_guard_lets_through(ws, project, harness):
    held_by_alice(ws, "src/api/**")
    # a free path, a path outside the project, a tool that writes no file
    assert run(harness, edit_of(harness, project, "src/web/app.py"), ws)["output"] == {}
    outside = {"claude-code": ("Write", {"file_path": "/etc/hosts", "content": "x"}),
               "gemini-cli": ("write_file", {"file_path": "/etc/hosts", "content": "x"}),
               "codex": ("apply_patch", {"command": "*** Begin Patch\n*** Add File: /etc/hosts\n+x\n*** End Patch"})}
    tool, tool_input = outside[harness]
    assert run(harness, event(harness, project, tool, tool_input), ws)["output"] == {}
    shell = {"claude-code": "Bash", "gemini-cli": "run_shell_command", "codex": "Bash"}[harness]
    assert run(harness, event(harness, project, shell, {"command": "rm -rf src/api"}), ws)["output"] == {}


def test_the_agents_own_claim_and_a_gone_holders_claim_let_the_edit_run(ws, project):
    start = json.dumps({"session_id": CONV, "hook_event_name": "SessionStart", "cwd": str(project)})
    me = run("claude-code", start, ws)["agent_id"]
    claims.claim(ws, "src/mine.py", me, ttl_s=3600, now=NOW)
    assert run("claude-code", edit_of("claude-code", project, "src/mine.py"), ws)["output"] == {}
    # bob claimed two days ago with a long lease and has not beaten since: dead, his claim blocks nobody
    old = NOW - timedelta(days=2)
    actions.start(ws, agent_id="bob", env={}, write_identity=False, now=old)
    claims.claim(ws, "src/old.py", "bob", ttl_s=5 * 86400, now=old)
    assert run("claude-code", edit_of("claude-code", project, "src/old.py"), ws)["output"] == {}
    # ... while another conversation is refused the file this one holds
    refused = run("claude-code", edit_of("claude-code", project, "src/mine.py", OTHER_CONV), ws)["output"]
    assert refused["hookSpecificOutput"]["permissionDecision"] == "deny" and me in str(refused)


def test_every_path_of_a_codex_patch_is_guarded(ws, project):
    held_by_alice(ws, "docs/")
    patch = ("*** Begin Patch\n*** Add File: src/new.py\n+x\n*** Update File: src/a.py\n*** Move to: docs/a.md\n"
             "@@\n-a\n+b\n*** Delete File: src/gone.py\n*** End Patch\n")
    out = run("codex", event("codex", project, "apply_patch", {"command": patch}), ws)
    assert out["output"]["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert [b["relative_path"] for b in out["blocked"]] == ["docs/a.md"]


def test_patch_paths_reads_each_header_and_nothing_else():
    patch = ("apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: a b.py\n+*** Delete File: not/a/header.py\n"
             "*** Update File: src/x.py\n*** Move to: src/y.py\n@@ def f():\n- *** Update File: no.py\n"
             "  *** Delete File: old.py\n*** Update File: src/x.py\n*** End Patch\nEOF\n")
    assert patch_paths(patch) == ["a b.py", "src/x.py", "src/y.py", "old.py"]
    assert patch_paths(None) == [] and patch_paths("no patch here") == []


@pytest.mark.parametrize("mode", ["warn", "off"])
def test_warn_lets_the_tool_run_with_the_reason_as_context_and_off_says_nothing(ws, project, mode):
    held_by_alice(ws)
    configure(ws, guard={"mode": mode})
    out = run("claude-code", edit_of("claude-code", project, "src/api/users.py"), ws)["output"]
    if mode == "off":
        assert out == {}
        return
    spec = out["hookSpecificOutput"]
    assert "permissionDecision" not in spec and "alice" in spec["additionalContext"]
    codex = run("codex", edit_of("codex", project, "src/api/users.py"), ws)["output"]["hookSpecificOutput"]
    assert set(codex) == {"hookEventName", "additionalContext"}
    assert run("gemini-cli", edit_of("gemini-cli", project, "src/api/users.py"), ws)["output"].get("decision") is None


def test_our_own_failures_let_the_tool_run(ws, project, tmp_path):
    held_by_alice(ws)
    for raw in ("{not json", json.dumps({"session_id": CONV, "hook_event_name": "PreToolUse", "tool_name": "Edit",
                                        "tool_input": "not an object"}),
                json.dumps({"session_id": CONV, "hook_event_name": "PreToolUse", "tool_name": "Edit",
                            "tool_input": {"file_path": 42}})):
        assert run("claude-code", raw, ws)["output"] == {}
    # a store that cannot be reached: allowed, one line on stderr, exit 0, quickly
    configure(ws, store="postgresql://nobody@127.0.0.1:9/nothing?connect_timeout=1")
    done = subprocess.run(synapolis_cmd(ws.paths.root, "hook", "claude-code"), capture_output=True, text=True,
                          input=edit_of("claude-code", project, "src/api/users.py"), env=clean_env(), timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {} and "guard" in done.stderr


@pytest.mark.sqlite_only
def test_nothing_held_is_answered_without_a_store_and_never_lets_a_new_claim_through(ws, project):
    from synapolis.claim_index import index_path, nothing_held as core_nothing_held

    def both() -> bool:  # the hook's own reading of the index agrees with claim_index's
        mine = pretool.nothing_held(ws, {})
        assert mine == core_nothing_held(ws, env={})
        return mine

    raw = edit_of("claude-code", project, "src/api/users.py")
    os.rmdir(ws.files.claims)
    assert both()  # no claims/ folder at all: nothing was ever claimed
    claim = held_by_alice(ws)
    assert not both()  # the claims index names it
    claims.release(ws, "src/api/**", "alice", now=NOW)
    assert both()  # the index is empty again
    # a new claim puts it back in the index before its file is written: the next edit is refused
    claims.claim(ws, "src/api/**", "alice", now=NOW)
    assert not both()
    assert run("claude-code", raw, ws)["output"]["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert claim.token < claims.file_document(ws, "src/api/**")[0]["token"]
    # no index but claim files (a state directory from before the index): not known, so the guard decides
    claims.release(ws, "src/api/**", "alice", now=NOW)
    os.unlink(index_path(ws))
    assert not both()
    assert run("claude-code", raw, ws)["output"] == {}
    with open(index_path(ws), "w") as handle:
        handle.write('{"schema_version": 2, "items": {}}')  # a format this hook does not know: not trusted
    assert not pretool.nothing_held(ws, {})


def test_auto_claim_claims_the_edited_file_renews_it_and_lets_go_at_session_end(ws, project):
    configure(ws, guard={"auto_claim": True})
    first = run("claude-code", edit_of("claude-code", project, "src/app.py"), ws)
    me = first["agent_id"]
    assert first["output"] == {} and first["claimed"] == ["src/app.py"]
    record = claims.list_claims(ws, NOW)[0]
    assert (record["item"], record["claimed_by"], record["state"]) == ("src/app.py", me, "held")
    # another conversation's edit of it is refused; the first one's next edit renews (same token, later expiry)
    other = run("claude-code", edit_of("claude-code", project, "src/app.py", OTHER_CONV), ws)
    assert other["output"]["hookSpecificOutput"]["permissionDecision"] == "deny" and me in str(other["output"])
    later = NOW + timedelta(minutes=10)
    assert run("claude-code", edit_of("claude-code", project, "src/app.py"), ws, now=later)["claimed"] == ["src/app.py"]
    renewed = claims.list_claims(ws, later)[0]
    assert renewed["token"] == record["token"] and renewed["expires_at"] > record["expires_at"]
    assert autoclaim.remembered(ws, me) == ["src/app.py"]
    end = json.dumps({"session_id": CONV, "hook_event_name": "SessionEnd", "cwd": str(project), "reason": "exit"})
    run("claude-code", end, ws, now=later)
    assert claims.list_claims(ws, later)[0]["state"] == "released" and autoclaim.remembered(ws, me) == []
    assert run("claude-code", edit_of("claude-code", project, "src/app.py", OTHER_CONV), ws, now=later)["output"] == {}


def test_auto_claims_are_released_by_tired_and_never_a_claim_the_agent_made_itself(ws, project):
    configure(ws, guard={"auto_claim": True})
    me = run("claude-code", edit_of("claude-code", project, "src/app.py"), ws)["agent_id"]
    state = hooks.load_state(ws, me)
    who = Who(me, state["session_id"], state["run_token"])
    claims.claim(ws, "ticket:7", me, session_id=state["session_id"], now=NOW)
    actions.start(ws, agent_id="carol", env={}, write_identity=False, now=NOW)  # someone else is awake: standby
    from synapolis.sleep import tired

    answer = tired(ws, who, env={}, now=NOW)
    assert answer["outcome"] == "standby" and answer["released"] == ["src/app.py"]
    by_item = {c["item"]: c["state"] for c in claims.list_claims(ws, NOW)}
    assert by_item == {"src/app.py": "released", "ticket:7": "held"}


def test_the_console_script_answers_a_refusal_with_exit_0(ws, project):
    held_by_alice(ws, now=None)
    done = subprocess.run(synapolis_cmd(ws.paths.root, "hook", "claude-code"), capture_output=True, text=True,
                          input=edit_of("claude-code", project, "src/api/users.py"), env=clean_env(), timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_hooks_install_adds_the_pre_tool_events_with_a_matcher_and_uninstall_takes_them_out(tmp_path):
    from synapolis.harness import install

    for harness, name, tools in (("claude-code", "PreToolUse", "Edit|Write|MultiEdit|NotebookEdit"),
                                 ("gemini-cli", "BeforeTool", "write_file|replace"),
                                 ("codex", "PreToolUse", "apply_patch")):
        install.install(harness, tmp_path)
        document = json.loads(install.settings_file(tmp_path, harness).read_text())
        (group,) = document["hooks"][name]
        assert group["matcher"] == tools and group["hooks"][0]["command"].endswith(f"hook {harness}")
        install.uninstall(harness, tmp_path)
        assert name not in json.loads(install.settings_file(tmp_path, harness).read_text()).get("hooks", {})


def test_config_refuses_a_bad_guard(ws):
    from synapolis.config import check_config

    assert check_config({"guard": {"mode": "block"}}) and check_config({"guard": {"auto_claim": "yes"}})
    assert check_config({"guard": {"other": 1}}) and check_config({"guard": []})
    assert check_config({"guard": {"mode": "warn", "auto_claim": True}}) == []
    assert Workspace.open(ws.paths.root).config.guard_mode == "deny"


@pytest.mark.postgres
def test_a_folder_claimed_on_one_machine_is_refused_by_the_hooks_and_git_of_another(tmp_path, pg_url):
    """Two state directories (two machines' checkouts) on one PostgreSQL store: alice claims src/api/ on
    the first; on the second, each harness's pre-tool hook refuses an edit under it, and so does git."""
    from conftest import use_store

    first, second = tmp_path / "laptop", tmp_path / "ci-runner"
    for project in (first, second):
        (project / "src" / "api").mkdir(parents=True)
        subprocess.run(["git", "init", "-q", "-b", "main", str(project)], check=True)
    ws_one, ws_two = use_store(first / "state", pg_url), use_store(second / "state", pg_url)
    actions.start(ws_one, agent_id="alice", env={}, write_identity=False)
    claims.claim(ws_one, "src/api/", "alice", ttl_s=3600)
    for harness in ("claude-code", "gemini-cli", "codex"):
        out = hooks.handle(harness, edit_of(harness, second, "src/api/users.py"), state_dir=ws_two.paths.root,
                           env={})["output"]
        assert "alice" in json.dumps(out) and ("deny" in json.dumps(out)), (harness, out)
    # git on the second checkout
    done = subprocess.run(synapolis_cmd(ws_two.paths.root, "hooks", "install", "git", "--project-dir", second),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    (second / ".gitignore").write_text("state/\n")
    (second / "src" / "api" / "users.py").write_text("v = 1\n")
    env = clean_env(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
                    GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(["git", "-C", str(second), "add", "-A"], check=True, env=env)
    done = subprocess.run(["git", "-C", str(second), "commit", "-m", "x"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode != 0 and "src/api/users.py" in done.stderr and "alice" in done.stderr


def test_a_patch_of_many_held_files_is_refused_in_a_bounded_answer(ws, project):
    held_by_alice(ws, "src/**")
    patch = "*** Begin Patch\n" + "".join(f"*** Add File: src/f{i}.py\n+x\n" for i in range(500)) + "*** End Patch\n"
    out = run("codex", event("codex", project, "apply_patch", {"command": patch}), ws)
    reason = out["output"]["hookSpecificOutput"]["permissionDecisionReason"]
    assert len(out["blocked"]) == 500 and len(reason) < 10_000 and "480 more held path(s)" in reason


@pytest.mark.sqlite_only
def test_one_reading_reads_the_claims_index_once_and_only_inside(ws):
    from synapolis.claim_index import one_reading, read_file_index

    held_by_alice(ws, "src/a.py")
    with one_reading():
        first = read_file_index(ws)
        first["planted"] = "x"  # a reader's change never reaches the others
        claims.claim(ws, "src/b.py", "alice", now=NOW)  # a writer reads the index afresh, whatever the block
        assert read_file_index(ws) == {"src/a.py": "src/a.py"}  # the one reading, as at its moment
    assert set(read_file_index(ws)) == {"src/a.py", "src/b.py"}  # afterwards (and for the writer): read afresh


@pytest.mark.sqlite_only
def test_one_reading_in_one_thread_never_outlives_it_in_another(ws):
    # the team server decides sandboxes' pre-tool events on worker threads at once (web/api_call.run_hook).
    # The held reading was one module global: A enters, B enters (and shares it), A leaves, B leaves and puts
    # back what it found, A's reading, for good; every later guard in that process answered from it, and a
    # path claimed afterwards was let through
    import threading

    from synapolis.claim_index import one_reading, read_file_index
    from synapolis.guard import guard

    held_by_alice(ws, "src/a.py")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with one_reading():
            read_file_index(ws)
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with one_reading():
            read_file_index(ws)
            b_in.set()
            a_out.wait(10)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    claims.claim(ws, "src/b.py", "alice", now=NOW)
    assert set(read_file_index(ws)) == {"src/a.py", "src/b.py"}
    answer = guard(ws, Who("bob"), ["src/b.py"], now=NOW)
    assert answer["allowed"] is False and [b["item"] for b in answer["blocked"]] == ["src/b.py"]
