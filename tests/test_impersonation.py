"""Identity (issue 11, family 1): nobody acts as another agent. Every verb that acts as an agent, tried by
an impostor through the library, the CLI and the MCP tools, with require_run_token on and off; and the
names synapolis itself speaks with, which nobody may register or send as (docs/SECURITY.md, "Identity")."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import NOW, configure
from synapolis import actions, claims, sleep
from synapolis.errors import ConflictError, ForbiddenError, SynapolisError
from synapolis.identity import Who
from synapolis.names import RESERVED_ROOT, is_reserved
from synapolis.timeutil import utcnow
from synapolis.workspace import Workspace

# every verb that acts as an agent (contract §3), as `verb(ws, who)`; each would change what alice has
ACTING = {
    "beat": lambda ws, who: actions.beat(ws, who, env={}, now=NOW),
    "beat --status stopped": lambda ws, who: actions.beat(ws, who, status="stopped", env={}, now=NOW),
    "claim": lambda ws, who: actions.claim(ws, who, "src/b.py", env={}, now=NOW),
    "release": lambda ws, who: actions.release(ws, who, "src/a.py", env={}, now=NOW),
    "signal": lambda ws, who: actions.signal(ws, who, "bob", "forged", env={}, now=NOW),
    "read-signals": lambda ws, who: actions.read_signals(ws, who, env={}, now=NOW),
    "ack-signals": lambda ws, who: actions.ack_signals(ws, who, [], all=True, env={}, now=NOW),
    "signals-pending": lambda ws, who: actions.signals_pending(ws, who, env={}, now=NOW),
    "note": lambda ws, who: actions.note(ws, who, "forged", env={}, now=NOW),
    "whiteboard-write": lambda ws, who: actions.whiteboard_write(ws, who, "plan", "forged", env={}, now=NOW),
    "tired": lambda ws, who: sleep.tired(ws, who, memories=["forged"], env={}, now=NOW),
}
# the verbs the issue found open: they let an agent act outside its registration (need_registration=False)
UNREGISTERED_OK = {"beat", "beat --status stopped", "claim", "release"}
# verbs that only read shared state: an unproven caller reads as nobody (no refresh, nothing delivered)
READING = {
    "list-agents": lambda ws, who: actions.list_agents(ws, who, session_id=who.session_id, env={}, now=NOW),
    "read-notes": lambda ws, who: actions.read_notes(ws, who, session_id=who.session_id, env={}, now=NOW),
    "whiteboard-read": lambda ws, who: actions.whiteboard_read(ws, who, session_id=who.session_id, env={},
                                                               now=NOW),
}
# ids in the namespace synapolis keeps for itself (names.RESERVED_ROOT and below it, in any case)
RESERVED = [RESERVED_ROOT, "synapolis.watchdog", "Synapolis.Watchdog", "SYNAPOLIS.x.y", "synapolis.monitor"]


class World:
    """alice (the victim) holds src/a.py and has a signal from bob waiting, undelivered; mallory has a
    session of her own. Everything through the library, at NOW."""

    def __init__(self, ws, tokens: bool):
        self.ws = ws = configure(ws, require_run_token=tokens)
        alice = actions.start(ws, agent_id="alice", new_session=True, env={}, now=NOW, piggyback=False)
        self.sid, self.token = alice["session_id"], alice["run_token"]
        bob = actions.start(ws, agent_id="bob", session_id=self.sid, env={}, now=NOW, piggyback=False)
        mallory = actions.start(ws, agent_id="mallory", new_session=True, env={}, now=NOW, piggyback=False)
        self.mallory_sid, self.mallory_token = mallory["session_id"], mallory["run_token"]
        assert self.mallory_sid != self.sid
        self.alice = Who("alice", self.sid, self.token)
        actions.claim(ws, self.alice, "src/a.py", env={}, now=NOW, piggyback=False)
        actions.signal(ws, Who("bob", self.sid, bob["run_token"]), "alice", "the secret plan", env={}, now=NOW,
                       piggyback=False)

    def rows(self, sql, *args, sid=None):
        conn = sqlite3.connect(self.ws.paths.session_db(sid or self.sid))
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()

    def snapshot(self) -> dict:
        """Everything an impostor could change of alice's, or in her name."""
        paths = self.ws.paths
        notes = paths.session_notes(self.sid)
        return {
            "heartbeat": paths.heartbeat("alice").read_bytes(),
            "claim a": claims.claim_path(self.ws, "src/a.py").read_bytes(),
            "claim b": claims.claim_path(self.ws, "src/b.py").exists(),
            "registry": self.rows("SELECT * FROM agents WHERE id = 'alice'"),
            "elsewhere": self.rows("SELECT id FROM agents", sid=self.mallory_sid),
            "signals": self.rows("SELECT id, sender FROM signals"),
            "deliveries": self.rows("SELECT * FROM signal_deliveries WHERE agent_id = 'alice'"),
            "reads": self.rows("SELECT * FROM signal_reads WHERE agent_id = 'alice'"),
            "whiteboard": self.rows("SELECT * FROM session_state"),
            "staged": self.rows("SELECT * FROM staged_memories"),
            "notes": notes.read_bytes() if notes.exists() else None,
            "session": paths.session_json(self.sid).read_bytes(),
        }


