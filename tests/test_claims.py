"""Claims (§9): names and files, leases, take-over, release rules, fencing checks, reaping, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta

import pytest

from conftest import ago, claim_events, NOW, synapolis_cmd, wait_until
from synapolis import claims
from synapolis.errors import (BusyError, ConflictError, ForbiddenError, NotFoundError, StaleToken,
                              UsageError)
from synapolis.schemas import validation_errors
from synapolis.store import store_for
from synapolis.timeutil import format_ts, utcnow
from synapolis.workspace import Workspace

BAD_ITEMS = ["../x", "/abs", "a//b", "", "a" * 500, "..", "a/../b", "a/..", "x y", "é", "-x", "./x", "src/[ab",
             "a\\b", "~root", "ticket:1\n", "t:1\x00"]


def tree(root):
    """Every file and folder below `root` with its bytes: what 'nothing written' compares."""
    if not root.exists():
        return None
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(folder, name), root)] = "dir"
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


def real_ago(seconds: float) -> str:
    return format_ts(utcnow() - timedelta(seconds=seconds))


def schema_ok(ws, item):
    """The item's stored record (the claim file, or the database's row), valid against the claim schema."""
    doc, existed = store_for(ws).claim_document(item)
    assert existed and validation_errors("claim", doc) == []
    return doc


def events(ws):
    return claim_events(ws)


# --- names and files ------------------------------------------------------------------------------

@pytest.mark.sqlite_only  # the claim files themselves
@pytest.mark.parametrize("item", ["ticket:142", "src/api/users.py", "a@b+c", "x" * 200, "a:",
                                  "a" + ":" * 199, "a" + "/b" * 99, "A.b-c_d"])
def test_encoding_stays_in_the_folder_and_under_name_limits(ws, item):
    path = claims.claim_path(ws, item)
    assert path.parent == ws.paths.claims
    assert len(path.name.encode()) <= 200
    assert "/" not in path.name and not path.name.startswith(".")
    claims.claim(ws, item, "alice", now=NOW)
    assert path.is_file()
    assert schema_ok(ws, item)["item"] == item
    lock_names = os.listdir(ws.paths.locks)
    assert all(len(n.encode()) <= 255 for n in lock_names)


def test_encoding_is_injective_even_when_truncated():
    long_a, long_b = "a" + ":" * 198 + "b", "a" + ":" * 198 + "c"
    names = {claims.encode_item(i) for i in ("a:b", "a%3Ab", "a/b", "a%2Fb", "A:b", long_a, long_b)}
    assert len(names) == 7
    assert "~" in claims.encode_item(long_a) and "~" not in claims.encode_item("a" * 180)


@pytest.mark.parametrize("item", BAD_ITEMS)
def test_malformed_items_write_nothing_library(state_dir, item):
    ws = Workspace.open(state_dir)
    for call in (lambda: claims.claim(ws, item, "alice"), lambda: claims.release(ws, item, "alice"),
                 lambda: claims.check(ws, item, 1), lambda: claims.held(item, agent_id="alice", ws=ws)):
        with pytest.raises(UsageError):
            call()
    assert not state_dir.exists()


# (`a//b` and `./a` are normalised by the CLI to `a/b` and `a` (contract §14); `/abs` lies outside the project)
CLI_BAD_ITEMS = ["../x", "/abs", "a b", "", "a" * 500, "a/../b", "..", "../../etc/passwd", "src/[ab"]


def test_malformed_items_exit_2_and_nothing_written_cli(cli, state_dir):
    for item in CLI_BAD_ITEMS:
        for args in (["claim", item, "--agent-id", "alice"],
                     ["release", item, "--agent-id", "alice", "--force", "--reason", "x"],
                     ["claim-check", item, "--token", "1"]):
            result = cli(*args, "--json")
            assert result.returncode == 2, (args, result.stderr)
            assert json.loads(result.stdout)["error"]["type"] == "UsageError"
            assert "Traceback" not in result.stderr
    assert not state_dir.exists()
    # in an existing state directory nothing changes either, not even the caller's heartbeat
    assert cli("claim", "ok:1", "--agent-id", "alice").returncode == 0
    before = tree(state_dir)
    for item in CLI_BAD_ITEMS[:4]:
        assert cli("claim", item, "--agent-id", "alice").returncode == 2
        assert cli("release", item, "--agent-id", "alice").returncode == 2
    assert tree(state_dir) == before
    assert not (state_dir.parent / "x").exists() and not (state_dir.parent / "abs").exists()


def test_malformed_names_and_options_exit_2_before_any_write(cli, state_dir):
    for args in (["claim", "t:1", "--agent-id", ""], ["claim", "t:1", "--agent-id", "../a"],
                 ["claim", "t:1", "--agent-id", "a", "--session-id", ".."],
                 ["claim", "t:1", "--agent-id", "a", "--ttl", "0"], ["claim", "t:1", "--agent-id", "a", "--ttl", "-5"],
                 ["claim", "t:1", "--agent-id", "a", "--ttl", "nan"], ["claim", "t:1", "--agent-id", "a", "--ttl", "1e300"],
                 ["claim", "t:1", "--agent-id", "a", "--wait", "-1"], ["claim", "t:1", "--agent-id", "a", "--ttl", "x"],
                 ["release", "t:1", "--agent-id", "a", "--force"],
                 ["release", "t:1", "--agent-id", "a", "--force", "--reason", "   "],
                 ["claim-check", "t:1", "--token", "abc"], ["claim-check", "t:1"]):
        result = cli(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert not state_dir.exists()


def test_no_identity_is_exit_4(cli, state_dir):
    result = cli("claim", "t:1", "--json")
    assert result.returncode == 4
    assert json.loads(result.stdout)["error"]["type"] == "NoIdentityError"
    assert cli("claim", "t:1", env={"SYNAPOLIS_AGENT_ID": "envy"}).returncode == 0
    assert claims.list_claims(Workspace.open(state_dir))[0]["claimed_by"] == "envy"


@pytest.mark.sqlite_only  # the claim files themselves
def test_case_collision_is_refused_not_merged(ws):
    claims.claim(ws, "ticket:1", "alice", now=NOW)
    # what a case-insensitive filesystem would show: another item's record under our name
    doc = json.loads(claims.claim_path(ws, "ticket:1").read_text())
    doc["item"] = "Ticket:1"
    claims.claim_path(ws, "ticket:1").write_text(json.dumps(doc))
    with pytest.raises(ConflictError, match="shares its file"):
        claims.claim(ws, "ticket:1", "bob", now=NOW)


# --- leases, renewal, take-over -------------------------------------------------------------------

def test_claim_record_renewal_and_conflict(ws, put_heartbeat):
    put_heartbeat("alice", ago(0))
    put_heartbeat("bob", ago(0))
    first = claims.claim(ws, "ticket:142", "alice", session_id="s1", ttl_s=600, now=NOW)
    assert first.event == "claimed"
    assert {k: first[k] for k in ("item", "claimed_by", "session_id", "token", "claimed_at", "renewed_at",
                                  "released_at", "taken_over_from")} == {
        "item": "ticket:142", "claimed_by": "alice", "session_id": "s1", "token": 1,
        "claimed_at": ago(0), "renewed_at": None, "released_at": None, "taken_over_from": None}
    assert first["expires_at"] == ago(-600)
    again = claims.claim(ws, "ticket:142", "alice", ttl_s=600, now=NOW + timedelta(seconds=100))
    assert again.event == "renewed" and again["token"] == 1
    assert again["renewed_at"] == ago(-100) and again["expires_at"] == ago(-700)
    assert again["session_id"] == "s1"
    with pytest.raises(ConflictError) as err:
        claims.claim(ws, "ticket:142", "bob", now=NOW + timedelta(seconds=200))
    assert "alice" in err.value.message and ago(-700) in err.value.message
    assert err.value.exit_code == 3 and err.value.details["holder"] == "alice"
    doc = schema_ok(ws, "ticket:142")
    assert doc["claimed_by"] == "alice" and doc["token"] == 1
    assert [e["event"] for e in events(ws)] == ["claimed", "renewed"]


def test_renewals_collapse_in_the_file_but_each_is_logged(ws):
    claims.claim(ws, "t:1", "alice", now=NOW)
    for i in range(1, 6):
        claims.claim(ws, "t:1", "alice", now=NOW + timedelta(seconds=i))
    doc = schema_ok(ws, "t:1")
    assert [t["event"] for t in doc["transitions"]] == ["claimed", "renewed"]
    assert doc["transitions"][-1]["count"] == 5
    assert len(events(ws)) == 6


def test_take_over_from_expired_lease(ws, put_heartbeat):
    put_heartbeat("alice", ago(-100))  # alive throughout
    claims.claim(ws, "t:1", "alice", ttl_s=60, now=NOW)
    with pytest.raises(ConflictError):
        claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=59))
    record = claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=60))
    assert record.event == "taken_over" and record["token"] == 2
    assert record["taken_over_from"]["agent_id"] == "alice"
    assert record["taken_over_from"]["reason"] == "expired" and record["taken_over_from"]["token"] == 1
    assert [t["event"] for t in record["transitions"]] == ["claimed", "taken_over"]
    schema_ok(ws, "t:1")
    with pytest.raises(StaleToken):
        claims.check(ws, "t:1", 1, now=NOW + timedelta(seconds=61))


@pytest.mark.parametrize("heartbeat, expected", [
    ({"beat_at": ago(400)}, "stale"),
    ({"beat_at": ago(7200)}, "dead"),
    ({"beat_at": ago(0), "status": "stopped"}, "stopped"),
    (None, "missing"),
    ("garbage", "invalid"),
])
def test_take_over_from_a_gone_holder(ws, put_heartbeat, heartbeat, expected):
    claims.claim(ws, "t:1", "alice", ttl_s=3600, now=NOW - timedelta(seconds=10))
    if isinstance(heartbeat, dict):
        put_heartbeat("alice", **heartbeat)
    elif heartbeat == "garbage":
        ws.paths.heartbeat("alice").write_text("{not json")
    record = claims.claim(ws, "t:1", "bob", now=NOW)
    assert record.event == "taken_over" and record["token"] == 2
    assert record["taken_over_from"]["reason"] == expected
    assert events(ws)[-1]["reason"] == expected and events(ws)[-1]["from"] == "alice"
    schema_ok(ws, "t:1")


@pytest.mark.parametrize("status", ["active", "idle", "sleeping"])
def test_no_take_over_from_a_live_holder(ws, put_heartbeat, status):
    put_heartbeat("alice", ago(10), status=status)
    claims.claim(ws, "t:1", "alice", now=NOW - timedelta(seconds=10))
    with pytest.raises(ConflictError, match=status):
        claims.claim(ws, "t:1", "bob", now=NOW)


def test_own_expired_lease_gets_a_new_token(ws, put_heartbeat):
    put_heartbeat("alice", ago(0))
    claims.claim(ws, "t:1", "alice", ttl_s=10, now=NOW)
    record = claims.claim(ws, "t:1", "alice", now=NOW + timedelta(seconds=11))
    # a token that stopped being live never becomes live again
    assert record.event == "claimed" and record["token"] == 2 and record["taken_over_from"] is None


def test_renew_keeps_the_token_and_refuses_a_lost_lease(ws, put_heartbeat):
    rec = claims.claim(ws, "t:1", "alice", ttl_s=10, now=NOW)
    renewed = claims.renew(ws, "t:1", "alice", rec["token"], ttl_s=10, now=NOW + timedelta(seconds=5))
    assert renewed["token"] == 1 and renewed["expires_at"] == ago(-15)
    with pytest.raises(StaleToken):
        claims.renew(ws, "t:1", "alice", 1, ttl_s=10, now=NOW + timedelta(seconds=16))
    with pytest.raises(StaleToken):
        claims.renew(ws, "t:1", "bob", 1, now=NOW + timedelta(seconds=6))
    with pytest.raises(NotFoundError):
        claims.renew(ws, "t:9", "alice", 1, now=NOW)


# --- release ---------------------------------------------------------------------------------------

def test_release_rules(ws, put_heartbeat):
    put_heartbeat("alice", ago(0))
    with pytest.raises(NotFoundError):
        claims.release(ws, "t:1", "alice", now=NOW)
    assert not ws.paths.locks.exists() or not os.listdir(ws.paths.locks)
    claims.claim(ws, "t:1", "alice", now=NOW)
    with pytest.raises(ForbiddenError) as err:
        claims.release(ws, "t:1", "bob", now=NOW)
    assert err.value.exit_code == 7 and not isinstance(err.value, StaleToken)
    with pytest.raises(UsageError):
        claims.release(ws, "t:1", "bob", force=True, now=NOW)
    with pytest.raises(UsageError):
        claims.release(ws, "t:1", "bob", force=True, reason="x" * 5000, now=NOW)
    forced = claims.release(ws, "t:1", "bob", force=True, reason="alice crashed", now=NOW + timedelta(seconds=1))
    assert forced.event == "force_released"
    assert forced["released_by"] == "bob" and forced["release_reason"] == "alice crashed"
    assert forced["claimed_by"] == "alice" and forced["released_at"] == ago(-1)
    again = claims.release(ws, "t:1", "alice", now=NOW + timedelta(seconds=2))
    assert again.event is None and again["released_at"] == ago(-1)
    schema_ok(ws, "t:1")
    reclaimed = claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=3))
    assert reclaimed.event == "claimed" and reclaimed["token"] == 2 and reclaimed["released_at"] is None
    own = claims.release(ws, "t:1", "bob", now=NOW + timedelta(seconds=4))
    assert own.event == "released"
    assert [e["event"] for e in events(ws)] == ["claimed", "force_released", "claimed", "released"]


def test_release_with_a_stale_token_is_refused(ws):
    claims.claim(ws, "t:1", "alice", ttl_s=10, now=NOW)
    claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=20))  # alice has no heartbeat: taken over
    with pytest.raises(StaleToken):
        claims.release(ws, "t:1", "alice", token=1, now=NOW + timedelta(seconds=21))
    assert claims.check(ws, "t:1", 2, now=NOW + timedelta(seconds=21))["claimed_by"] == "bob"


# --- fencing check ----------------------------------------------------------------------------------

def test_check_codes_library(ws):
    with pytest.raises(NotFoundError):
        claims.check(ws, "t:1", 1, now=NOW)
    claims.claim(ws, "t:1", "alice", ttl_s=100, now=NOW)
    assert claims.check(ws, "t:1", 1, now=NOW)["token"] == 1
    for token in (0, 2, -1):
        with pytest.raises(StaleToken):
            claims.check(ws, "t:1", token, now=NOW)
    with pytest.raises(StaleToken, match="expired"):
        claims.check(ws, "t:1", 1, now=NOW + timedelta(seconds=100))
    with pytest.raises(UsageError):
        claims.check(ws, "t:1", "1", now=NOW)
    claims.release(ws, "t:1", "alice", now=NOW + timedelta(seconds=1))
    with pytest.raises(StaleToken, match="released"):
        claims.check(ws, "t:1", 1, now=NOW + timedelta(seconds=2))


def test_claim_check_cli_exit_codes(cli, state_dir):
    assert cli("claim-check", "t:1", "--token", "1").returncode == 6
    assert cli("claim", "t:1", "--agent-id", "alice").returncode == 0
    live = cli("claim-check", "t:1", "--token", "1", "--json")
    assert live.returncode == 0 and json.loads(live.stdout)["claim"]["claimed_by"] == "alice"
    stale = cli("claim-check", "t:1", "--token", "2", "--json")
    assert stale.returncode == 7 and json.loads(stale.stdout)["error"]["type"] == "ForbiddenError"
    assert cli("release", "t:1", "--agent-id", "alice").returncode == 0
    assert cli("claim-check", "t:1", "--token", "1").returncode == 7


# --- listing and reaping --------------------------------------------------------------------------

def test_list_claims_states_and_broken_files(ws, put_heartbeat):
    put_heartbeat("alice", ago(0))
    put_heartbeat("dora", ago(7200))
    claims.claim(ws, "a:held", "alice", now=NOW)
    claims.claim(ws, "b:expired", "alice", ttl_s=5, now=NOW - timedelta(seconds=10))
    claims.claim(ws, "c:released", "alice", now=NOW)
    claims.release(ws, "c:released", "alice", now=NOW)
    claims.claim(ws, "d:dead", "dora", now=NOW)
    on_files = store_for(ws).kind == "sqlite"
    if on_files:  # a broken claim file and a stray temporary one
        (ws.paths.claims / "zz%3Abroken.json").write_text("{half a rec")
        (ws.paths.claims / ".tmp-a%3Aheld.json.123.abcd.tmp").write_text("{")
    listed = claims.list_claims(ws, NOW)
    by_item = {e["item"]: e for e in listed}
    assert by_item["a:held"]["state"] == "held" and by_item["a:held"]["holder_status"] == "active"
    assert by_item["a:held"]["takeable"] is False
    assert by_item["b:expired"]["state"] == "expired" and by_item["b:expired"]["takeable"] is True
    assert by_item["c:released"]["state"] == "released"
    assert by_item["d:dead"]["holder_status"] == "dead" and by_item["d:dead"]["takeable"] is True
    if on_files:
        assert listed[-1]["state"] == "invalid" and listed[-1]["file"] == "zz%3Abroken.json"
    assert len(listed) == 4 + on_files


def test_reap_releases_expired_and_dead_holders_only(ws, put_heartbeat):
    put_heartbeat("live", ago(0))
    put_heartbeat("stale", ago(400))
    put_heartbeat("dead", ago(7200))
    claims.claim(ws, "keep:live", "live", now=NOW)
    claims.claim(ws, "keep:stale", "stale", now=NOW)
    claims.claim(ws, "go:dead", "dead", now=NOW)
    claims.claim(ws, "go:expired", "live", ttl_s=5, now=NOW - timedelta(seconds=6))
    claims.claim(ws, "keep:released", "live", now=NOW)
    claims.release(ws, "keep:released", "live", now=NOW)
    reaped = claims.reap(ws, now=NOW)
    assert sorted(r["item"] for r in reaped) == ["go:dead", "go:expired"]
    assert claims.reap(ws, now=NOW) == []  # a second pass changes nothing
    reap_events = [e for e in events(ws) if e["event"] == "reaped"]
    assert sorted((e["item"], e["reason"]) for e in reap_events) == [("go:dead", "holder dead"),
                                                                    ("go:expired", "expired")]
    states = {e["item"]: e["state"] for e in claims.list_claims(ws, NOW)}
    assert states == {"keep:live": "held", "keep:stale": "held", "go:dead": "released",
                      "go:expired": "released", "keep:released": "released"}
    for item in states:
        schema_ok(ws, item)
    assert claims.claim(ws, "go:dead", "live", now=NOW)["token"] == 2


def test_reap_on_empty_state(state_dir):
    assert claims.reap(Workspace.open(state_dir)) == []
    assert claims.list_claims(Workspace.open(state_dir)) == []
    assert not state_dir.exists()


# --- the token survives damage ---------------------------------------------------------------------

@pytest.mark.sqlite_only  # the claim files themselves
def test_token_never_goes_back_after_file_damage(ws):
    for i in range(3):
        claims.claim(ws, "t:1", "alice", now=NOW + timedelta(seconds=i))
        claims.release(ws, "t:1", "alice", now=NOW + timedelta(seconds=i))
    path = claims.claim_path(ws, "t:1")
    path.write_text('{"item": "t:1", "tok')  # torn by hand: the log still knows token 3
    with ws.paths.claims_log.open("a") as log:
        log.write('{"at": "x", "item": "t:1", "tok')  # and a torn last log line
    record = claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=10))
    assert record["token"] == 4 and record["transitions"][-1].get("recovered") is True
    path.unlink()
    assert claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=11)).event == "claimed"
    assert schema_ok(ws, "t:1")["token"] == 5


def test_a_log_line_that_is_no_object_is_skipped_when_the_token_is_recovered(ws):
    # the log is read only when the claim file is damaged; a line naming the item that is a JSON list or
    # string (a hand edit) is skipped like a torn one, not a crash
    claims.claim(ws, "t:1", "alice", now=NOW)
    claims.release(ws, "t:1", "alice", now=NOW)
    claims.claim_path(ws, "t:1").write_text("[]")
    with ws.paths.claims_log.open("a") as log:
        log.write('["t:1", {"token": 99}]\n"t:1"\n')
    record = claims.claim(ws, "t:1", "bob", now=NOW + timedelta(seconds=1))
    assert record["token"] == 2 and record["claimed_by"] == "bob"


def test_busy_lock_is_exit_8(cli, state_dir):
    ws = Workspace.open(state_dir).ensure()
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 300}))
    ws = Workspace.open(state_dir)
    from filelock import FileLock

    lock_path = ws.paths.lock(f"claim.{claims.encode_item('t:1')}")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path)):
        result = cli("claim", "t:1", "--agent-id", "alice", "--json")
        assert result.returncode == 8
        assert json.loads(result.stdout)["error"]["type"] == "BusyError"
        with pytest.raises(BusyError):
            claims.claim(ws, "t:1", "alice")
        assert claims.reap(ws) == []
    assert cli("claim", "t:1", "--agent-id", "alice").returncode == 0


# --- the CLI ----------------------------------------------------------------------------------------

def test_cli_claim_json_conflict_and_text(cli, state_dir):
    mine = cli("claim", "ticket:142", "--agent-id", "alice", "--ttl", "1800", "--json")
    assert mine.returncode == 0, mine.stderr
    data = json.loads(mine.stdout)
    assert data["claim"]["token"] == 1 and data["claim"]["claimed_by"] == "alice"
    assert data["pending_signals"] == [] and data["event"] == "claimed"
    ws = Workspace.open(state_dir)
    assert ws.paths.heartbeat("alice").is_file()  # acting as an agent refreshes its heartbeat
    other = cli("claim", "ticket:142", "--agent-id", "bob", "--json")
    assert other.returncode == 3
    err = json.loads(other.stdout)["error"]
    assert err["type"] == "ConflictError" and "alice" in err["message"] and data["claim"]["expires_at"] in err["message"]
    assert "alice" in other.stderr and "Traceback" not in other.stderr
    text = cli("claim", "ticket:142", "--agent-id", "alice")
    assert text.returncode == 0 and text.stdout.startswith("renewed ticket:142  token 1")
    assert cli("release", "ticket:142", "--agent-id", "bob").returncode == 7
    forced = cli("release", "ticket:142", "--agent-id", "bob", "--force", "--reason", "stuck", "--json")
    assert forced.returncode == 0 and json.loads(forced.stdout)["claim"]["release_reason"] == "stuck"
    assert json.loads(forced.stdout)["pending_signals"] == []
    assert cli("release", "never:seen", "--agent-id", "bob").returncode == 6
    cli("claim", "src/api/users.py", "--agent-id", "carol")
    listing = cli("claims")
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:3] == ["ITEM", "STATE", "HOLDER"]
    assert any(line.startswith("src/api/users.py") and "held" in line and "carol" in line for line in lines)
    assert any(line.startswith("ticket:142") and "released" in line for line in lines)
    column = lines[0].index("STATE")
    assert all(line[column:].split()[0] in ("held", "released") for line in lines[1:])
    assert "ago" in listing.stdout
    as_json = json.loads(cli("claims", "--json").stdout)
    assert [c["item"] for c in as_json["claims"]] == ["src/api/users.py", "ticket:142"]
    held = json.loads(cli("claims", "--held", "--json").stdout)["claims"]
    assert [c["item"] for c in held] == ["src/api/users.py"]


def test_cli_claims_on_missing_state_dir_reads_nothing(cli, state_dir):
    result = cli("claims", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == {"claims": [], "waiting": []}
    assert cli("claims").stdout.strip() == "no claims"
    assert not state_dir.exists()


def test_cli_take_over_from_stale_holder(cli, state_dir):
    assert cli("claim", "t:1", "--agent-id", "alice").returncode == 0
    assert cli("claim", "t:2", "--agent-id", "alice").returncode == 0
    ws = Workspace.open(state_dir)
    hb = json.loads(ws.paths.heartbeat("alice").read_text())
    hb["beat_at"] = real_ago(400)
    ws.paths.heartbeat("alice").write_text(json.dumps(hb))
    result = cli("claim", "t:1", "--agent-id", "bob", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)["claim"]
    assert record["token"] == 2 and record["taken_over_from"]["reason"] == "stale"
    text = cli("claim", "t:2", "--agent-id", "bob")
    assert text.returncode == 0 and text.stdout.startswith("took over t:2 from alice (stale)  token 2")


def test_cli_wait_until_expiry_and_until_release(cli, state_dir, spawn):
    assert cli("claim", "t:1", "--agent-id", "alice", "--ttl", "1").returncode == 0
    waited = cli("claim", "t:1", "--agent-id", "bob", "--wait", "15", "--json", timeout=30)
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["claim"]["taken_over_from"]["reason"] == "expired"
    # a waiter that gives up: exit 3, bounded
    gave_up = cli("claim", "t:1", "--agent-id", "carol", "--wait", "0.3", timeout=30)
    assert gave_up.returncode == 3 and "bob" in gave_up.stderr
    # a waiter that gets it when the holder releases
    beat = Workspace.open(state_dir).paths.heartbeat("carol")
    gave_up_seq = json.loads(beat.read_text())["seq"]  # the give-up above beat too
    waiter = spawn(synapolis_cmd(state_dir, "claim", "t:1", "--agent-id", "carol", "--wait", "20", "--json"),
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the waiter's refresh, written right before it starts waiting: she is waiting now
    wait_until(lambda: json.loads(beat.read_text())["seq"] > gave_up_seq, 15, "carol's claim to start waiting")
    assert cli("release", "t:1", "--agent-id", "bob").returncode == 0
    out, err = waiter.communicate(timeout=25)
    assert waiter.returncode == 0, err
    record = json.loads(out)["claim"]
    assert record["claimed_by"] == "carol" and record["token"] == 3 and record["taken_over_from"] is None


def test_help_ends_with_example(cli):
    for verb in ("claim", "release", "claims", "claim-check"):
        result = cli(verb, "--help")
        assert result.returncode == 0 and "Example: synapolis" in result.stdout


# --- the Python context manager --------------------------------------------------------------------

def test_context_manager_renews_while_held_and_releases(ws, cli):
    with claims.held("ticket:142", agent_id="alice", ws=ws, ttl_s=1.5) as c:
        first_expiry = c["expires_at"]
        assert c.token == 1 and c.check()["claimed_by"] == "alice"
        # another process sees it held, by a live agent (the helper beats for its holder)
        other = cli("claim", "ticket:142", "--agent-id", "bob")
        assert other.returncode == 3, other.stderr
        def renewed():
            doc = schema_ok(ws, "ticket:142")
            return doc if doc["renewed_at"] and doc["expires_at"] > first_expiry else None

        doc = wait_until(renewed, 10, "the helper to renew the lease")
        assert doc["token"] == 1
        # until the first lease would have ended: only renewal (every ttl/3) keeps it live, even on a loaded machine
        wait_until(lambda: schema_ok(ws, "ticket:142")["renewed_at"] > first_expiry, 10,
                   "a renewal after the first lease's expiry")
        assert c.check()["token"] == 1 and c.lost is None
    final = schema_ok(ws, "ticket:142")
    assert final["released_at"] and final["released_by"] == "alice"
    with pytest.raises(StaleToken):
        claims.check(ws, "ticket:142", 1)


def test_context_manager_notices_a_lost_lease(ws):
    with claims.held("t:1", agent_id="alice", ws=ws, ttl_s=0.3) as c:
        claims.release(ws, "t:1", "bob", force=True, reason="test")
        claims.claim(ws, "t:1", "bob")
        with pytest.raises(StaleToken):
            c.check()
        wait_until(lambda: c.lost is not None, 10, "the renewer to notice the lost lease")
        assert isinstance(c.lost, StaleToken)
    # leaving did not release bob's claim
    assert claims.check(ws, "t:1", 2)["claimed_by"] == "bob"


def test_context_manager_keeps_the_holder_heartbeat_fresh(state_dir, cli):
    ws = Workspace.open(state_dir).ensure()
    ws.paths.config.write_text(json.dumps({"stale_after_s": 1.5}))
    ws = Workspace.open(state_dir)
    with claims.held("t:1", agent_id="alice", ws=ws, ttl_s=3600) as c:
        first = json.loads(ws.paths.heartbeat("alice").read_text())["seq"]
        wait_until(lambda: json.loads(ws.paths.heartbeat("alice").read_text())["seq"] >= first + 2, 10,
                   "the helper to beat twice")
        # a lease of an hour, but the heartbeat stays fresh: nobody may take it over
        assert cli("claim", "t:1", "--agent-id", "bob").returncode == 3
        assert c.lost is None and c.check()["token"] == 1
    assert [e["event"] for e in events(ws)] == ["claimed", "released"]  # no renewal was due


def test_context_manager_releases_when_the_body_raises(ws):
    with pytest.raises(RuntimeError):
        with claims.claim_context("t:1", agent_id="alice", ws=ws) as c:
            assert c.token == 1
            raise RuntimeError("boom")
    assert claims.list_claims(ws)[0]["state"] == "released"


def test_issue_spelling_claim_as_context_manager(state_dir, monkeypatch):
    monkeypatch.setenv("SYNAPOLIS_STATE_DIR", str(state_dir))
    from synapolis.claims import claim

    with claim("ticket:142", agent_id="alice") as c:
        assert c["claimed_by"] == "alice" and c.item == "ticket:142"
        assert json.loads(json.dumps(c))["token"] == c.token  # still a plain mapping
    ws = Workspace.open(state_dir)
    assert claims.list_claims(ws)[0]["state"] == "released"
    with pytest.raises(TypeError):
        claim("ticket:142", "other", agent_id="alice")


@pytest.mark.sqlite_only  # the claim files themselves
def test_a_new_item_does_not_search_the_log_but_a_deleted_one_does(ws):
    """The log is the fallback only for an item claimed here before (its `claims-known` marker is made before
    its first claim file): a never-claimed item starts at token 1 however long the log is."""
    claims.claim(ws, "t:old", "alice", now=NOW)
    with ws.paths.claims_log.open("a") as log:  # a log line no claim here ever wrote: not consulted
        log.write(json.dumps({"at": "x", "event": "claimed", "item": "t:new", "token": 40}) + "\n")
    assert claims.claim(ws, "t:new", "alice", now=NOW)["token"] == 1
    assert (ws.paths.locks / "claims-known" / claims.encode_item("t:new")).is_file()
    claims.claim_path(ws, "t:old").unlink()  # the known item's file deleted by hand: the log knows token 1
    assert claims.claim(ws, "t:old", "bob", now=NOW)["token"] == 2
    assert [r["item"] for r in claims.list_claims(ws, NOW)] == ["t:new", "t:old"]  # the marker is no claim
