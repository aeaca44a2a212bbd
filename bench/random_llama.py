"""A random-weight Llama as a Hugging Face / MLX directory (config.json, model.safetensors in
float16, SmolLM2's tokenizer), for GPU benchmarks at sizes the default model does not reach.

The rows of the special tokens in the (tied) embedding are zeroed, so their logits are 0 while
every other token's is random: greedy generations never pick an end token and run to max_tokens.
Weights are slices of one pool of N(0, 0.02) values at random offsets, so an 8B-like directory
is written at disk speed; they are not independent, which a throughput benchmark does not see.

Usage: python bench/random_llama.py --like tiny|1b|8b --tokenizer DIR --out DIR
(DIR of --tokenizer holds SmolLM2's tokenizer.json, tokenizer_config.json and config.json, as
`mlxcel-daemon --export-mlx` writes them.) numpy only.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

SHAPES = {
    # A few MiB, for checking the benchmark's own plumbing on a CPU.
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=512),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, intermediate_size=8192),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=14336),
}
POOL = 1 << 26


def tensors(c):
    """(name, shape) of every weight, in file order."""
    h, i = c["hidden_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    yield "model.embed_tokens.weight", (c["vocab_size"], h)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)


def special_ids(tokenizer_dir):
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    return sorted(t["id"] for t in tok.get("added_tokens", []) if t.get("special"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--like", choices=sorted(SHAPES), required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.tokenizer, "config.json")) as f:
        base = json.load(f)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[args.like],
        "vocab_size": base["vocab_size"], "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": True, "torch_dtype": "float16",
        "bos_token_id": base.get("bos_token_id"), "eos_token_id": base.get("eos_token_id"),
    }
    os.makedirs(args.out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)

    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(POOL, dtype=np.float32) * 0.02).astype(np.float16)
    header, offset, plan = {"__metadata__": {"format": "pt"}}, 0, list(tensors(config))
    for name, shape in plan:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    zeroed = special_ids(args.tokenizer)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in plan:
            n = int(np.prod(shape))
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                f.write(np.ones(n, np.float16).tobytes())
                continue
            start = int(rng.integers(0, POOL))
            w = np.resize(np.roll(pool, -start), n).reshape(shape)
            if name == "model.embed_tokens.weight":
                w[zeroed] = 0
            f.write(w.tobytes())
    print(f"[random_llama] {args.like}-like: {sum(int(np.prod(s)) for _, s in plan) / 1e9:.2f}B "
          f"parameters, {offset / 2**30:.2f} GiB, special rows zeroed {zeroed} -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
