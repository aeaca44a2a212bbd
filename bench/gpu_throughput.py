"""GPU serving benchmark: mlxcel vs mlx_lm.server on one model directory (a random-weight Llama
from bench/random_llama.py, float16), the same streaming client for both, in one run:
  - startup (until the server answers) and the first request after it against a warm one, and
    the two together (a server that defers its weights' first use or its kernel builds to the
    first request starts sooner and answers it later: the sum is what a user waits);
  - aggregate decode tok/s and TTFT at 1, 8 and 32 clients with distinct ~320-token prompts;
  - a cold ~4k-token prompt and the same prompt repeated (its prefix cached): TTFT and the
    decode rate after it;
  - each server's GPU memory (nvidia-smi) idle, after the first request and after the run
    (MLX keeps loaded weights in CUDA managed memory, counted on the GPU once a kernel has read
    them: a server that has not run its model yet shows less).

Usage: python bench/gpu_throughput.py --model DIR --out DIR [--peers mlxcel,mlx_lm]
       [--clients 1,8,32] [--max-batch-size 32] [--cold-levels]
Each level runs once unmeasured first, with other prompts (unless --cold-levels): mlx_lm builds
a batch shape's kernels on first use, which once made its 8-client cell a compile benchmark.
mlxcel runs with --max-batch-size (default 32, mlx_lm.server's decode concurrency); both keep
their other defaults. Writes DIR/gpu_throughput.json and DIR/gpu_throughput.md.
"""
import argparse
import json
import os
import shutil
import subprocess
import time

from common import RESENT, MlxLm, Mlxcel, machine, stream_chat
from footprint import CAPACITY, document
from throughput import MAX_TOKENS, run_level

LONG_SENTENCES = 185  # ~4.1k tokens in SmolLM2's tokenizer


