"""opencode (contract §16): a plugin file `.opencode/plugin/synapolis.js` that runs `synapolis hook opencode` on
session.created, before and after each tool call, on session.idle and session.deleted.

opencode loads every .js/.ts file of `.opencode/plugin/` at start and calls its exported plugin with the
project's context; the hooks object it returns gets `event` (the bus: session.created, session.idle,
session.deleted), `tool.execute.before` and `tool.execute.after` (whose `output.output` is the tool result the
model reads). The plugin hands each to the hook as a JSON event with hook_event_name, session_id and cwd, and
appends the hook's additionalContext (the signals) to that tool result. The file is ours alone: install
writes it, uninstall removes it; only a file carrying our marker line is ever replaced or removed.
"""

from __future__ import annotations

import json
import os

PLUGIN_FILE = ".opencode/plugin/synapolis.js"
MARKER = "// synapolis: heartbeats and signal delivery for opencode"
TIMEOUT_MS = 10_000
EVENTS = ("session.created", "tool.execute.before", "tool.execute.after", "session.idle", "session.deleted")

_TEMPLATE = """%(marker)s (written by `synapolis hooks install opencode`; removed by
// `synapolis hooks uninstall opencode`). Every event runs `synapolis hook opencode`; a hook never fails opencode,
// but the guard's refusal of an edit (a file another agent holds) does fail that one tool call.
// Which synapolis: $SYNAPOLIS_BIN, else `synapolis` on PATH, else the one that installed this file (if it is
// on this machine), else none (the plugin does nothing). Commit this file: it holds no path a teammate needs.
import { execFile } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { delimiter, join } from "node:path";

const INSTALLED = %(command)s;
const TIMEOUT_MS = %(timeout)d;

function runnable(path) {
  try { accessSync(path, constants.X_OK); return true; } catch { return false; }
}

function command() {
  if (process.env.SYNAPOLIS_BIN) return [process.env.SYNAPOLIS_BIN];
  const names = process.platform === "win32" ? ["synapolis.exe", "synapolis.cmd"] : ["synapolis"];
  for (const dir of (process.env.PATH || "").split(delimiter)) {
    for (const name of names) if (dir && runnable(join(dir, name))) return [join(dir, name)];
  }
  if (INSTALLED.length && runnable(INSTALLED[0])) return INSTALLED;
  return null;
}

const COMMAND = command();
const warned = new Map(); // callID -> a guard warning (guard.mode warn), added to that tool's result

function hook(event, sessionID, directory, extra = {}) {
  return new Promise((resolve) => {
    if (!sessionID || !COMMAND) return resolve({});
    try {
      const child = execFile(COMMAND[0], [...COMMAND.slice(1), "hook", "opencode"],
        { timeout: TIMEOUT_MS, cwd: directory, maxBuffer: 16 * 1024 * 1024 }, (error, stdout) => {
          try { resolve(JSON.parse(stdout || "{}")); } catch { resolve({}); }
        });
      child.on("error", () => resolve({}));
      child.stdin.on("error", () => {});
      child.stdin.end(JSON.stringify({ hook_event_name: event, session_id: sessionID, cwd: directory, ...extra }));
    } catch {
      resolve({});
    }
  });
}

export const SynapolisPlugin = async ({ directory }) => ({
  event: async ({ event }) => {
    const p = event.properties || {};
    if (event.type === "session.created") await hook("SessionStart", p.info?.id, directory);
    else if (event.type === "session.idle") await hook("SessionIdle", p.sessionID, directory);
    else if (event.type === "session.deleted") await hook("SessionEnd", p.info?.id, directory);
  },
  "tool.execute.before": async (input, output) => {
    const answer = await hook("PreToolUse", input.sessionID, directory,
      { tool_name: input.tool, tool_input: output?.args ?? {} });
    const decided = answer?.hookSpecificOutput;
    // the guard (contract §14): throwing here is how opencode refuses a tool call; the model reads the message
    if (decided?.permissionDecision === "deny") throw new Error(decided.permissionDecisionReason || "refused");
    if (decided?.additionalContext && input.callID) warned.set(input.callID, decided.additionalContext);
  },
  "tool.execute.after": async (input, output) => {
    const answer = await hook("PostToolUse", input.sessionID, directory, { tool_name: input.tool });
    const early = input.callID ? warned.get(input.callID) : undefined;
    if (early) warned.delete(input.callID);
    const context = [early, answer?.hookSpecificOutput?.additionalContext].filter(Boolean).join("\\n\\n");
    if (context) output.output = `${output.output ?? ""}\\n\\n${context}`;
  },
});
"""


def plugin_file(project_dir) -> str:
    return os.path.join(os.fspath(project_dir), PLUGIN_FILE)


def plugin_text(command_words: list[str]) -> str:
    return _TEMPLATE % {"marker": MARKER, "command": json.dumps(command_words), "timeout": TIMEOUT_MS}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        from ..errors import UsageError

        raise UsageError(f"cannot read {path}: {exc}") from None


def install(project_dir, command_words: list[str]) -> dict:
    from ..atomic import atomic_write_bytes
    from ..errors import UsageError

    path = plugin_file(project_dir)
    current = _read(path)
    if current is not None and MARKER not in current:
        raise UsageError(f"{path} exists and is not synapolis's plugin: it was left untouched")
    wanted = plugin_text(command_words)
    changed = current != wanted
    if changed:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_bytes(path, wanted.encode("utf-8"))
    return {"settings_file": os.path.abspath(path), "events": list(EVENTS), "changed": changed,
            "added": list(EVENTS) if current is None else [], "updated": list(EVENTS) if changed and current else [],
            "notes": [], "trusted": []}


def uninstall(project_dir) -> dict:
    path = plugin_file(project_dir)
    current = _read(path)
    if current is None or MARKER not in current:
        return {"settings_file": os.path.abspath(path), "removed": [], "changed": False}
    os.remove(path)
    return {"settings_file": os.path.abspath(path), "removed": list(EVENTS), "changed": True}


def check(project) -> tuple[list[dict], dict]:
    """doctor's finding for the plugin file, and its command as a settings document of groups (what
    doctor.check_hook_commands reads) so the program is also run."""
    import shlex

    from ..doctor import FAIL, OK, finding
    from ..errors import UsageError

    path = plugin_file(project)
    fix = f"synapolis hooks install opencode --project-dir {shlex.quote(str(project))}"
    try:
        current = _read(path)
    except UsageError as exc:
        return [finding("harness:opencode", FAIL, exc.message, fix)], {}
    if current is None or MARKER not in current:
        return [finding("harness:opencode", FAIL, f"{path} is not synapolis's plugin", fix)], {}
    line = next((ln for ln in current.splitlines() if ln.startswith("const INSTALLED = ")), "")
    try:
        words = json.loads(line[len("const INSTALLED = "):].rstrip(";"))
    except ValueError:
        words = None
    if not (isinstance(words, list) and words and all(isinstance(w, str) for w in words)):
        return [finding("harness:opencode", FAIL, f"{path}: its INSTALLED line cannot be read", fix)], {}
    command = shlex.join([*words, "hook", "opencode"])
    groups = {"hooks": {"plugin": [{"hooks": [{"command": command}]}]}}
    return [finding("harness:opencode", OK, f"plugin {path} runs the hook on {', '.join(EVENTS)}")], groups
