"""An opened state directory: its paths and config, created on the first write (contract §1)."""

from __future__ import annotations

import os
from pathlib import Path

from .config import Config, load_config, write_default_config
from .errors import UsageError
from .paths import StatePaths, find_state_dir


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

    @classmethod
    def open(cls, state_dir: str | os.PathLike | None = None, env=None, cwd=None) -> "Workspace":
        root = find_state_dir(state_dir, env=env, cwd=cwd)
        if root.exists() and not root.is_dir():
            raise UsageError(f"state directory {root} exists and is not a directory")
        paths = StatePaths(root)
        return cls(paths, load_config(paths.config))

    def ensure(self) -> "Workspace":
        """Create the state directory and a default config (idempotent); verbs that write call this."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for folder in (self.paths.heartbeats, self.paths.escalations, self.paths.claims,
                           self.paths.sessions, self.paths.monitor_history):
                folder.mkdir(exist_ok=True)
            write_default_config(self.paths.config)
        except OSError as exc:
            raise UsageError(f"cannot create state directory {self.root}: {exc.strerror}") from None
        return self
