"""An opened state directory: its paths and config, created on the first write (contract §1)."""

from __future__ import annotations

import os

from .config import Config, load_config, write_default_config
from .errors import UsageError
from .paths import StateFiles, StatePaths, locate_state_dir

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the hot paths never load pathlib (paths.StateFiles)
    from pathlib import Path


class Workspace:
    """One state directory opened: `paths` (every file name) and `config` (synapolis.json)."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("paths", "config")

    def __init__(self, paths: StatePaths, config: Config):
        self.paths = paths
        self.config = config

    def __repr__(self) -> str:
        return f"Workspace(paths={self.paths!r}, config={self.config!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and (other.paths, other.config) == (self.paths, self.config)

    __hash__ = None  # mutable, like the dataclass it was

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def store(self):
        """This state directory's store (store.store_for): what a module below the verbs (status) is handed
        instead of importing the store package."""
        from .store import store_for

        return store_for(self)

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

