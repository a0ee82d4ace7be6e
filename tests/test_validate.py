"""`validate-heartbeat`: every error with file and JSON pointer, exit 0/1, JSON, where it looks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import clean_env, heartbeat_doc, validate_heartbeat_cmd

GOOD = heartbeat_doc("good", "2030-01-01T00:00:00Z")


def run_validate(*args, cwd=None, env=None):
    # the console script is what users run; it must work with the state dir given or found
    base = clean_env()
    base.update(env or {})
    code = "import sys; from synapolis.cli import validate_heartbeat_main; validate_heartbeat_main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=base, timeout=60)


def put(ws, name, content):
    path = ws.paths.heartbeats / f"{name}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


CASES = {
    "missing_field": ({k: v for k, v in GOOD.items() if k != "harness"}, "", "'harness' is a required property"),
    "extra_key": ({**GOOD, "colour": "red"}, "", "'colour' was unexpected"),
    "bad_date": ({**GOOD, "beat_at": "2030-02-30T00:00:00Z"}, "/beat_at", "is not a 'date-time'"),
    "offset_not_z": ({**GOOD, "beat_at": "2030-01-01T00:00:00+00:00"}, "/beat_at", "does not match"),
    "wrong_type": ({**GOOD, "seq": "3"}, "/seq", "is not of type 'integer'"),
    "bool_not_int": ({**GOOD, "seq": True}, "/seq", "is not of type 'integer'"),
    "bad_status": ({**GOOD, "status": "busy"}, "/status", "is not one of"),
    "not_an_object": ([GOOD], "", "is not of type 'object'"),
    "unparseable": ('{"schema_version": 1, "agent_id": ', "", "not valid JSON"),
    "not_utf8": ("\udcff", "", "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_kind_of_error_with_its_pointer(ws, state_dir, case):
    content, pointer, message = CASES[case]
    name = case.replace("_", "-")
    if isinstance(content, dict):
        content = {**content, "agent_id": name}
    if case == "not_utf8":
        (ws.paths.heartbeats / f"{name}.json").write_bytes(b'{"a": "\xff"}')
    else:
        put(ws, name, content)
    put(ws, "good", GOOD)
    result = run_validate("--state-dir", state_dir, "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["valid"] is False
    files = {os.path.basename(f["path"]): f for f in data["files"]}
    assert files["good.json"] == {"path": str(ws.paths.heartbeats / "good.json"), "valid": True, "errors": []}
    bad = files[f"{name}.json"]
    assert bad["valid"] is False
    assert any(e["pointer"] == pointer and message in e["message"] for e in bad["errors"]), bad["errors"]
    text = run_validate("--state-dir", state_dir)
    assert text.returncode == 1
    assert f"INVALID  {ws.paths.heartbeats / (name + '.json')}  {pointer or '/'}:" in text.stdout


def test_every_error_of_a_file_is_reported(ws, state_dir):
    put(ws, "many", {**GOOD, "agent_id": "many", "seq": 0, "beat_at": "yesterday", "colour": 1, "pid": -1})
    data = json.loads(run_validate("--state-dir", state_dir, "--json").stdout)
    pointers = sorted(e["pointer"] for e in data["files"][0]["errors"])
    assert pointers == ["", "/beat_at", "/beat_at", "/pid", "/seq"]  # beat_at: pattern and format


def test_a_name_that_disagrees_with_the_file_is_an_error(ws, state_dir):
    put(ws, "alice", {**GOOD, "agent_id": "bob"})
    data = json.loads(run_validate("--state-dir", state_dir, "--json").stdout)
    assert data["files"][0]["errors"] == [
        {"pointer": "/agent_id", "message": "agent_id 'bob' does not match the file name 'alice.json'"}]


def test_all_valid_is_exit_0(ws, state_dir):
    put(ws, "good", GOOD)
    put(ws, "other", {**GOOD, "agent_id": "other", "task": "x" * 4096, "x": {"anything": [1, 2]}})
    result = run_validate("--state-dir", state_dir, "--json")
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["valid"] is True
    text = run_validate("--state-dir", state_dir)
    assert text.returncode == 0 and "2 file(s), 0 invalid" in text.stdout


def test_huge_content_is_an_error_not_a_crash(ws, state_dir):
    put(ws, "huge", {**GOOD, "agent_id": "huge", "task": "y" * 5_000_000})
    result = run_validate("--state-dir", state_dir, "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["files"][0]["errors"][0]["pointer"] == "/task"


def test_temp_files_are_not_validated(ws, state_dir):
    put(ws, "good", GOOD)
    (ws.paths.heartbeats / ".tmp-good.json.1.ab.tmp").write_text("{half")
    data = json.loads(run_validate("--state-dir", state_dir, "--json").stdout)
    assert [os.path.basename(f["path"]) for f in data["files"]] == ["good.json"]


def test_explicit_paths_missing_files_and_directories(ws, state_dir, tmp_path):
    good = put(ws, "good", GOOD)
    result = run_validate(good, "--json")
    assert result.returncode == 0 and len(json.loads(result.stdout)["files"]) == 1
    result = run_validate(good, tmp_path / "nope.json", tmp_path, "--json")
    assert result.returncode == 1
    files = json.loads(result.stdout)["files"]
    assert [f["valid"] for f in files] == [True, False, False]
    assert files[1]["errors"][0]["message"] == "no heartbeat file"
    assert files[2]["errors"][0]["message"] == "is a directory"


def test_state_dir_found_from_env_and_from_the_working_directory(ws, state_dir, tmp_path):
    put(ws, "bad", "{")
    assert run_validate(env={"SYNAPOLIS_STATE_DIR": str(state_dir)}).returncode == 1
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    found = run_validate("--json", cwd=deep)  # walks up to tmp_path/state (it holds synapolis.json)
    assert found.returncode == 1
    assert json.loads(found.stdout)["files"][0]["path"].endswith("bad.json")


def test_empty_or_missing_state_dir_is_valid(tmp_path):
    result = run_validate("--state-dir", tmp_path / "nothing-here", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == {"valid": True, "files": []}
    assert not (tmp_path / "nothing-here").exists()
    assert "no heartbeat files" in run_validate("--state-dir", tmp_path / "nothing-here").stdout


def test_bad_option_is_usage(tmp_path):
    result = run_validate("--bogus", "--json")
    assert result.returncode == 2 and json.loads(result.stdout)["error"]["type"] == "UsageError"


def test_console_script_is_installed(ws, state_dir):
    put(ws, "good", GOOD)
    result = subprocess.run(validate_heartbeat_cmd(state_dir),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "ok" in result.stdout
