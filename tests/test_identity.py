"""Identity (contract §3): the resolution order, ambiguity, run tokens, and read-only verbs acting as nobody."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from conftest import NOW
from synapolis import actions, identity
from synapolis.errors import AmbiguousIdentityError, ForbiddenError, NoIdentityError, UsageError
from synapolis.identity import Who
from synapolis.workspace import Workspace


def _config(ws, **values):
    doc = json.loads(ws.paths.config.read_text())
    doc.update(values)
    ws.paths.config.write_text(json.dumps(doc))
    return Workspace.open(ws.root)


def test_options_beat_env_beat_identity_file(start_agent, ws):
    a = start_agent("alice")
    start_agent("bob")  # identity.json now names bob
    env = {"SYNAPOLIS_AGENT_ID": "alice", "SYNAPOLIS_SESSION_ID": a["session_id"]}
    assert identity.resolve(ws, Who(), env=env, now=NOW).source == "env"
    assert identity.resolve(ws, Who(), env=env, now=NOW).agent_id == "alice"
    by_option = identity.resolve(ws, Who("bob"), env=env, now=NOW)
    assert (by_option.agent_id, by_option.source) == ("bob", "options")


def test_identity_file_alone_works_for_a_single_live_agent(start_agent, ws):
    a = start_agent("alice")
    caller = identity.resolve(ws, Who(), env={}, now=NOW)
    assert (caller.agent_id, caller.session_id, caller.run_token, caller.source) == \
        ("alice", a["session_id"], a["run_token"], "identity.json")


def test_identity_file_is_ambiguous_with_several_live_agents(start_agent, ws):
    start_agent("alice")
    start_agent("bob")
    with pytest.raises(AmbiguousIdentityError):
        identity.resolve(ws, Who(), env={}, now=NOW)
    with pytest.raises(AmbiguousIdentityError):
        actions.signal(ws, None, "*", "who am I?", env={}, now=NOW)
    assert identity.resolve(ws, Who(), env={}, required=False, now=NOW) is None
    # once the other agent is stale, identity.json is no longer ambiguous
    later = NOW + timedelta(seconds=ws.config.stale_after_s + 5)
    actions.beat(ws, Who("bob"), env={}, now=later)
    assert identity.resolve(ws, Who(), env={}, now=later).agent_id == "bob"


def test_read_only_verbs_act_as_nobody_when_ambiguous(start_agent, ws):
    a = start_agent("alice")
    start_agent("bob")
    actions.signal(ws, Who("alice"), "bob", "hi", env={}, now=NOW)
    listed = actions.list_agents(ws, env={}, now=NOW)
    assert {x["id"] for x in listed["agents"]} == {"alice", "bob"} and listed["pending_signals"] == []
    assert actions.read_notes(ws, env={}, now=NOW)["notes"] == []
    assert actions.whiteboard_read(ws, env={}, now=NOW)["entries"] == []
    # when an identity resolves they act as that agent too: refresh and piggyback
    as_bob = actions.list_agents(ws, Who("bob", a["session_id"]), env={}, now=NOW)
    assert [s["content"] for s in as_bob["pending_signals"]] == ["hi"]


def test_a_session_removed_under_identity_json_leaves_readers_reading_as_nobody(start_agent, ws, cli):
    """identity.json names an agent of a session since deleted (a clean-up of old sessions): its run token
    is proven nowhere, so every reader failed with "wrong run token" (exit 7). They read as nobody; a verb
    that acts still says the session is gone (exit 6), and a token a caller presents is still checked."""
    import shutil

    gone = start_agent("bob")["session_id"]
    assert json.loads(ws.paths.identity.read_text())["session_id"] == gone
    shutil.rmtree(ws.paths.session_dir(gone))
    assert actions.list_agents(ws, env={}, now=NOW)["agents"] == []
    assert actions.read_notes(ws, env={}, now=NOW)["notes"] == []
    assert actions.whiteboard_read(ws, env={}, now=NOW)["entries"] == []
    for verb in ("list-agents", "read-notes", "whiteboard-read"):
        done = cli(verb, state=ws.root)
        assert done.returncode == 0, done.stderr
    assert cli("note", "x", state=ws.root).returncode == 6
    assert cli("list-agents", "--agent-id", "bob", "--run-token", "nope", state=ws.root).returncode == 7


def test_no_identity_at_all(ws):
    with pytest.raises(NoIdentityError):
        identity.resolve(ws, Who(), env={})
    with pytest.raises(NoIdentityError):
        actions.signal(ws, None, "*", "x", env={})
    assert identity.resolve(ws, Who(), env={}, required=False) is None


def test_agent_without_session_finds_its_registered_session(start_agent, ws):
    start_agent("alice")
    b = start_agent("bob", new_session=True)
    caller = identity.resolve(ws, Who("bob"), env={}, now=NOW)
    assert caller.session_id == b["session_id"]
    # a heartbeat naming a wrong session does not mislead it
    hb = json.loads(ws.paths.heartbeat("bob").read_text())
    hb["session_id"] = "elsewhere"
    ws.paths.heartbeat("bob").write_text(json.dumps(hb))
    assert identity.resolve(ws, Who("bob"), env={}, now=NOW).session_id == b["session_id"]


def test_unregistered_agent_cannot_act_in_a_session(start_agent, ws):
    a = start_agent("alice")
    with pytest.raises(NoIdentityError, match="not registered"):
        actions.signal(ws, Who("mallory", a["session_id"]), "alice", "hi", env={}, now=NOW)


def test_bare_beat_without_any_session_writes_the_heartbeat(ws):
    out = actions.beat(ws, Who("loner"), task="solo", env={}, now=NOW)
    assert out["registered"] is False and out["pending_signals"] == []
    doc = json.loads(ws.paths.heartbeat("loner").read_text())
    assert doc["task"] == "solo" and doc["status"] == "active" and "session_id" not in doc


def test_malformed_names_in_options_and_env(ws):
    with pytest.raises(UsageError):
        identity.resolve(ws, Who("../x"), env={})
    with pytest.raises(UsageError):
        identity.resolve(ws, Who("a", ".."), env={})
    with pytest.raises(UsageError):
        identity.resolve(ws, Who(), env={"SYNAPOLIS_AGENT_ID": "a/b"})


def test_broken_identity_file_is_no_identity(ws):
    ws.paths.identity.write_text("{not json")
    with pytest.raises(NoIdentityError):
        identity.resolve(ws, Who(), env={})


def test_wrong_token_is_always_refused(start_agent, ws):
    a = start_agent("alice")
    with pytest.raises(ForbiddenError):
        actions.signal(ws, Who("alice", a["session_id"], "wrong"), "*", "x", env={}, now=NOW)
    with pytest.raises(ForbiddenError):
        actions.read_signals(ws, Who("alice", a["session_id"], "wrong"), env={}, now=NOW)
    # a token in the environment applies to the environment's agent only
    env = {"SYNAPOLIS_AGENT_ID": "bob", "SYNAPOLIS_RUN_TOKEN": "bobs-token"}
    caller = identity.resolve(ws, Who("alice", a["session_id"]), env=env, now=NOW)
    assert caller.run_token == a["run_token"]  # identity.json's, which names alice; never bob's


def test_require_run_token(start_agent, ws):
    a = start_agent("alice")
    start_agent("bob")
    ws = _config(ws, require_run_token=True)
    sid = a["session_id"]
    with pytest.raises(ForbiddenError, match="require_run_token"):
        actions.signal(ws, Who("alice", sid), "bob", "x", env={}, now=NOW)
    with pytest.raises(ForbiddenError):
        actions.note(ws, Who("alice", sid), "x", env={}, now=NOW)
    sent = actions.signal(ws, Who("alice", sid, a["run_token"]), "bob", "x", env={}, now=NOW)
    assert sent["signal"]["sender"] == "alice"
    env = {"SYNAPOLIS_AGENT_ID": "alice", "SYNAPOLIS_SESSION_ID": sid, "SYNAPOLIS_RUN_TOKEN": a["run_token"]}
    assert actions.note(ws, None, "from env", env=env, now=NOW)["note"]["agent_id"] == "alice"
    # a pure query is not a mutation
    assert actions.read_signals(ws, Who("bob", sid), env={}, now=NOW)["signals"]


def test_cli_identity_exit_codes(cli):
    assert cli("signal", "*", "x").returncode == 4
    assert cli("start", "--agent-id", "alice").returncode == 0
    assert cli("start", "--agent-id", "bob").returncode == 0
    ambiguous = cli("signal", "*", "x", "--json")
    assert ambiguous.returncode == 4
    assert json.loads(ambiguous.stdout)["error"]["type"] == "AmbiguousIdentityError"
    assert cli("signal", "*", "x", env={"SYNAPOLIS_AGENT_ID": "alice"}).returncode == 0
    assert cli("list-agents").returncode == 0
    assert cli("signal", "*", "x", "--agent-id", "alice", "--run-token", "nope").returncode == 7
