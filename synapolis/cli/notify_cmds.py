"""Commands of §15: `notify test` (sends one test event to every `notify` target and says how each went)."""

from __future__ import annotations

import sys

import click

from .common import CommandGroup, emit, json_option, pass_workspace


@click.group("notify", cls=CommandGroup)
def notify_group():
    """The `notify` targets of synapolis.json (webhooks: cloudevents, slack, ntfy).

    Example: synapolis notify test --json
    """


def _test_text(data) -> list[str]:
    if not data["targets"]:
        return ['no notify targets: add {"url": ..., "format": "ntfy"} to "notify" in synapolis.json']
    lines = []
    for r in data["targets"]:
        how = f"delivered (HTTP {r['status']}" + (f", {r['tries']} tries)" if r["tries"] > 1 else ")") if r["ok"] \
            else f"FAILED: {r['error']}"
        lines.append(f"{r['format']:<11} {r['url']}  {how}")
    lines.append(f"{data['delivered']} delivered, {data['failed']} failed")
    return lines


@notify_group.command("test")
@json_option
@pass_workspace(create=False)
def notify_test_cmd(ws, as_json):
    """Send one io.synapolis.test event to every target and report each outcome (exit 0: all delivered).

    Example: synapolis --state-dir ./state notify test --json
    """
    from ..notify import send_test

    data = send_test(ws)
    emit(as_json, data, _test_text)
    if data["failed"] or not data["targets"]:
        sys.exit(1)
