"""The error classes: exit codes that survive pickling, and no broad `except` (OSError, ValueError) that
swallows them."""

import inspect
import json
import pickle
import sqlite3

import pytest

from synapolis import actions, errors

ERROR_CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, errors.SynapolisError)]


def _example(cls):
    if issubclass(cls, errors.RateLimitedError):
        return cls("slow down", 1.5, agent="alice")
    return cls(f"a {cls.__name__}", item="x")


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_round_trips_through_pickle(cls):
    error = _example(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert (str(back), back.message, back.exit_code, back.args) == (str(error), error.message, error.exit_code, error.args)
    assert back.to_json() == error.to_json()
    assert vars(back) == vars(error)


# what synapolis/ catches broadly around file I/O and parsing (`except (OSError, ValueError)` and the like)
BROAD = (OSError, ValueError, TypeError, KeyError, AttributeError, RuntimeError, ArithmeticError)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_no_broad_except_swallows_a_synapolis_error(cls):
    assert not issubclass(cls, BROAD), [b.__name__ for b in BROAD if issubclass(cls, b)]
    with pytest.raises(cls):
        try:
            raise _example(cls)
        except BROAD:  # the guards around file I/O and parsing all over synapolis/
            pytest.fail(f"{cls.__name__} was caught by a broad except")


def test_a_store_busy_under_the_clis_oserror_guard_still_exits_8(ws, cli):
    # run_guarded (cli/__init__.py) reports any OSError as an InternalError (exit 1): a BusyError from
    # the store, raised inside that guard, must reach the caller as BusyError with exit 8
    ws.paths.config.write_text(json.dumps({"busy_timeout_ms": 200}))
    sid = actions.start(ws, agent_id="alice", env={})["session_id"]
    holder = sqlite3.connect(str(ws.paths.session_db(sid)), isolation_level=None)  # another writer
    try:
        holder.execute("BEGIN IMMEDIATE")
        out = cli("note", "during", "--agent-id", "alice", "--session-id", sid, "--json")
    finally:
        holder.close()
    assert out.returncode == 8, out.stderr
    assert json.loads(out.stdout)["error"]["type"] == "BusyError"
