"""Charts for a results folder: footprint over time per scenario (total resident memory of each
configuration's processes) and throughput bars. Usage: python bench/plot.py DIR"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from footprint import total  # noqa: E402

MIB = 1 << 20
# One colour per configuration in every chart.
COLOURS = {"mlxcel": "tab:blue", "mlxcel_small_cache": "tab:green", "mlxcel_cache_off": "tab:purple",
           "mlx_lm": "tab:orange"}


def footprint(folder):
    path = os.path.join(folder, "footprint.json")
    if not os.path.exists(path):
        return
    results = json.load(open(path))["results"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in results))
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(9, 3 * len(scenarios)), squeeze=False)
    for ax, scenario in zip(axes[:, 0], scenarios):
        for r in (r for r in results if r["scenario"] == scenario):
            xs = [s["t"] for s in r["samples"]]
            ys = [total(s) / MIB for s in r["samples"]]
            ax.plot(xs, ys, label=r["config"], color=COLOURS.get(r["config"]))
        ax.set_title(scenario)
        ax.set_xlabel("seconds")
        ax.set_ylabel("resident MiB (all processes)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "footprint.png"), dpi=90)


def throughput(folder):
    path = os.path.join(folder, "throughput.json")
    if not os.path.exists(path):
        return
    rows = json.load(open(path))["rows"]
    keys = sorted({(r["workload"], r["clients"]) for r in rows})
    peers = sorted({r["peer"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        by = {(r["workload"], r["clients"]): r["aggregate_tok_s"] for r in rows if r["peer"] == peer}
        ax.bar([k + i * width for k in range(len(keys))], [by.get(k, 0) for k in keys], width, label=peer,
               color=COLOURS.get(peer))
    ax.set_xticks([k + width * (len(peers) - 1) / 2 for k in range(len(keys))])
    ax.set_xticklabels([f"{w}\nx{c}" for w, c in keys])
    ax.set_ylabel("aggregate tok/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "throughput.png"), dpi=90)


if __name__ == "__main__":
    footprint(sys.argv[1])
    throughput(sys.argv[1])