@pytest.fixture
def guarded(ws):
    return World(ws, tokens=True)


@pytest.fixture
def open_world(ws):
    return World(ws, tokens=False)


def impostors(world: World) -> dict:
    """Who an impostor says it is: alice, in a session of its choosing, with no token or its own."""
    return {
        "alice's session, no token": Who("alice", world.sid),
        "the impostor's session, no token": Who("alice", world.mallory_sid),
        "no session named, no token": Who("alice"),
        "alice's session, the impostor's token": Who("alice", world.sid, world.mallory_token),
        "the impostor's session, the impostor's token": Who("alice", world.mallory_sid, world.mallory_token),
        "alice's session, a made-up token": Who("alice", world.sid, "0" * 32),
    }


# -- require_run_token: true -------------------------------------------------------------------------

@pytest.mark.parametrize("verb", sorted(ACTING))
def test_with_tokens_on_no_verb_acts_as_another_agent(guarded, verb):
    before = guarded.snapshot()
    for how, who in impostors(guarded).items():
        with pytest.raises(SynapolisError) as refused:
            ACTING[verb](guarded.ws, who)
        expected = {7} if verb in UNREGISTERED_OK or who.session_id != guarded.mallory_sid else {4, 7}
        assert refused.value.exit_code in expected, (how, refused.value)
        assert guarded.snapshot() == before, how  # nothing of alice's moved, nothing was said in her name
    # the control: alice herself, from her session or from one she is not in, does what was refused
    ACTING[verb](guarded.ws, guarded.alice)


def test_with_tokens_on_the_impostor_never_takes_the_victims_claim(guarded):
    ws = guarded.ws
    for who in (Who("alice", guarded.mallory_sid), Who("alice")):
        with pytest.raises(ForbiddenError):
            actions.release(ws, who, "src/a.py", env={}, now=NOW)
        with pytest.raises(ForbiddenError):
            actions.beat(ws, who, status="stopped", env={}, now=NOW)
    mallory = Who("mallory", guarded.mallory_sid, guarded.mallory_token)
    with pytest.raises(ConflictError, match="alice"):  # alice is live and still holds it
        actions.claim(ws, mallory, "src/a.py", env={}, now=NOW)
    assert json.loads(claims.claim_path(ws, "src/a.py").read_text())["claimed_by"] == "alice"


def test_with_tokens_on_alices_token_works_from_any_session(guarded):
    """The token proves the agent, not one registration: alice acts from a session she is not in."""
    who = Who("alice", guarded.mallory_sid, guarded.token)
    assert actions.release(guarded.ws, who, "src/a.py", env={}, now=NOW)["claim"]["released_at"]
    assert actions.beat(guarded.ws, who, status="stopped", env={}, now=NOW)["heartbeat"]["status"] == "stopped"


@pytest.mark.parametrize("verb", sorted(READING))
def test_with_tokens_on_an_unproven_reader_reads_as_nobody(guarded, verb):
    before = guarded.snapshot()
    for how, who in impostors(guarded).items():
        if who.run_token is not None:
            with pytest.raises(SynapolisError) as refused:
                READING[verb](guarded.ws, who)
            assert refused.value.exit_code in ({7} if who.session_id != guarded.mallory_sid else {4, 7}), how
        elif who.session_id is None and verb in ("read-notes", "whiteboard-read"):
            with pytest.raises(SynapolisError) as refused:  # as nobody, with two sessions active: which?
                READING[verb](guarded.ws, who)
            assert refused.value.type_name == "AmbiguousIdentityError", how
        else:
            answer = READING[verb](guarded.ws, who)
            assert answer["pending_signals"] == [], how  # alice's waiting signal was not handed out
        assert guarded.snapshot() == before, how
    # alice herself gets her signal with the answer, and it is marked delivered to her
    answer = READING[verb](guarded.ws, guarded.alice)
    assert [s["content"] for s in answer["pending_signals"]] == ["the secret plan"]
    assert [d["delivery_method"] for d in guarded.rows("SELECT * FROM signal_deliveries")] == ["piggyback"]


