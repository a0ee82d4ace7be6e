#!/usr/bin/env python3
"""Draw bench_flat.py's scaling curves, one small PNG per workload, from benchmarks/flat-quiet.json and
flat-loaded.json: the inbox page by signals in the session, the broadcast by agents registered (with the
floor, the cheapest read of their ids, and a process's first broadcast, nothing kept), the monitor
pass by heartbeat files (with the json-loading baseline).

matplotlib is a benchmark-only dependency: `pip install -e '.[bench]'`.

    python benchmarks/plot_flat.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"quiet": "-", "loaded": "--"}
STORES = {"sqlite": "tab:blue", "postgres": "tab:orange"}


def load() -> dict:
    found = {}
    for kind in RUNS:
        path = HERE / f"flat-{kind}.json"
        if path.exists():
            found[kind] = json.loads(path.read_text("utf-8"))
    if not found:
        raise SystemExit("no benchmarks/flat-*.json: run benchmarks/bench_flat.py first")
    return found


def figure(title: str, xlabel: str):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=100)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("p50 ms", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def save(fig, ax, name: str, where: str = "upper left") -> None:
    ax.legend(fontsize=7, loc=where)
    fig.tight_layout()
    fig.savefig(HERE / name)
    print(f"wrote benchmarks/{name}")


def plot_read(runs: dict) -> None:
    fig, ax = figure("read_signals {limit: 20} by signals in the session", "signals in the session")
    for kind, data in runs.items():
        for store, colour in STORES.items():
            curve = data.get(store, {}).get("read")
            if curve:
                xs = sorted(int(k) for k in curve)
                ax.plot(xs, [curve[str(x)] for x in xs], RUNS[kind], marker="o", color=colour, label=f"{store}, {kind}")
    ax.set_yscale("linear")  # flat is the point: from zero, so a flat line looks flat
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.6)  # room above the curves for the legend
    save(fig, ax, "flat-read.png", where="upper center")


def plot_broadcast(runs: dict) -> None:
    fig, ax = figure("broadcast (signals.send to *) by agents registered", "agents registered")
    for kind, data in runs.items():
        for store, colour in STORES.items():
            curve = data.get(store, {}).get("broadcast")
            if not curve:
                continue
            xs = sorted(int(k.split()[1]) for k in curve if k.startswith("send"))
            ax.plot(xs, [curve[f"send {x}"] for x in xs], RUNS[kind], marker="o", color=colour,
                    label=f"{store} send, {kind}")
            if all(f"first {x}" in curve for x in xs):
                ax.plot(xs, [curve[f"first {x}"] for x in xs], RUNS[kind], marker="s", color=colour, alpha=0.7,
                        label=f"{store} a process's first send, {kind}")
            ax.plot(xs, [curve[f"ids {x}"] for x in xs], RUNS[kind], marker="x", color=colour, alpha=0.45,
                    label=f"{store} the ids alone (floor), {kind}")
    save(fig, ax, "flat-broadcast.png")


def plot_monitor(runs: dict) -> None:
    fig, ax = figure("monitor pass by heartbeat files", "heartbeat files")
    for kind, data in runs.items():
        curve = data.get("monitor")
        if not curve:
            continue
        xs = sorted(int(k) for k in curve)
        for key, colour, label in (("base", "tab:gray", "json-load every file (baseline)"),
                                   ("first", "tab:red", "run_monitor, first pass"),
                                   ("monitor", "tab:green", "run_monitor, repeated pass")):
            ax.plot(xs, [curve[str(x)][key] for x in xs], RUNS[kind], marker="o", color=colour,
                    label=f"{label}, {kind}")
    save(fig, ax, "flat-monitor.png")


def main() -> int:
    runs = load()
    plot_read(runs)
    plot_broadcast(runs)
    plot_monitor(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
