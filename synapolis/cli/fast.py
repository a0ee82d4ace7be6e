"""The hot agent verbs without click: `[--state-dir DIR] VERB ARGS` in the forms their help documents.

Hooks and agents run `beat`, `signal`, `read-signals`, `claim`, ... on every tool call, and `import click`
alone is several times a bare `python -c pass`. `parse` accepts only what it can check exactly as click
would (known options, values of the right type and choice, the right number of arguments); anything
else (help, a typo, a bad value, an option given twice, `--`) returns None and click parses it, so
help, error messages and exit codes stay click's. `run` then calls the same functions the click
commands call (synapolis.cli.hot) and reports errors through the same `report_error`.
"""

from __future__ import annotations

import os
import sys

_AGENT = {"--agent-id": "agent_id", "--session-id": "session_id", "--run-token": "run_token"}
_FLAGS = {"--no-piggyback": "no_piggyback", "--json": "as_json"}
# verbs that act as nobody (claim-check: of the shared options only --json), with the options click requires
_AGENTLESS = {"claim-check": ("token",)}


def _int(minimum: int):
    def check(text: str):
        value = int(text)  # click's IntRange takes what int() takes
        if value < minimum:
            raise ValueError(text)
        return value
    return check


def _choice(*choices: str):
    def check(text: str):
        if text not in choices:
            raise ValueError(text)
        return text
    return check


def _float(text: str) -> float:
    return float(text)


def _specs() -> dict:
    """verb -> (argument names (a trailing '?' is optional), {option: (parameter, converter)}, {flag: (parameter,
    value)}). Each verb creates the state directory itself, after checking the names (contract §2)."""
    from ..heartbeat import DECLARED_STATUSES
    from ..signals import TYPES

    return {
        "beat": ((), {"--status": ("status", _choice(*DECLARED_STATUSES)), "--task": ("task", str),
                      "--ttl": ("ttl", _float), "--note": ("note", str)}, {}),
        "signal": (("to", "content"), {"--type": ("type_", _choice(*TYPES)), "--sender-id": ("sender_id", str),
                                      "--reply-to": ("reply_to", str), "--idempotency-key": ("idempotency_key", str)},
                   {}),
        "read-signals": ((), {"--limit": ("limit", _int(1)), "--after": ("after", _int(0))},
                         {"--unread-only": ("mode", "unread"), "--all": ("mode", "all")}),
        "signals-pending": ((), {"--limit": ("limit", _int(1))}, {}),
        "ack-signals": (("ids?",), {}, {"--all": ("all_", True)}),
        "note": (("text",), {"--idempotency-key": ("idempotency_key", str)}, {}),
        "claim": (("item",), {"--ttl": ("ttl", _float), "--wait": ("wait", _float)}, {}),
        "release": (("item",), {"--reason": ("reason", str)}, {"--force": ("force", True)}),
        "claim-check": (("item",), {"--token": ("token", int)}, {}),  # click's INT takes what int() takes
    }


VERBS = ("beat", "signal", "read-signals", "signals-pending", "ack-signals", "note", "claim", "release",
         "claim-check")


def parse(args: list[str]):
    """(state dir, verb, keyword arguments for hot.<verb>) for a plain call of a hot verb; else None."""
    state_dir = None
    if args[:1] == ["--state-dir"] and len(args) > 1:
        state_dir, args = args[1], args[2:]
    elif args[:1] and args[0].startswith("--state-dir="):
        state_dir, args = args[0].partition("=")[2], args[1:]
    if not args or args[0] not in VERBS:
        return None
    if state_dir is not None and (not state_dir or (os.path.exists(state_dir) and not os.path.isdir(state_dir))):
        return None  # click's Path check and the workspace's own message: theirs to give
    verb, rest = args[0], args[1:]
    names, options, flags = _specs()[verb]
    if verb in _AGENTLESS:
        flags = dict(flags, **{"--json": ("as_json", True)})
    else:
        options = dict(options, **{k: (v, str) for k, v in _AGENT.items()})
        flags = dict(flags, **{k: (v, True) for k, v in _FLAGS.items()})
    values: dict = {}
    seen: set = set()
    positional: list = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "-" or not token.startswith("-"):
            positional.append(token)
            i += 1
            continue
        name, has_value, value = token.partition("=")
        if name in seen:
            return None
        seen.add(name)
        if name in flags and not has_value:
            key, flag_value = flags[name]
            if key == "mode" and key in values:
                return None  # --all with --unread-only: click's last-one-wins, not ours to guess
            values[key] = flag_value
            i += 1
        elif name in options:
            if not has_value:
                if i + 1 >= len(rest):
                    return None
                value = rest[i + 1]
                i += 1
            i += 1
            key, convert = options[name]
            try:
                values[key] = convert(value)
            except ValueError:
                return None
        else:
            return None
    required = [n for n in names if not n.endswith("?")]
    if not len(required) <= len(positional) <= len(names):
        return None
    if any(key not in values for key in _AGENTLESS.get(verb, ())):
        return None  # a required option missing: click's message
    for name, value in zip(names, positional):
        values[name.rstrip("?")] = value
    return state_dir, verb, values


def run(call) -> None:
    """Run one parsed call: print its answer (JSON with --json, else text for people); exit as click's path would."""
    from .text import put, report_error
    from ..errors import SynapolisError, internal_error

    state_dir, verb, values = call
    as_json = values.pop("as_json", False)
    try:
        from ..identity import Who
        from ..workspace import Workspace
        from . import hot

        from ..remote import activate

        ws = activate(Workspace.open(state_dir), verb)  # through the team server, when one is configured (§16)
        who = Who(values.pop("agent_id", None), values.pop("session_id", None), values.pop("run_token", None))
        piggyback = not values.pop("no_piggyback", False)
        data, text = getattr(hot, verb.replace("-", "_"))(ws, who, piggyback, **values)
        if as_json:
            import json

            out = json.dumps(data, ensure_ascii=False)
        else:
            from .text import render

            out = render(data, text)
        if out:
            put(out)
    except SynapolisError as exc:
        report_error(exc, as_json)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - the contract: no traceback reaches a user
        if os.environ.get("SYNAPOLIS_DEBUG") and not isinstance(exc, OSError):
            raise
        report_error(internal_error(exc), as_json)
        sys.exit(1)
    sys.exit(0)
