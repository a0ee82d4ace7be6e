"""The shared test helpers keep their promises: a wait that times out fails the test and says what it waited
for, and a stopped child is gone and reaped."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from conftest import clean_env, stop, wait_until


def test_wait_until_returns_what_the_predicate_found():
    calls = []
    assert wait_until(lambda: calls.append(1) or (len(calls) >= 3 and "ready"), 10, "three calls") == "ready"


def test_wait_until_fails_loudly_naming_what_it_waited_for():
    with pytest.raises(pytest.fail.Exception, match="waited 0.05 s for the moon"):
        wait_until(lambda: False, 0.05, "the moon")


def test_stop_ends_a_child_politely_and_one_that_ignores_sigterm_by_force():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=clean_env())
    assert stop(polite) == -signal.SIGTERM and polite.poll() is not None
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                 "print('ready', flush=True)\ntime.sleep(60)"],
                                stdout=subprocess.PIPE, text=True, env=clean_env())
    assert stubborn.stdout.readline().strip() == "ready"
    assert stop(stubborn, timeout=0.5) == -signal.SIGKILL
    stubborn.stdout.close()


def test_clean_env_drops_every_synapolis_variable(monkeypatch):
    monkeypatch.setenv("SYNAPOLIS_AGENT_ID", "someone")
    monkeypatch.setenv("SYNAPOLIS_STORE_URL", "postgresql://elsewhere")
    env = clean_env(SYNAPOLIS_HOOK_TIMEOUT_S="1")
    assert not {"SYNAPOLIS_AGENT_ID", "SYNAPOLIS_STORE_URL"} & set(env)
    assert env["SYNAPOLIS_HOOK_TIMEOUT_S"] == "1" and env["PATH"]
