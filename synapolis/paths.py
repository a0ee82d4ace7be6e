"""The state directory: where it is (contract §1) and the name of every file in it."""

from __future__ import annotations

import os
from pathlib import Path

from .names import validate_agent_id, validate_session_id

CONFIG_NAME = "synapolis.json"
ENV_STATE_DIR = "SYNAPOLIS_STATE_DIR"


def find_state_dir(explicit: str | os.PathLike | None = None, env=None, cwd: str | os.PathLike | None = None) -> Path:
    """`--state-dir`, then `$SYNAPOLIS_STATE_DIR`, then the nearest `state/` holding synapolis.json, then ./state."""
    env = os.environ if env is None else env
    if explicit:
        return Path(explicit).absolute()
    if env.get(ENV_STATE_DIR):
        return Path(env[ENV_STATE_DIR]).absolute()
    here = Path(cwd or os.getcwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / "state"
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    return here / "state"


class StatePaths:
    """Every path inside one state directory; names are validated before they become paths."""

    # a plain class, not a dataclass: building one at import costs start-up time on every CLI call
    __slots__ = ("root",)

    def __init__(self, root: Path):
        self.root = root

    def __repr__(self) -> str:
        return f"StatePaths(root={self.root!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def identity(self) -> Path:
        return self.root / "identity.json"

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat(self, agent_id: str) -> Path:
        return self.heartbeats / f"{validate_agent_id(agent_id)}.json"

    @property
    def monitor(self) -> Path:
        return self.root / "heartbeat-monitor.json"

    @property
    def monitor_history(self) -> Path:
        return self.root / "monitor-history"

    @property
    def escalations(self) -> Path:
        return self.root / "escalations"

    def escalation(self, key_name: str) -> Path:
        # key_name is an agent id or "@global"
        if key_name != "@global":
            validate_agent_id(key_name)
        return self.escalations / f"{key_name}.json"

    @property
    def escalations_log(self) -> Path:
        return self.root / "escalations.jsonl"

    @property
    def claims(self) -> Path:
        return self.root / "claims"

    @property
    def claims_log(self) -> Path:
        return self.root / "claims.jsonl"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    def session_dir(self, session_id: str) -> Path:
        return self.sessions / validate_session_id(session_id)

    def session_db(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "session.db"

    def session_json(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "session.json"

    def session_notes(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "notes.jsonl"

    @property
    def memory_ledger(self) -> Path:
        return self.root / "memory" / "ledger.jsonl"

    @property
    def hook_states(self) -> Path:
        return self.root / "hooks"

    def hook_state(self, agent_id: str) -> Path:
        # what a harness hook remembers between calls of one conversation (session, run token)
        return self.hook_states / f"{validate_agent_id(agent_id)}.json"

    @property
    def locks(self) -> Path:
        return self.root / ".locks"

    def lock(self, name: str) -> Path:
        return self.locks / f"{name}.lock"
