"""The model families beyond Llama served side by side with mlx_lm.server: for each, a
random-weight model made with mlx_lm's own classes (float32, SmolLM2's tokenizer, special
tokens' output rows zeroed so greedy answers run to max_tokens), served by mlxcel and then by
mlx_lm.server on the same directory, the same streaming client for both:
  - aggregate tok/s and TTFT p50 at 1 and 8 clients (distinct ~320-token prompts, 64 tokens each,
    2 requests per client, temperature 0; one unmeasured request first);
  - resident memory (RSS, all of a server's processes) once it answers and after the run.

The shapes are the families' small real releases scaled to what a 2-core, 24 GiB machine runs in
float32 (MLX's CPU backend gathers experts in float32 only): the experts' count, top k and
widths in the releases' proportions, Gemma 3 1B's own shape but for the vocabulary.

Usage: python bench/families.py [--families qwen3_moe,gpt_oss,gemma3_text] [--out DIR]
Writes DIR/families.json and DIR/families.md.
"""
import argparse
import json
import os
import shutil
import time

from common import MlxLm, Mlxcel, machine, rss_bytes, stream_chat
from footprint import CAPACITY
from throughput import run_level, workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct-mlx")
LEVELS = (1, 8)

FAMILIES = {
    # Qwen3-30B-A3B's proportions (128 experts, top 8, expert width 768 at hidden 2048), halved.
    "qwen3_moe": dict(
        model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=16, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=64,
        num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
        moe_intermediate_size=384, rms_norm_eps=1e-6, rope_theta=1e6,
        tie_word_embeddings=False, max_position_embeddings=8192, norm_topk_prob=True),
    # gpt-oss-20b's proportions (32 experts, top 4, sliding window 128 every other layer, sinks,
    # YaRN), narrower and shallower.
    "gpt_oss": dict(
        model_type="gpt_oss", hidden_size=1024, num_hidden_layers=12, intermediate_size=1024,
        num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_local_experts=32,
        num_experts_per_tok=4, rms_norm_eps=1e-5, sliding_window=128, rope_theta=150000,
        max_position_embeddings=8192,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 4096}),
    # Gemma 3 1B: 26 layers, a global one every 6th, window 512.
    "gemma3_text": dict(
        model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, intermediate_size=6912,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
        rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=256, sliding_window=512,
        sliding_window_pattern=6, max_position_embeddings=32768),
}


def build(family, out):
    """The random-weight model of `family` in `out` (kept between runs)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes, save_config, save_model

    if os.path.exists(os.path.join(out, "config.json")):
        return
    with open(os.path.join(TOKENIZER, "tokenizer.json")) as f:
        special = sorted(t["id"] for t in json.load(f).get("added_tokens", []) if t.get("special"))
    with open(os.path.join(TOKENIZER, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    mx.random.seed(0)
    cfg = dict(FAMILIES[family], vocab_size=vocab)
    Model, Args = _get_classes(cfg)
    model = Model(Args.from_dict(cfg))
    params = dict(tree_flatten(model.parameters()))
    head = "lm_head.weight" if "lm_head.weight" in params else "model.embed_tokens.weight"
    rows = params[head]
    rows[mx.array(special)] = 0
    zeros = [(k, mx.random.normal(v.shape) * 0.5) for k, v in params.items()
             if v.ndim == 1 and v.size and not mx.any(v).item()]
    model.update(tree_unflatten([(head, rows), *zeros]))
    mx.eval(model.parameters())
    os.makedirs(out, exist_ok=True)
    save_model(out, model)
    save_config(cfg, os.path.join(out, "config.json"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), os.path.join(out, name))
    n = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"[families] {family}: {n / 1e9:.2f}B parameters -> {out}", flush=True)


def rss(server):
    return sum(rss_bytes(p) or 0 for p in server.pids.values())


def serve(peer, family, model):
    server = (Mlxcel("mlxcel", {"MLXCEL_MODEL": model}) if peer == "mlxcel"
              else MlxLm("mlx_lm", CAPACITY, model=model))
    try:
        idle = rss(server)
        stream_chat(server.port, {"messages": workload("distinct", 999, 0), "max_tokens": 8, "temperature": 0})
        out = {"peer": peer, "family": family, "rss_idle": idle, "levels": []}
        for clients in LEVELS:
            r = run_level(server.port, "distinct", clients, first_client=100)
            print(f"[families] {family} {peer} x{clients}: {r['aggregate_tok_s']} tok/s, "
                  f"TTFT p50 {r['ttft_p50']} s", flush=True)
            out["levels"].append(dict(r, clients=clients))
        out["rss_after"] = rss(server)
        return out
    finally:
        server.stop()


def markdown(rows, info):
    gib = lambda b: f"{b / 2**30:.2f}"
    lines = ["# Families side by side with mlx_lm.server", "",
             f"Machine: {info['system']}, {info['cpus']} CPUs; mlxcel {info['mlxcel']}; packages {info['packages']}. "
             "Random-weight float32 models (bench/families.py), streaming chat, 64 tokens per request at "
             "temperature 0, 2 requests per client, distinct ~320-token prompts.", "",
             "| family | clients | mlxcel tok/s | mlx_lm tok/s | ratio | mlxcel TTFT p50 s | mlx_lm TTFT p50 s |",
             "|---|---|---|---|---|---|---|"]
    by = {(r["family"], r["peer"]): r for r in rows}
    families = sorted({r["family"] for r in rows})
    for fam in families:
        m, p = by.get((fam, "mlxcel")), by.get((fam, "mlx_lm"))
        for i, clients in enumerate(LEVELS):
            a = m["levels"][i] if m else None
            b = p["levels"][i] if p else None
            ratio = f"{a['aggregate_tok_s'] / b['aggregate_tok_s']:.2f}x" if a and b and b["aggregate_tok_s"] else "-"
            lines.append(f"| {fam} | {clients} | {a['aggregate_tok_s'] if a else '-'} | "
                         f"{b['aggregate_tok_s'] if b else '-'} | {ratio} | {a['ttft_p50'] if a else '-'} | "
                         f"{b['ttft_p50'] if b else '-'} |")
    lines += ["", "Resident memory (GiB, every process of the server):", "",
              "| family | mlxcel idle | mlx_lm idle | mlxcel after | mlx_lm after | after ratio (mlxcel / mlx_lm) |",
              "|---|---|---|---|---|---|"]
    for fam in families:
        m, p = by.get((fam, "mlxcel")), by.get((fam, "mlx_lm"))
        if m and p:
            lines.append(f"| {fam} | {gib(m['rss_idle'])} | {gib(p['rss_idle'])} | {gib(m['rss_after'])} | "
                         f"{gib(p['rss_after'])} | {m['rss_after'] / p['rss_after']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--out", default=os.path.join("bench", "results", time.strftime("%Y%m%d-%H%M%S")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for family in args.families.split(","):
        model = os.path.join(ROOT, "models", f"random-{family}")
        build(family, model)
        for peer in ("mlxcel", "mlx_lm"):
            rows.append(serve(peer, family, model))
    info = machine()
    with open(os.path.join(args.out, "families.json"), "w") as f:
        json.dump({"machine": info, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "families.md"), "w") as f:
        f.write(markdown(rows, info))
    print(markdown(rows, info))


if __name__ == "__main__":
    main()
