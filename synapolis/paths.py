"""The state directory: where it is (contract §1) and the name of every file in it."""

from __future__ import annotations

import os

from .names import validate_agent_id, validate_session_id

# beside session.db: the counter a quiet hook compares (docs/HOOKS.md, "The quiet path")
SESSION_CHANGES = "changes"

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see StateFiles for why pathlib stays unloaded
    from pathlib import Path

CONFIG_NAME = "synapolis.json"
ENV_STATE_DIR = "SYNAPOLIS_STATE_DIR"


def working_directory(instead: str = f"--state-dir (or set {ENV_STATE_DIR})") -> str:
    """os.getcwd(), or UsageError (exit 2) saying what to do when the folder was removed under the caller:
    pass `instead` as an absolute path, or cd to an existing folder."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        from .errors import UsageError

        raise UsageError(f"the working directory no longer exists: pass {instead} as an absolute path, or cd "
                         "to an existing folder") from None


def _absolute(path: str | os.PathLike) -> str:
    """`pathlib.Path(path).absolute()` as a str: relative to the working directory, '.' segments and
    doubled or trailing separators dropped, '..' kept (through a symlink it is not the lexical parent)."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        # only a relative path needs the working directory: an absolute one must work from a folder that
        # was removed under the caller (an agent's shell in a deleted worktree)
        text = os.path.join(working_directory(), text)
    if os.name == "nt":  # pragma: no cover - drive letters and UNC shares
        return os.path.abspath(text)
    parts = text.split("/")
    return "/" + "/".join(part for part in parts[1:] if part not in ("", "."))


def locate_state_dir(explicit: str | os.PathLike | None = None, env=None, cwd: str | os.PathLike | None = None) -> str:
    """`--state-dir`, then `$SYNAPOLIS_STATE_DIR`, then the nearest `state/` holding synapolis.json, then ./state."""
    env = os.environ if env is None else env
    if explicit is not None and not os.fspath(explicit):
        # like an explicit empty name (contract §2): a mistake, not "find one for me"
        from .errors import UsageError

        raise UsageError("--state-dir must not be empty")
    if explicit:
        return _absolute(explicit)
    if env.get(ENV_STATE_DIR):
        return _absolute(env[ENV_STATE_DIR])
    here = folder = _absolute(cwd or working_directory())
    while True:
        candidate = os.path.join(folder, "state")
        if os.path.isfile(os.path.join(candidate, CONFIG_NAME)):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return os.path.join(here, "state")
        folder = parent


def find_state_dir(explicit: str | os.PathLike | None = None, env=None, cwd: str | os.PathLike | None = None) -> Path:
    """`locate_state_dir` as a pathlib.Path."""
    from pathlib import Path

    return Path(locate_state_dir(explicit, env=env, cwd=cwd))


class StateFiles:
    """Every file name inside one state directory, as a plain str; names are validated before they become paths.

    The hot paths (beat, signal, read-signals, hooks) use these (`Workspace.files`): pathlib costs about
    6 ms of start-up with the urllib.parse and ipaddress it loads, a fifteenth of a bare
    `python -c "import click"`. Everything else uses `StatePaths`, the same names as pathlib.Path.
    """

    # plain classes, not dataclasses: building one at import costs start-up time on every CLI call
    __slots__ = ("_root",)

    def __init__(self, root: str | os.PathLike):
        self._root = os.fspath(root)

    def _at(self, *parts: str):
        return os.path.join(self._root, *parts)

    @property
    def root(self):
        return self._root

    @property
    def files(self) -> StateFiles:
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def config(self):
        return self._at(CONFIG_NAME)

    @property
    def identity(self):
        return self._at("identity.json")

    @property
    def tokens(self):
        # the team server's bearer tokens (contract §13): their SHA-256 only, mode 0600
        return self._at("tokens.json")

    @property
    def heartbeats(self):
        return self._at("heartbeats")

    def heartbeat(self, agent_id: str):
        return self._at("heartbeats", f"{validate_agent_id(agent_id)}.json")

    @property
    def monitor(self):
        return self._at("heartbeat-monitor.json")

    @property
    def monitor_history(self):
        return self._at("monitor-history")

    @property
    def escalations(self):
        return self._at("escalations")

    def escalation(self, key_name: str):
        # key_name is an agent id or "@global"
        if key_name != "@global":
            validate_agent_id(key_name)
        return self._at("escalations", f"{key_name}.json")

    @property
    def escalations_log(self):
        return self._at("escalations.jsonl")

    @property
    def claims(self):
        return self._at("claims")

    @property
    def claims_log(self):
        return self._at("claims.jsonl")

    @property
    def sessions(self):
        return self._at("sessions")

    def session_dir(self, session_id: str):
        return self._at("sessions", validate_session_id(session_id))

    def session_db(self, session_id: str):
        return self._at("sessions", validate_session_id(session_id), "session.db")

    def session_json(self, session_id: str):
        return self._at("sessions", validate_session_id(session_id), "session.json")

    def session_notes(self, session_id: str):
        return self._at("sessions", validate_session_id(session_id), "notes.jsonl")

    def session_changes(self, session_id: str):
        """The SQLite store's change counter of a session (store/local/connection.py, harness.quiet)."""
        return self._at("sessions", validate_session_id(session_id), SESSION_CHANGES)

    @property
    def memory_ledger(self):
        return self._at("memory", "ledger.jsonl")

    @property
    def hook_states(self):
        return self._at("hooks")

    def hook_conversation(self, name: str):
        # which hooks/<agent id>.json a conversation's hooks keep (harness.quiet.known_key): `name` is made of
        # id characters and '~' only (quiet.index_name), so it is one path component
        return self._at("hooks", "conversations", f"{name}.json")

    def hook_state(self, agent_id: str):
        # what a harness hook remembers between calls of one conversation (session, run token)
        return self._at("hooks", f"{validate_agent_id(agent_id)}.json")

    @property
    def locks(self):
        return self._at(".locks")

    def lock(self, name: str):
        return self._at(".locks", f"{name}.lock")


class StatePaths(StateFiles):
    """Every path inside one state directory as a pathlib.Path (pathlib is loaded on first use)."""

    __slots__ = ("_path",)

    def __init__(self, root: Path | str):
        super().__init__(root)
        self._path = None if isinstance(root, str) else root

    @property
    def root(self) -> Path:
        if self._path is None:
            from pathlib import Path

            self._path = Path(self._root)
        return self._path

    def _at(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @property
    def files(self) -> StateFiles:
        """The same names as plain strings, without loading pathlib."""
        return StateFiles(self._root)