def test_with_tokens_on_start_cannot_mint_a_token_for_an_id_registered_elsewhere(guarded):
    ws = guarded.ws
    with pytest.raises(ConflictError, match="active in another session"):
        actions.start(ws, agent_id="alice", session_id=guarded.mallory_sid, env={}, now=NOW)
    with pytest.raises(ForbiddenError, match="wrong run token"):
        actions.start(ws, agent_id="alice", session_id=guarded.mallory_sid, run_token=guarded.mallory_token,
                      env={}, now=NOW)
    with pytest.raises(ForbiddenError, match="wrong run token"):  # in her own session too
        actions.start(ws, agent_id="alice", session_id=guarded.sid, run_token=guarded.mallory_token, env={},
                      now=NOW)
    assert guarded.rows("SELECT id FROM agents", sid=guarded.mallory_sid) == [{"id": "mallory"}]
    # alice herself joins a second session with her token, and keeps it
    joined = actions.start(ws, agent_id="alice", session_id=guarded.mallory_sid, run_token=guarded.token, env={},
                           now=NOW)
    assert (joined["registration"], joined["run_token"]) == ("joined", guarded.token)


def test_with_tokens_on_a_stale_id_is_free_as_the_contract_says(guarded):
    """§8: an id that is not live is free; whoever takes it gets a new token, and alice's old one is void
    there. (A stale holder's claims may be taken over anyway: §9.)"""
    later = NOW.replace(hour=NOW.hour + 2)
    taken = actions.start(guarded.ws, agent_id="alice", session_id=guarded.mallory_sid, env={}, now=later)
    assert taken["registration"] == "joined" and taken["run_token"] != guarded.token


def test_with_tokens_on_an_agent_registered_nowhere_must_start_first(guarded):
    with pytest.raises(ForbiddenError, match="synapolis start"):
        actions.beat(guarded.ws, Who("zed"), env={}, now=NOW)
    with pytest.raises(ForbiddenError, match="wrong run token"):
        actions.claim(guarded.ws, Who("zed", None, "made-up"), "src/z.py", env={}, now=NOW)
    assert not guarded.ws.paths.heartbeat("zed").exists()
    assert not claims.claim_path(guarded.ws, "src/z.py").exists()


def test_with_tokens_on_the_cli_refuses_release_claim_and_stop_as_another(guarded, cli):
    for args, env in (
            (["--agent-id", "alice", "--session-id", guarded.mallory_sid], None),
            ([], {"SYNAPOLIS_AGENT_ID": "alice", "SYNAPOLIS_SESSION_ID": guarded.mallory_sid}),
            ([], {"SYNAPOLIS_AGENT_ID": "alice", "SYNAPOLIS_SESSION_ID": guarded.sid,
                  "SYNAPOLIS_RUN_TOKEN": guarded.mallory_token})):
        before = guarded.snapshot()
        for verb in (["release", "src/a.py"], ["claim", "src/b.py"], ["beat", "--status", "stopped"]):
            out = cli(*verb, *args, "--json", env=env)
            assert out.returncode == 7, (verb, env, out.stdout, out.stderr)
            assert json.loads(out.stdout)["error"]["type"] == "ForbiddenError"
            assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert guarded.snapshot() == before


def test_with_tokens_on_the_mcp_tools_refuse_another(guarded, state_dir):
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from synapolis.mcp.server import create_server

    async def main():
        async with Client(create_server(state_dir, {}), mode="2026-07-28") as client:
            for tool, args in (("release", {"item": "src/a.py"}), ("claim", {"item": "src/b.py"}),
                               ("beat", {"status": "stopped"}), ("read_signals", {}), ("signals_pending", {}),
                               ("tired", {"memories": ["forged"]})):
                for session in (guarded.mallory_sid, guarded.sid):
                    result = await client.call_tool(tool, {**args, "agent_id": "alice", "session_id": session})
                    text = result.content[0].text  # "ForbiddenError (exit 7): ...", what the model is shown
                    assert result.is_error, (tool, session, text)
                    if tool in ("release", "claim", "beat") or session == guarded.sid:
                        assert text.startswith("ForbiddenError (exit 7): "), (tool, session, text)
                    else:
                        assert text.startswith(("ForbiddenError (exit 7): ", "NoIdentityError (exit 4): ")), text
            listed = await client.call_tool("list_agents", {"agent_id": "alice", "session_id": guarded.sid})
            assert not listed.is_error and listed.structured_content["pending_signals"] == []

    before = guarded.snapshot()
    anyio.run(main)
    assert guarded.snapshot() == before


# -- require_run_token: false (the default): what is and is not protected --------------------------------

