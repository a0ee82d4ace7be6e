"""`synapolis hooks install git` (contract §14): a real git refuses a commit touching a file another live
agent holds, from the main work tree and from a linked worktree, printing each path and holder; an existing
pre-commit hook is kept and still runs (its refusal stands); core.hooksPath is honoured; `hooks uninstall
git` takes out only its part; doctor checks the hook's program."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import clean_env, refused, synapolis_cmd
from synapolis import actions, claims
from synapolis.workspace import Workspace


def git(folder, *args, env=None, check=True) -> subprocess.CompletedProcess:
    env = clean_env(env, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
                    GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


@pytest.fixture
def repo(tmp_path):
    """A repository with one commit, its state directory inside (ignored), alice holding src/api/."""
    project = tmp_path / "repo"
    (project / "src" / "api").mkdir(parents=True)
    git(tmp_path, "init", "-q", "-b", "main", str(project))
    (project / ".gitignore").write_text("state/\n")
    (project / "src" / "api" / "users.py").write_text("v = 1\n")
    (project / "README").write_text("hello\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "start")
    ws = Workspace.open(project / "state").ensure()
    actions.start(ws, agent_id="alice", env={}, write_identity=False)
    claims.claim(ws, "src/api/**", "alice", ttl_s=3600)
    return project, ws


def install(project, ws, *more):
    done = subprocess.run(synapolis_cmd(ws.paths.root, "hooks", "install", "git", "--project-dir", project, *more),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def test_a_commit_touching_a_held_file_is_refused_naming_path_and_holder(repo):
    project, ws = repo
    install(project, ws)
    (project / "src" / "api" / "users.py").write_text("v = 2\n")
    (project / "README").write_text("hello again\n")
    git(project, "add", "-A")
    done = git(project, "commit", "-m", "touch users", check=False)
    assert done.returncode != 0 and "src/api/users.py" in done.stderr and "alice" in done.stderr
    assert git(project, "rev-list", "--count", "HEAD").stdout.strip() == "1"
    # without the held file the commit goes through; as alice herself, the held file too
    git(project, "reset", "-q", "src/api/users.py")
    git(project, "commit", "-q", "-m", "readme only")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "as alice", env={"SYNAPOLIS_AGENT_ID": "alice"})
    assert git(project, "rev-list", "--count", "HEAD").stdout.strip() == "3"


def test_a_commit_from_a_linked_worktree_is_refused_too(repo, tmp_path):
    project, ws = repo
    install(project, ws)
    other = tmp_path / "second"
    git(project, "worktree", "add", "-q", str(other), "-b", "second")
    (other / "src" / "api" / "users.py").write_text("from the second worktree\n")
    git(other, "add", "-A")
    done = git(other, "commit", "-m", "from second", check=False)
    assert done.returncode != 0 and "src/api/users.py" in done.stderr and "alice" in done.stderr
    # one hook, in the common git dir, serves both work trees
    assert not (other / ".git").is_dir() and (project / ".git" / "hooks" / "pre-commit").exists()


def test_an_existing_pre_commit_hook_is_kept_runs_first_and_comes_back_on_uninstall(repo):
    project, ws = repo
    hook = project / ".git" / "hooks" / "pre-commit"
    mine = "#!/bin/sh\necho mine-ran >> \"$(git rev-parse --git-dir)/mine.log\"\n[ ! -e NO_COMMIT ] || { echo 'mine says no' >&2; exit 1; }\n"
    hook.write_text(mine)
    hook.chmod(0o755)
    install(project, ws)
    install(project, ws)  # idempotent: chained once, not twice
    (project / "README").write_text("x\n")
    git(project, "add", "README")
    git(project, "commit", "-q", "-m", "free file")
    assert (project / ".git" / "mine.log").read_text() == "mine-ran\n"
    (project / "NO_COMMIT").write_text("")
    (project / "README").write_text("y\n")
    git(project, "add", "README")
    done = git(project, "commit", "-m", "refused by mine", check=False)
    assert done.returncode != 0 and "mine says no" in done.stderr
    done = subprocess.run(synapolis_cmd(ws.paths.root, "hooks", "uninstall", "git", "--project-dir", project, "--json"),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert json.loads(done.stdout)["restored"] == str(hook)
    assert hook.read_text() == mine and not (hook.parent / "pre-commit.synapolis-chained").exists()


def test_core_hooks_path_is_honoured(repo):
    project, ws = repo
    git(project, "config", "core.hooksPath", ".githooks")
    answer = json.loads(install(project, ws, "--json").stdout)
    assert answer["hook"] == str(project / ".githooks" / "pre-commit")
    (project / "src" / "api" / "users.py").write_text("v = 3\n")
    git(project, "add", "-A")
    assert git(project, "commit", "-m", "refused", check=False).returncode != 0
    assert not (project / ".git" / "hooks" / "pre-commit").exists()


def test_install_git_outside_a_repository_is_a_usage_error(tmp_path, state_dir):
    done = subprocess.run(synapolis_cmd(state_dir, "hooks", "install", "git", "--project-dir", tmp_path),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert "not in a git work tree" in refused(done)
    done = subprocess.run(synapolis_cmd(state_dir, "hooks", "install", "git", "--trust", "--project-dir", tmp_path),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    refused(done)


def test_doctor_checks_the_git_hooks_program(repo):
    from synapolis.harness import doctor

    project, ws = repo
    install(project, ws)
    (ok,) = doctor.check_git_hook(project)
    assert ok["status"] == "ok" and "synapolis guard" not in ok["message"], ok  # the program, not the guard line
    hook = project / ".git" / "hooks" / "pre-commit"
    hook.write_text(hook.read_text().replace(" guard --staged", "-gone guard --staged").replace("synapolis-gone", "/nowhere/synapolis"))
    (finding,) = doctor.check_git_hook(project)
    assert finding["status"] == "fail" and "hooks install git" in finding["fix"]


def test_uninstall_git_outside_a_repository_has_nothing_to_take_out(tmp_path, state_dir):
    done = subprocess.run(synapolis_cmd(state_dir, "hooks", "uninstall", "git", "--project-dir", tmp_path),
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 0 and "not a git work tree" in done.stdout
