"""The `tokens` verbs: bearer tokens for `synapolis serve` (contract §13)."""

from __future__ import annotations

import click

from .common import CommandGroup, ago, emit, json_option, pass_workspace, table


@click.group("tokens", cls=CommandGroup)
def tokens_group():
    """Bearer tokens for `synapolis serve`: create (shown once), list, revoke.

    Example: synapolis tokens create laptop-claude --agent claude_1
    """


@tokens_group.command("create")
@click.argument("name")
@click.option("--agent", "agent_id", default=None,
              help="Pin the token to this agent: it may act only as it and its sub-agents, whatever a call says.")
@click.option("--read-only", is_flag=True, help="May only read: the read tools, resources, the dashboard.")
@json_option
@pass_workspace(create=True)
def tokens_create_cmd(ws, name, agent_id, read_only, as_json):
    """Create a token named NAME and print it once; only its SHA-256 is kept (state/tokens.json, 0600).

    Example: synapolis tokens create dashboard-viewer --read-only
    """
    from ..tokens import create

    def text(d):
        scope = f"acts only as {d['agent_id']}" if d["agent_id"] else "acts as whoever start_session makes it"
        return [d["token"], f"token {d['name']}: {scope}{', read-only' if d['read_only'] else ''}. "
                            "Shown once: store it now (only its hash is kept)."]

    emit(as_json, create(ws, name, agent_id=agent_id, read_only=read_only), text)


@tokens_group.command("list")
@json_option
@pass_workspace(create=False)
def tokens_list_cmd(ws, as_json):
    """The tokens: name, scope, created, last used (never the token itself).

    Example: synapolis tokens list --json
    """
    from ..tokens import list_tokens

    def text(d):
        if not d["tokens"]:
            return "no tokens: create one with `synapolis tokens create NAME`"
        rows = [[t["name"], t["agent_id"] or "(any)", "read-only" if t["read_only"] else "read-write",
                 ago(t["created_at"]), ago(t["last_used_at"]) if t["last_used_at"] else "never"]
                for t in d["tokens"]]
        return table(rows, ["NAME", "AGENT", "ACCESS", "CREATED", "LAST USED"])

    emit(as_json, list_tokens(ws), text)


@tokens_group.command("revoke")
@click.argument("name")
@json_option
@pass_workspace(create=False)
def tokens_revoke_cmd(ws, name, as_json):
    """Revoke the token NAME; a running server refuses it from its next request on.

    Example: synapolis tokens revoke laptop-claude
    """
    from ..tokens import revoke

    emit(as_json, revoke(ws, name), lambda d: f"revoked token {d['revoked']['name']}")