def gpu_mib(pids):
    """GPU memory (MiB) of `pids` together, from nvidia-smi; None where it says nothing."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = {int(p): int(m) for p, m in (l.split(",") for l in out.strip().splitlines() if "," in l)}
    mine = [used[p] for p in pids if p in used]
    return sum(mine) if mine else None


def one(port, messages, max_tokens=MAX_TOKENS):
    ttft, total, tokens, _ = stream_chat(port, {"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    decode = (tokens - 1) / (total - ttft) if ttft is not None and tokens > 1 and total > ttft else None
    return {"ttft": round(ttft, 3), "total": round(total, 3), "tokens": tokens,
            "decode_tok_s": round(decode, 1) if decode else None}


def run_peer(peer, model, levels, max_batch, out_dir, warm):
    started = time.monotonic()
    if peer == "mlxcel":
        # The warm-up's debug lines name the kernels each stage built (a first start's).
        env = {"MLXCEL_MODEL": model, "MLXCEL_MAX_BATCH_SIZE": str(max_batch),
               "MLXCEL_LOG": "info,mlxcel_daemon::engine::warmup=debug"}
        server = Mlxcel("mlxcel", env, serve_args=("--startup-timeout", "900s"))
    else:
        server = MlxLm("mlx_lm", CAPACITY, model=model, gpu=True)
    out = {"peer": peer, "startup_s": round(time.monotonic() - started, 1)}
    try:
        pids = list(server.pids.values())
        out["gpu_mib_idle"] = gpu_mib(pids)
        short = [{"role": "user", "content": document(7, 14)}]
        out["first_request"] = one(server.port, short)
        out["gpu_mib_first"] = gpu_mib(pids)
        out["warm_request"] = one(server.port, short)
        out["levels"] = []
        if warm:
            # Each level once with other prompts, unmeasured: a server that builds kernels for
            # a batch shape on first use (mlx_lm does) pays that here, not in the figures.
            for clients in levels:
                print(f"[gpu] {peer} warming x{clients} (unmeasured) ...", flush=True)
                run_level(server.port, "distinct", clients, first_client=500)
        for clients in levels:
            print(f"[gpu] {peer} distinct x{clients} ...", flush=True)
            before = RESENT["count"]
            r = dict(run_level(server.port, "distinct", clients), resent=RESENT["count"] - before)
            print(f"[gpu] {peer} x{clients}: {r['aggregate_tok_s']} tok/s, TTFT p50 {r['ttft_p50']} s, "
                  f"{r['resent']} requests sent again", flush=True)
            out["levels"].append(r)
        long = [{"role": "user", "content": document(4242, LONG_SENTENCES)}]
        out["long_cold"] = one(server.port, long)
        out["long_repeated"] = one(server.port, long)
        print(f"[gpu] {peer} 4k cold {out['long_cold']} repeated {out['long_repeated']}", flush=True)
        out["gpu_mib_after"] = gpu_mib(pids)
        return out
    finally:
        server.log.flush()
        shutil.copy(server.log.name, os.path.join(out_dir, f"{peer}.log"))
        server.stop()


def ratio(a, b, invert=False):
    if not a or not b:
        return "-"
    return f"{(b / a if invert else a / b):.2f}x"


def markdown(runs, info, model, warm):
    m, p = runs.get("mlxcel", {}), runs.get("mlx_lm", {})
    lines = ["# GPU throughput", "", f"Machine: {info['system']}; mlxcel {info['mlxcel']}; model `{os.path.basename(model)}` "
             f"(float16); streaming chat, {MAX_TOKENS} tokens per request, temperature 0. "
             "Ratios are mlxcel / mlx_lm for rates and mlx_lm / mlxcel for times (above 1 = mlxcel ahead). "
             + ("Each level ran once unmeasured first, with other prompts." if warm else
                "Levels measured cold (--cold-levels): first builds of batch shapes count."), "",
             "| what | mlxcel | mlx_lm | ratio |", "|---|---|---|---|"]
    by = {peer: {r["clients"]: r for r in run.get("levels", [])} for peer, run in runs.items()}
    for clients in sorted(by.get("mlxcel", {})):
        a, b = by["mlxcel"][clients], by.get("mlx_lm", {}).get(clients, {})
        lines.append(f"| aggregate tok/s, {clients} clients | {a['aggregate_tok_s']} | {b.get('aggregate_tok_s', '-')} | "
                     f"{ratio(a['aggregate_tok_s'], b.get('aggregate_tok_s'))} |")
        lines.append(f"| TTFT p50 s, {clients} clients | {a['ttft_p50']} | {b.get('ttft_p50', '-')} | "
                     f"{ratio(a['ttft_p50'], b.get('ttft_p50'), invert=True)} |")
    for key, label in (("long_cold", "4k prompt cold"), ("long_repeated", "4k prompt repeated")):
        a, b = m.get(key) or {}, p.get(key) or {}
        lines.append(f"| {label}: TTFT s | {a.get('ttft', '-')} | {b.get('ttft', '-')} | {ratio(a.get('ttft'), b.get('ttft'), invert=True)} |")
        lines.append(f"| {label}: decode tok/s after | {a.get('decode_tok_s', '-')} | {b.get('decode_tok_s', '-')} | "
                     f"{ratio(a.get('decode_tok_s'), b.get('decode_tok_s'))} |")
    for key, label in (("first_request", "first request after startup"), ("warm_request", "the same request again")):
        a, b = m.get(key) or {}, p.get(key) or {}
        lines.append(f"| {label}: total s | {a.get('total', '-')} | {b.get('total', '-')} | {ratio(a.get('total'), b.get('total'), invert=True)} |")
    for run in (m, p):
        if run.get("startup_s") is not None and (run.get("first_request") or {}).get("total") is not None:
            run["startup_and_first_s"] = round(run["startup_s"] + run["first_request"]["total"], 1)
    for key, label in (("startup_s", "startup until it answers, s"),
                       ("startup_and_first_s", "startup and the first request, s"),
                       ("gpu_mib_idle", "GPU MiB idle"), ("gpu_mib_first", "GPU MiB after the first request"),
                       ("gpu_mib_after", "GPU MiB after the run")):
        lines.append(f"| {label} | {m.get(key, '-')} | {p.get(key, '-')} | {ratio(m.get(key), p.get(key), invert=True)} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--peers", default="mlxcel,mlx_lm")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--cold-levels", action="store_true",
                    help="measure each level without first running it once unmeasured (with other "
                         "prompts); then a server's first build of a batch shape's kernels counts")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    levels = [int(c) for c in args.clients.split(",")]
    runs = {}
    for peer in args.peers.split(","):
        try:
            runs[peer] = run_peer(peer, args.model, levels, args.max_batch_size, args.out, not args.cold_levels)
        except Exception as e:  # one peer failing still leaves the other's figures
            runs[peer] = {"peer": peer, "error": repr(e)}
            print(f"[gpu] {peer} failed: {e!r}", flush=True)
        with open(os.path.join(args.out, "gpu_throughput.json"), "w") as f:
            json.dump({"machine": info, "model": args.model, "runs": runs}, f, indent=1)
    md = markdown(runs, info, args.model, not args.cold_levels)
    with open(os.path.join(args.out, "gpu_throughput.md"), "w") as f:
        f.write(md)
    print(md, flush=True)


if __name__ == "__main__":
    main()
