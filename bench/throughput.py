"""Serving throughput and latency, mlxcel vs mlx_lm.server on the same model and dtype (float32),
in one run: TTFT and aggregate decode tokens/s at 1, 4, 8 and 16 concurrent streaming clients,
with distinct prompts and with a shared ~3.7k-token prefix (after one warm-up request that
caches it). Results as ratios mlxcel / mlx_lm, and for mlxcel where each level's engine time
went (from the deltas of its /metrics step counters): prefill, and per decode step the model,
sampling and the rest of the scheduler's step.

Usage: python bench/throughput.py [--peers mlxcel,mlx_lm] [--clients 1,4,8,16] [--out DIR]
Writes DIR/throughput.json and DIR/throughput.md.
"""
import argparse
import http.client
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from common import MlxLm, Mlxcel, machine, request, stream_chat, wait_for
from footprint import CAPACITY, document, system_prompt

MAX_TOKENS = 64
ROUNDS = 2


def workload(kind, client, round_):
    if kind == "shared_prefix":
        return [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": f"Visitor {client} round {round_}: which rule mentions fog?"}]
    return [{"role": "user", "content": document(1000 + client * 10 + round_, 14)}]


def run_level(port, kind, clients, first_client=0):
    """`clients` concurrent clients (numbered from `first_client`: other numbers, other prompts),
    ROUNDS requests each; returns the figures."""
    def one(c):
        out = []
        for r in range(ROUNDS):
            body = {"messages": workload(kind, first_client + c, r), "max_tokens": MAX_TOKENS, "temperature": 0}
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


STEP_METRICS = {
    "prefill_s": 'mlxcel_engine_seconds_total{phase="prefill"}',
    "model_s": 'mlxcel_engine_seconds_total{phase="model"}',
    "sampling_s": 'mlxcel_engine_seconds_total{phase="sampling"}',
    "other_s": 'mlxcel_engine_seconds_total{phase="other"}',
    "prefill_tokens": "mlxcel_prefill_tokens_total",
    "decode_steps": "mlxcel_decode_steps_total",
    "decode_rows": "mlxcel_decode_rows_total",
}


def step_totals(port):
    """mlxcel's engine step counters, once its engine is idle (the counters are published with
    the running count after every step, so idle means the last step is in them)."""
    def idle():
        status, h = request(port, "GET", "/health", timeout=30)
        d = ((h or {}).get("processes") or {}).get("daemon") or {}
        return status == 200 and d.get("running") == 0 and d.get("waiting") == 0
    wait_for("the engine went idle", idle, 300)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    values = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        values[name] = value
    return {k: float(values[m]) for k, m in STEP_METRICS.items()}


def breakdown(before, after):
    """Where the engine's time went between two readings: prefill seconds and tokens, decode
    steps, mean batch, ms per step in the model, in sampling and in the rest of the step."""
    d = {k: after[k] - before[k] for k in before}
    steps = max(d["decode_steps"], 1)
    return {"prefill_s": round(d["prefill_s"], 2), "prefill_tokens": int(d["prefill_tokens"]),
            "decode_steps": int(d["decode_steps"]), "mean_batch": round(d["decode_rows"] / steps, 2),
            "model_ms_per_step": round(d["model_s"] * 1e3 / steps, 2),
            "sampling_ms_per_step": round(d["sampling_s"] * 1e3 / steps, 2),
            "other_ms_per_step": round(d["other_s"] * 1e3 / steps, 2)}


def run_peer(peer, levels):
    server = Mlxcel("mlxcel", {}) if peer == "mlxcel" else MlxLm("mlx_lm", CAPACITY)
    try:
        out = []
        for kind in ("distinct", "shared_prefix"):
            if kind == "shared_prefix":  # cache the prefix once
                stream_chat(server.port, {"messages": workload(kind, 999, 0), "max_tokens": 1, "temperature": 0})
            for clients in levels:
                print(f"[throughput] {peer} {kind} x{clients} ...", flush=True)
                before = step_totals(server.port) if peer == "mlxcel" else None
                r = run_level(server.port, kind, clients)
                if before is not None:
                    r["steps"] = breakdown(before, step_totals(server.port))
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
    lines += ["", "mlxcel's engine per level (deltas of its /metrics step counters): prefill time and tokens, decode "
              "steps, mean batch, and ms per decode step in the model, in sampling and in the rest of the step.", "",
              "| workload | clients | prefill s | prefill tokens | decode steps | mean batch | model ms/step | sampling ms/step | other ms/step |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (peer, kind, clients), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        st = r.get("steps")
        if peer == "mlxcel" and st:
            lines.append(f"| {kind} | {clients} | {st['prefill_s']} | {st['prefill_tokens']} | {st['decode_steps']} | "
                         f"{st['mean_batch']} | {st['model_ms_per_step']} | {st['sampling_ms_per_step']} | {st['other_ms_per_step']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default="mlxcel,mlx_lm")
    ap.add_argument("--clients", default="1,4,8,16")
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
