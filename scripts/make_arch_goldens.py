#!/usr/bin/env python3
"""Tiny random-weight models of each architecture the engine serves beyond Llama, made with
mlx_lm's own model classes, and mlx_lm's greedy answers on them: the independent reference the
engine's architecture tests compare with (daemon/tests/archs.rs).

For each architecture, daemon/tests/fixtures/archs/<name>/ gets config.json, model.safetensors
(float32: MLX's CPU backend gathers experts in float32 only), a word-level tokenizer and
reference.json: eight prompts of mixed lengths (the longest past any sliding window), for each
mlx_lm's 64 greedy tokens (prompt cache, token by token, as mlx_lm.generate runs), the gap
between the two best logits at each step (a near tie may go either way in another
implementation), and the prompt's last logits.

Run: .venv/bin/python scripts/make_arch_goldens.py [name ...]   (mlx-lm from `make bench-setup`)
"""

import copy
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes, load_model, save_config, save_model

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "daemon" / "tests" / "fixtures" / "archs"
VOCAB = 512
STEPS = 64
LENGTHS = [3, 9, 17, 33, 40, 64, 80, 100]

CONFIGS = {
    # Two sparse layers around a dense one (mlp_only_layers), top 2 of 8 experts, renormalized.
    "qwen3_moe": dict(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1],
        moe_intermediate_size=32, rms_norm_eps=1e-6, vocab_size=VOCAB, rope_theta=1e6,
        tie_word_embeddings=False, max_position_embeddings=4096, norm_topk_prob=True),
    # Local layers (window 16) with every third one global, whose RoPE is linearly scaled.
    "gemma3_text": dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=4, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=16,
        sliding_window=16, sliding_window_pattern=3, max_position_embeddings=4096,
        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # Sliding (window 16) and full layers alternating, sinks, biases, YaRN, top 2 of 8 experts
    # routed by gpt-oss's top-k-then-softmax through its clamped SwiGLU.
    "gpt_oss": dict(
        model_type="gpt_oss", hidden_size=64, num_hidden_layers=4, intermediate_size=32,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, vocab_size=VOCAB, rms_norm_eps=1e-5, sliding_window=16,
        rope_theta=150000, max_position_embeddings=4096,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 4096, "truncate": False}),
}

# Quantized variants: (base architecture, how). gpt-oss's experts in MXFP4 as it ships them;
# Qwen3-MoE in 4-bit affine groups of 32 with its routers at 8 bits in groups of 64, named per
# layer in the config as mlx-community's conversions do.
QUANTIZED = {
    "gpt_oss_mxfp4": ("gpt_oss", "mxfp4"),
    "qwen3_moe_q4": ("qwen3_moe", "affine"),
}


def prompts():
    """Eight prompts of mixed lengths, token ids in [4, VOCAB)."""
    out, x = [], 12345
    for n in LENGTHS:
        p = []
        for _ in range(n):
            x = (x * 1103515245 + 12345) % (1 << 31)
            p.append(4 + x % (VOCAB - 4))
        out.append(p)
    return out


def tokenizer(path: Path):
    """A word-level tokenizer over t0..t511 (the tests feed token ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "t1", "tokenizer_class": "PreTrainedTokenizerFast"}))


def quantize(model, cfg, how):
    """Quantizes `model` in place as QUANTIZED says; records it in `cfg`."""
    import mlx.nn as nn

    if how == "mxfp4":
        nn.quantize(model, group_size=32, bits=4, mode="mxfp4",
                    class_predicate=lambda p, m: "experts" in p and hasattr(m, "to_quantized"))
        cfg["quantization"] = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
        return
    routers = {}

    def predicate(path, m):
        if not hasattr(m, "to_quantized"):
            return False
        if path.endswith("mlp.gate"):
            routers[path] = {"group_size": 64, "bits": 8}
            return routers[path]
        return True

    nn.quantize(model, group_size=32, bits=4, class_predicate=predicate)
    cfg["quantization"] = {"group_size": 32, "bits": 4, **routers}


def build(name: str, out: Path):
    mx.random.seed(7)
    base, how = QUANTIZED.get(name, (name, None))
    cfg = copy.deepcopy(CONFIGS[base])
    Model, Args = _get_classes(cfg)
    model = Model(Args.from_dict(cfg))
    # Wider logits than a fresh init gives, so the best token rarely ties the next.
    params = dict(model.parameters())
    if "lm_head" in params:
        model.lm_head.weight = model.lm_head.weight * 8
    # Parameters a fresh init leaves at zero (sinks, experts' biases) get values, so the
    # reference exercises them.
    from mlx.utils import tree_flatten, tree_unflatten
    zeros = [(k, mx.random.normal(v.shape) * 0.5) for k, v in tree_flatten(model.parameters())
             if v.size and not mx.any(v).item()]
    if zeros:
        model.update(tree_unflatten(zeros))
    if how:
        quantize(model, cfg, how)
    mx.eval(model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(cfg, out / "config.json")
    tokenizer(out)


def reference(out: Path):
    model, _ = load_model(out)
    cases = []
    for p in prompts():
        cache = make_prompt_cache(model)
        logits = model(mx.array(p)[None], cache=cache)[0, -1].astype(mx.float32)
        last = logits.tolist()
        tokens, gaps = [], []
        for _ in range(STEPS):
            top2 = mx.sort(logits)[-2:].tolist()
            gaps.append(round(top2[1] - top2[0], 6))
            t = int(mx.argmax(logits))
            tokens.append(t)
            logits = model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)
        cases.append({"prompt": p, "greedy": tokens, "gaps": gaps, "last_logits": [round(v, 6) for v in last]})
    (out / "reference.json").write_text(json.dumps({
        "made_by": f"mlx_lm {mlx_lm.__version__} (mlx {mx.__version__}, {mx.default_device()}), float32",
        "cases": cases,
    }) + "\n")
    small = min(min(c["gaps"]) for c in cases)
    print(f"{out.name}: {len(cases)} prompts, smallest top-2 gap {small:.5f}", file=sys.stderr)


def main():
    names = sys.argv[1:] or [*CONFIGS, *QUANTIZED]
    for name in names:
        out = OUT / name
        build(name, out)
        reference(out)


if __name__ == "__main__":
    main()
