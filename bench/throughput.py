"""Serving throughput and latency, mlxcel vs mlx_lm.server on the same model and dtype (float32),
in one run: TTFT and aggregate decode tokens/s at 1, 4 and 8 concurrent streaming clients, with
distinct prompts and with a shared ~3.7k-token prefix (after one warm-up request that caches
it). Results as ratios mlxcel / mlx_lm.

Usage: python bench/throughput.py [--peers mlxcel,mlx_lm] [--clients 1,4,8] [--out DIR]
Writes DIR/throughput.json and DIR/throughput.md.
"""
import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from common import MlxLm, Mlxcel, machine, stream_chat
from footprint import CAPACITY, document, system_prompt

MAX_TOKENS = 64
ROUNDS = 2


def workload(kind, client, round_):
    if kind == "shared_prefix":
        return [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": f"Visitor {client} round {round_}: which rule mentions fog?"}]
    return [{"role": "user", "content": document(1000 + client * 10 + round_, 14)}]


def run_level(port, kind, clients):
    """`clients` concurrent clients, ROUNDS requests each; returns the figures."""
    def one(c):
        out = []
        for r in range(ROUNDS):
            body = {"messages": workload(kind, c, r), "max_tokens": MAX_TOKENS, "temperature": 0}
            out.append(stream_chat(port, body))
        return out
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        runs = [x for per_client in pool.map(one, range(clients)) for x in per_client]
    wall = time.monotonic() - start
    ttfts = [r[0] for r in runs if r[0] is not None]
    tokens = sum(r[2] for r in runs)
    cached = [((r[3] or {}).get("prompt_tokens_details") or {}).get("cached_tokens") for r in runs]
    return {"clients": clients, "workload": kind, "requests": len(runs), "wall_seconds": round(wall, 2),
            "completion_tokens": tokens, "aggregate_tok_s": round(tokens / wall, 2),
            "ttft_p50": round(statistics.median(ttfts), 3), "ttft_max": round(max(ttfts), 3),
            "cached_tokens": cached}


def run_peer(peer, levels):
    server = Mlxcel("mlxcel", {}) if peer == "mlxcel" else MlxLm("mlx_lm", CAPACITY)
    try:
        out = []
        for kind in ("distinct", "shared_prefix"):
            if kind == "shared_prefix":  # cache the prefix once
                stream_chat(server.port, {"messages": workload(kind, 999, 0), "max_tokens": 1, "temperature": 0})
            for clients in levels:
                print(f"[throughput] {peer} {kind} x{clients} ...", flush=True)
                r = run_level(server.port, kind, clients)
                print(f"[throughput] {peer} {kind} x{clients}: {r['aggregate_tok_s']} tok/s, TTFT p50 {r['ttft_p50']} s", flush=True)
                out.append(dict(r, peer=peer))
        return out
    finally:
        server.stop()


def markdown(rows, info):
    lines = ["# Throughput", "", f"Machine: {info['system']}, {info['cpus']} CPUs; mlxcel {info['mlxcel']}; packages {info['packages']}. "
             f"Streaming chat, {MAX_TOKENS} tokens per request at temperature 0, {ROUNDS} requests per client; "
             "aggregate tok/s = completion tokens / wall time of the level (prefill included).", "",
             "| workload | clients | mlxcel tok/s | mlx_lm tok/s | ratio | mlxcel TTFT p50 s | mlx_lm TTFT p50 s | TTFT ratio (mlx_lm / mlxcel) |",
             "|---|---|---|---|---|---|---|---|"]
    by = {(r["peer"], r["workload"], r["clients"]): r for r in rows}
    for (peer, kind, clients), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if peer != "mlxcel":
            continue
        m = by.get(("mlx_lm", kind, clients))
        ratio = f"{r['aggregate_tok_s'] / m['aggregate_tok_s']:.2f}x" if m and m["aggregate_tok_s"] else "-"
        tratio = f"{m['ttft_p50'] / r['ttft_p50']:.2f}x" if m and r["ttft_p50"] else "-"
        lines.append(f"| {kind} | {clients} | {r['aggregate_tok_s']} | {m['aggregate_tok_s'] if m else '-'} | {ratio} | "
                     f"{r['ttft_p50']} | {m['ttft_p50'] if m else '-'} | {tratio} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default="mlxcel,mlx_lm")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--out", default=os.path.join("bench", "results", time.strftime("%Y%m%d-%H%M%S")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    levels = [int(c) for c in args.clients.split(",")]
    rows = []
    for peer in args.peers.split(","):
        rows += run_peer(peer, levels)
        with open(os.path.join(args.out, "throughput.json"), "w") as f:
            json.dump({"machine": info, "rows": rows}, f)
    md = markdown(rows, info)
    with open(os.path.join(args.out, "throughput.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
