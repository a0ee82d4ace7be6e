"""Commands of the claimed_by lock helper: claim, release, claims, claim-check (contract §9)."""

from __future__ import annotations

import click

from .. import actions
from .. import claims as cl
from ..store import clock
from .common import agent_options, ago, emit, json_option, pass_workspace, table, with_pending


def _claim_text(data) -> str:
    record, event = data["claim"], data["event"]
    verb = {"claimed": "claimed", "renewed": "renewed", "taken_over": "took over"}.get(event, event)
    line = f"{verb} {record['item']}"
    if event == "taken_over":
        prev = record["taken_over_from"]
        line += f" from {prev['agent_id']} ({prev['reason']})"
    return f"{line}  token {record['token']}  expires {ago(record['expires_at'])} ({record['expires_at']})"


def _release_text(data) -> str:
    record, event = data["claim"], data["event"]
    if event is None:
        return f"{record['item']} was already released {ago(record['released_at'])}"
    if event == "force_released":
        return (f"force-released {record['item']} from {record['claimed_by']} (token {record['token']}): "
                f"{record['release_reason']}")
    return f"released {record['item']} (token {record['token']})"


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
    data = actions.claim(ws, who, item, ttl_s=ttl, wait_s=wait, piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(_claim_text(d), d))


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
    data = actions.release(ws, who, item, force=force, reason=reason, piggyback=piggyback)
    emit(as_json, data, lambda d: with_pending(_release_text(d), d))


@click.command("claims")
@click.option("--held", "only_held", is_flag=True, help="Only claims held now (not expired or released).")
@json_option
@pass_workspace(create=False)
def claims_cmd(ws, only_held, as_json):
    """List every claim: item, state, holder and its effective status, token, ages.

    Example: synapolis claims --held
    """
    now = clock(ws)
    entries = cl.list_claims(ws, now, held_only=only_held)

    def text(data):
        if not data["claims"]:
            return "no claims"
        rows = []
        for e in data["claims"]:
            if e["state"] == "invalid":
                rows.append([e["file"], "invalid", "-", "-", "-", "-", e["error"]])
                continue
            until = (f"released {ago(e['released_at'], now)}" if e["state"] == "released"
                     else f"{'expired' if e['state'] == 'expired' else 'expires'} {ago(e['expires_at'], now)}")
            rows.append([e["item"], e["state"], e["claimed_by"], e["holder_status"] or "-", e["token"],
                         ago(e["claimed_at"], now), until])
        return table(rows, ["ITEM", "STATE", "HOLDER", "HOLDER STATUS", "TOKEN", "CLAIMED", "LEASE"])

    emit(as_json, {"claims": entries}, text)


@click.command("claim-check")
@click.argument("item")
@click.option("--token", type=int, required=True, help="The fencing token to check.")
@json_option
@pass_workspace(create=False)
def claim_check_cmd(ws, item, token, as_json):
    """Exit 0 only while TOKEN is the live holder's token of ITEM (7 otherwise, 6 never claimed).

    Example: synapolis claim-check src/api/users.py --token 4 && apply-the-write
    """
    data = actions.claim_check(ws, None, item, token)
    record = data["claim"]
    emit(as_json, data, lambda d: f"ok: token {token} is live for {item} (held by {record['claimed_by']}, "
                                  f"expires {ago(record['expires_at'])})")
