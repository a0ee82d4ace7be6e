"""Commands of the claimed_by lock helper: claim, release, claims, claim-check (contract §9), guard (§14)."""

from __future__ import annotations

import click

from . import hot
from .common import agent_options, ago, emit, json_option, pass_workspace, table


@click.command("claim")
@click.argument("item")
@click.option("--ttl", type=float, default=None, help="Lease length in seconds (default: claim_ttl_s, 3600).")
@click.option("--wait", type=float, default=0.0, help="Wait up to this many seconds while a live other holds it.")
@agent_options
@pass_workspace(create=False)
def claim_cmd(ws, item, ttl, wait, who, piggyback, as_json):
    """Claim ITEM for this agent (renew it if yours; take it over if its holder is gone).

    Exit 3 when a live agent holds it, naming the holder and expiry.

    Example: synapolis claim ticket:142 --agent-id alice --ttl 1800 --wait 30
    """
    emit(as_json, *hot.claim(ws, who, piggyback, item, ttl=ttl, wait=wait))


@click.command("release")
@click.argument("item")
@click.option("--force", is_flag=True, help="Release another agent's claim (needs --reason).")
@click.option("--reason", default=None, help="Why; recorded in the claim and claims.jsonl.")
@agent_options
@pass_workspace(create=False)
def release_cmd(ws, item, force, reason, who, piggyback, as_json):
    """Release ITEM; only its holder may, unless --force --reason TEXT.

    Example: synapolis release ticket:142 --agent-id alice
    """
    emit(as_json, *hot.release(ws, who, piggyback, item, force=force, reason=reason))


@click.command("claims")
@click.option("--held", "only_held", is_flag=True, help="Only claims held now (not expired or released).")
@json_option
@pass_workspace(create=False)
def claims_cmd(ws, only_held, as_json):
    """List every claim: item, state, holder and its effective status, token, ages; then who waits for what.

    Example: synapolis claims --held
    """
    from .. import claims_view
    from ..timeutil import parse_ts

    data = claims_view.claims_view(ws, held_only=only_held)  # through the team server too (§16)
    now = parse_ts(data.pop("now"))

    def text(data):
        waiters = [f"{w['agent_id']} waits for {w['item']} (blocked by {', '.join(w['blocked_by'])}) since "
                   f"{ago(w['since'], now)}" for w in data["waiting"]]
        if not data["claims"]:
            return ["no claims"] + waiters
        rows = []
        for e in data["claims"]:
            if e["state"] == "invalid":
                rows.append([e["file"], "invalid", "-", "-", "-", "-", e["error"]])
                continue
            until = (f"released {ago(e['released_at'], now)}" if e["state"] == "released"
                     else f"{'expired' if e['state'] == 'expired' else 'expires'} {ago(e['expires_at'], now)}")
            rows.append([e["item"], e["state"], e["claimed_by"], e["holder_status"] or "-", e["token"],
                         ago(e["claimed_at"], now), until])
        return [table(rows, ["ITEM", "STATE", "HOLDER", "HOLDER STATUS", "TOKEN", "CLAIMED", "LEASE"])] + waiters

    emit(as_json, data, text)


@click.command("claim-check")
@click.argument("item")
@click.option("--token", type=int, required=True, help="The fencing token to check.")
@json_option
@pass_workspace(create=False)
def claim_check_cmd(ws, item, token, as_json):
    """Exit 0 only while TOKEN is the live holder's token of ITEM (7 otherwise, 6 never claimed).

    Example: synapolis claim-check src/api/users.py --token 4 && apply-the-write
    """
    emit(as_json, *hot.claim_check(ws, None, False, item, token))


@click.command("guard")
@click.argument("paths", nargs=-1)
@click.option("--staged", is_flag=True, help="Also the paths of the git index's staged changes (both sides of a rename).")
@click.option("--agent-id", default=None, help="Answer for this agent (else $SYNAPOLIS_AGENT_ID, identity.json).")
@click.option("--session-id", default=None, help="The session (else $SYNAPOLIS_SESSION_ID, identity.json).")
@click.option("--run-token", default=None, help="This agent's run token (else $SYNAPOLIS_RUN_TOKEN).")
@click.option("--commit", "for_commit", is_flag=True,
              help="Asked by git's pre-commit hook: a refusal is a refused commit, shown on the dashboard and told "
                   "to the notify targets (io.synapolis.guard.denied, data.refused \"commit\").")
@json_option
@pass_workspace(create=False)
def guard_cmd(ws, paths, staged, agent_id, session_id, run_token, for_commit, as_json):
    """May this agent write PATHS? Exit 0 when each is free or held only by the caller (or its sub-agents),
    3 when a live other holds any, one line per blocked path. PATHS are absolute or relative to the project
    root; with no identity at all, every path a live agent holds is blocked. Changes nothing, except that with
    --commit (git's pre-commit hook) a refusal is recorded as an event and told.

    Example: synapolis guard src/api/users.py docs/api.md --agent-id alice
    """
    from .. import actions
    from ..guard import staged_paths
    from ..identity import Who

    wanted = list(paths) + (staged_paths() if staged else [])
    # with --commit a refusal is recorded by the verb, so through the team server it lands on the server's record
    data = actions.guard(ws, Who(agent_id, session_id, run_token), wanted, commit=for_commit)

    def text(d):
        if d["allowed"]:
            free = f"ok: {len(wanted)} path{'s' if len(wanted) != 1 else ''} free"
            return free + (f" for {d['agent_id']}" if d["agent_id"] else " (no agent: held by nobody live)")
        lines = []
        for b in d["blocked"]:
            lines.append(f"blocked: {b['relative_path']} is held by {b['claimed_by']} ({b['item']}, token {b['token']}) "
                         f"until {b['expires_at']} ({ago(b['expires_at'])}); ask: synapolis signal {b['claimed_by']} "
                         f"'may I edit {b['relative_path']}?'")
        return lines

    emit(as_json, data, text)
    if not data["allowed"]:
        raise SystemExit(3)