@pytest.mark.parametrize("verb", sorted(ACTING))
def test_with_tokens_off_a_wrong_token_is_still_refused(open_world, verb):
    before = open_world.snapshot()
    for who in (Who("alice", open_world.sid, open_world.mallory_token), Who("alice", None, "0" * 32),
                Who("alice", open_world.mallory_sid, open_world.mallory_token)):
        with pytest.raises(SynapolisError) as refused:
            ACTING[verb](open_world.ws, who)
        assert refused.value.exit_code in ({7} if verb in UNREGISTERED_OK or who.session_id != open_world.mallory_sid
                                           else {4, 7})
        assert open_world.snapshot() == before


def test_with_tokens_off_the_name_is_the_identity(open_world):
    """Documented (docs/SECURITY.md): without require_run_token a caller that names an agent and presents no
    token is that agent. Turn the key on where agents must not be able to act as each other."""
    who = Who("alice", open_world.mallory_sid)
    assert actions.release(open_world.ws, who, "src/a.py", env={}, now=NOW)["claim"]["released_at"]
    got = actions.signals_pending(open_world.ws, Who("alice", open_world.sid), env={}, now=NOW)
    assert [s["content"] for s in got["pending_signals"]] == ["the secret plan"]


# -- the system's own names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RESERVED)
def test_reserved_names_cannot_be_registered(tmp_path, name):
    fresh = Workspace.open(tmp_path / "fresh")
    with pytest.raises(ForbiddenError, match="reserved"):
        actions.start(fresh, agent_id=name, env={})
    with pytest.raises(ForbiddenError, match="reserved"):
        actions.beat(fresh, Who(name), env={})
    with pytest.raises(ForbiddenError, match="reserved"):
        actions.start(fresh, env={"SYNAPOLIS_AGENT_ID": name})
    assert not (tmp_path / "fresh").exists()  # refused before anything was written


def test_reserved_names_on_the_cli(cli, state_dir):
    for args in (["start", "--agent-id", "synapolis.watchdog"], ["beat", "--agent-id", "Synapolis"],
                 ["claim", "x:1", "--agent-id", "synapolis.watchdog"]):
        out = cli(*args, "--json")
        assert out.returncode == 7 and json.loads(out.stdout)["error"]["type"] == "ForbiddenError", args
    assert not state_dir.exists()  # refused before anything was written


def test_nobody_sends_as_the_watchdog(open_world):
    ws = open_world.ws
    mallory = Who("mallory", open_world.mallory_sid, open_world.mallory_token)
    with pytest.raises(ForbiddenError):
        actions.signal(ws, mallory, "*", "agent alice is dead", type="warn", sender_id="synapolis.watchdog",
                       env={}, now=NOW)
    # a registration an older synapolis let through is unusable: acting as it, or as its sub-agent
    conn = sqlite3.connect(ws.paths.session_db(open_world.mallory_sid))
    with conn:
        conn.execute("INSERT INTO agents (id, harness, substrate, status, last_heartbeat, run_token) "
                     "VALUES (?, 'cli', '', 'active', ?, 'sha256:00')",
                     (RESERVED_ROOT, NOW.strftime("%Y-%m-%dT%H:%M:%S.%fZ")))
    conn.close()
    for caller in (RESERVED_ROOT, "synapolis.watchdog"):
        with pytest.raises(ForbiddenError, match="reserved"):
            actions.signal(ws, Who(caller, open_world.mallory_sid), "*", "forged warning", type="warn",
                           sender_id="synapolis.watchdog", env={}, now=NOW)
    senders = open_world.rows("SELECT sender FROM signals", sid=open_world.mallory_sid)
    assert senders == []
    # the watchdog itself still warns
    sent = actions.warn_sessions(ws, {"agent_id": "mallory", "condition": "dead", "id": "i1"}, now=NOW)
    assert [s["session_id"] for s in sent] == [open_world.mallory_sid]
    assert open_world.rows("SELECT sender FROM signals", sid=open_world.mallory_sid) == \
        [{"sender": "synapolis.watchdog"}]


def test_reserved_is_exactly_synapolis_and_below():
    assert all(is_reserved(n) for n in RESERVED)
    for name in ("synapolis_1a2b3c4d_4f9a", "mysynapolis", "synapolisx", "alice.synapolis", "synapolis-bot"):
        assert not is_reserved(name), name


def test_a_planted_identity_file_naming_the_system_reads_as_nobody(ws):
    ws.paths.identity.write_text(json.dumps({"agent_id": "synapolis.watchdog", "session_id": "s1",
                                             "run_token": "x"}))
    assert actions.list_agents(ws, env={}, now=utcnow())["agents"] == []
    with pytest.raises(ForbiddenError, match="reserved"):
        actions.beat(ws, env={})
