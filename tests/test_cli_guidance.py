"""What the CLI says to a person who mistypes: a verb (did you mean), a state directory that is not there."""

from __future__ import annotations

import json

from conftest import refused


def test_a_mistyped_verb_gets_did_you_mean(cli):
    line = refused(cli("statsu"))
    assert "no such command 'statsu'; did you mean 'status'" in line
    assert "did you mean 'list-agents'" in refused(cli("list-agent"))
    assert "No such command 'xyzzy'" in refused(cli("xyzzy"))  # nothing close: click's own words


def test_a_read_only_verb_on_a_missing_state_dir_says_so(cli, tmp_path):
    missing = tmp_path / "stat"  # a typo of state/
    for verb in (["status", "--json"], ["list-agents"], ["claims"], ["escalations"]):
        result = cli(*verb, state=missing)
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip() == (f"synapolis: note: state directory {missing} does not exist (nothing recorded "
                                         f"there yet; check --state-dir or $SYNAPOLIS_STATE_DIR)"), verb
        assert not missing.exists()  # a read does not create it
    assert json.loads(cli("status", "--json", state=missing).stdout)["agents"] == []


def test_an_existing_state_dir_gets_no_note(cli):
    assert cli("init").returncode == 0
    result = cli("status")
    assert result.returncode == 0 and result.stderr == ""
