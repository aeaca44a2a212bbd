"""A plain NumPy (float64) Llama forward pass over a GGUF file, as an independent reference.

It shares no code with the engine: tensors come from the `gguf` package (which dequantizes the
Q4_1/Q8_0 blocks itself), and every operation is written out here. float64 keeps its own
rounding far below the gaps between competing logits, so near-ties resolve by the math, not by
an implementation's precision (llama.cpp's CPU path quantizes activations to 8 bits, which can
flip near-ties; its tokens are recorded too, for information).
"""

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def variant_extras(arch: str, layers: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    """Deterministic extra parameters that turn the Llama weights into a Qwen2 (q/k/v biases)
    or Qwen3 (per-head q/k RMS-norm weights) variant, in GGUF (interleaved) row order. The
    engine's tests compute the same formulas (daemon/tests/variants.rs)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    ls = np.arange(layers, dtype=np.float64)[:, None]
    if arch == "qwen2":
        return {
            "q_bias": 0.1 * np.sin(0.37 * np.arange(q)[None, :] + 1.1 * ls),
            "k_bias": 0.1 * np.cos(0.23 * np.arange(kv)[None, :] + 0.5 * ls),
            "v_bias": 1.0 * np.sin(0.11 * np.arange(kv)[None, :] + 0.3 * ls),
        }
    if arch == "qwen3":
        d = np.arange(head_dim)[None, :]
        return {"q_norm": 1 + 0.2 * np.sin(0.5 * d + ls), "k_norm": 1 + 0.2 * np.cos(0.3 * d + ls)}
    return {}


class ReferenceLlama:
    def __init__(self, path: str):
        r = GGUFReader(path)
        meta = {f.name: f for f in r.fields.values()}

        def scalar(key):
            f = meta[key]
            return f.parts[f.data[0]][0].item()

        self.layers = int(scalar("llama.block_count"))
        self.heads = int(scalar("llama.attention.head_count"))
        self.kv_heads = int(scalar("llama.attention.head_count_kv"))
        self.hidden = int(scalar("llama.embedding_length"))
        self.head_dim = self.hidden // self.heads
        self.theta = float(scalar("llama.rope.freq_base"))
        self.eps = float(scalar("llama.attention.layer_norm_rms_epsilon"))
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])
        self.extras = {}

    def with_variant(self, arch: str):
        self.extras = variant_extras(arch, self.layers, self.heads, self.kv_heads, self.head_dim)
        return self

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions):
        # GGUF llama Q/K rows are permuted for interleaved pairs (x[2i], x[2i+1]).
        d = self.head_dim
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = positions[:, None] * inv[None, :]  # [t, d/2]
        cos, sin = np.cos(ang), np.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]  # [..., t, d/2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens, cache):
        """Logits of the last of `tokens` (new positions after `cache`'s)."""
        start = cache["len"]
        t = len(tokens)
        pos = np.arange(start, start + t, dtype=np.float64)
        x = self.w["token_embd.weight"][tokens]  # [t, hidden]
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            p = f"blk.{i}."
            h = self.rms_norm(x, self.w[p + "attn_norm.weight"])
            e = {name: value[i] for name, value in self.extras.items()}
            q = h @ self.w[p + "attn_q.weight"].T + e.get("q_bias", 0)
            k = h @ self.w[p + "attn_k.weight"].T + e.get("k_bias", 0)
            v = h @ self.w[p + "attn_v.weight"].T + e.get("v_bias", 0)
            q = q.reshape(t, self.heads, self.head_dim).transpose(1, 0, 2)
            k = k.reshape(t, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            v = v.reshape(t, self.kv_heads, self.head_dim).transpose(1, 0, 2)
            if "q_norm" in e:
                q = self.rms_norm(q, e["q_norm"])
                k = self.rms_norm(k, e["k_norm"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            if i in cache:
                k = np.concatenate([cache[i][0], k], axis=1)
                v = np.concatenate([cache[i][1], v], axis=1)
            cache[i] = (k, v)
            s = k.shape[1]
            k = np.repeat(k, group, axis=0)
            v = np.repeat(v, group, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(self.head_dim)  # [heads, t, s]
            mask = np.arange(s)[None, :] > (start + np.arange(t))[:, None]
            scores = np.where(mask[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            o = (probs @ v).transpose(1, 0, 2).reshape(t, self.hidden)
            x = x + o @ self.w[p + "attn_output.weight"].T
            h = self.rms_norm(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ self.w[p + "ffn_down.weight"].T
        cache["len"] = start + t
        last = self.rms_norm(x[-1], self.w["output_norm.weight"])
        return last @ self.out.T

    def greedy(self, prompt, n):
        cache = {"len": 0}
        logits = self.forward(list(prompt), cache)
        out, gaps = [], []
        for _ in range(n):
            top2 = np.argsort(logits)[::-1][:2]
            out.append(int(top2[0]))
            gaps.append(float(logits[top2[0]] - logits[top2[1]]))
            logits = self.forward([out[-1]], cache)
        return out, gaps
