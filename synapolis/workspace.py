"""An opened state directory: its paths, its config and its store, created on the first write (contract §1)."""

from __future__ import annotations

import os

from .config import Config, load_config, write_default_config
from .errors import UsageError
from .paths import StateFiles, StatePaths, locate_state_dir

# this process's id, kept (os.getpid is a system call, and every verb's clock asks the workspace for its store);
# a forked child sets its own before it runs anything
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path


class Workspace:
    """One state directory opened: `paths` (every file name), `config` (synapolis.json) and `store` (its Store)."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("paths", "config", "_store")

    def __init__(self, paths: StatePaths, config: Config):
        self.paths = paths
        self.config = config
        self._store = None  # (pid, Store) once asked for: `store`

    @property
    def store(self):
        """This state directory's Store (store.store_for), opened on first use and kept: a verb asks its
        workspace, never looks the store up again mid-call. A forked child opens its own (a connection to a
        database server is never shared across processes)."""
        kept = self._store
        pid = _pid
        if kept is None or kept[0] != pid:
            from .store import store_for  # the layer below; imported where a verb first needs it

            kept = self._store = (pid, store_for(self))
        store = kept[1]
        if store.ws is not self:  # a shared store (one per server URL) acts for the workspace asking
            store.ws = self
        return store

    def __reduce__(self):
        # pickled (multiprocessing) without its store: the other process opens its own
        return (type(self), (self.paths, self.config))

    def __repr__(self) -> str:
        return f"Workspace(paths={self.paths!r}, config={self.config!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and (other.paths, other.config) == (self.paths, self.config)

    __hash__ = None  # mutable, like the dataclass it was

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def files(self) -> StateFiles:
        """Every file name as a plain str, for the hot paths (no pathlib)."""
        return self.paths.files

    @classmethod
    def open(cls, state_dir: str | os.PathLike | None = None, env=None, cwd=None) -> "Workspace":
        root = locate_state_dir(state_dir, env=env, cwd=cwd)
        if os.path.exists(root) and not os.path.isdir(root):
            raise UsageError(f"state directory {root} exists and is not a directory")
        paths = StatePaths(root)
        return cls(paths, load_config(paths.files.config))

    def ensure(self) -> "Workspace":
        """Create the state directory and a default config (idempotent); verbs that write call this."""
        files = self.files
        try:
            # the state directory holds identity.json and the sessions' stores: created private
            # (docs/SECURITY.md); one that exists keeps the mode its owner gave it
            # one stat per folder when they exist (every verb that writes runs this): makedirs would
            # stat the parent, try mkdir and stat again; it still runs, and raises, for what is missing
            # or not a folder
            if not os.path.isdir(files.root):
                os.makedirs(files.root, mode=0o700, exist_ok=True)
            for folder in (files.heartbeats, files.escalations, files.claims, files.sessions,
                           files.monitor_history):
                if not os.path.isdir(folder):
                    os.makedirs(folder, exist_ok=True)
            write_default_config(files.config)
        except OSError as exc:
            # name what failed: the state directory itself, or a file sitting where one of its folders belongs
            where = exc.filename if exc.filename and os.fspath(exc.filename) != os.fspath(files.root) else None
            raise UsageError(f"cannot create state directory {files.root}: {exc.strerror}"
                             + (f" ({where})" if where else "")) from None
        return self

