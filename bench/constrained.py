"""What constrained decoding costs: mlxcel's aggregate decode tok/s at 1 and 8 concurrent streaming
clients with a nested JSON schema (response_format json_schema) against the same requests without
one, in one run, and the time the grammar's masks took per decode step. mlx_lm.server has no
structured outputs (ml-explore/mlx-lm#1007), so this is mlxcel against itself.

The schema's arrays have no item limit, so a constrained answer, like a free one, runs to
max_tokens: both levels generate the same number of tokens. Seeded sampling at temperature 0.8.

Usage: python bench/constrained.py [--clients 1,8] [--out DIR]
Writes DIR/constrained.json and DIR/constrained.md.
"""
import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from common import Mlxcel, machine, request, stream_chat, wait_for

MAX_TOKENS = 96
ROUNDS = 3
SCHEMA = {
    "type": "object",
    "properties": {
        "shop": {"type": "string", "maxLength": 24},
        "orders": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "item": {"type": "string", "maxLength": 16},
                "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["new", "gift", "rush"]}},
            },
            "required": ["item", "qty", "tags"], "additionalProperties": False}},
    },
    "required": ["shop", "orders"], "additionalProperties": False,
}
METRICS = {
    "masks": "mlxcel_grammar_masks_total",
    "mask_s": 'mlxcel_grammar_mask_seconds_total{phase="mask"}',
    "decode_steps": "mlxcel_decode_steps_total",
    "decode_rows": "mlxcel_decode_rows_total",
    "model_s": 'mlxcel_engine_seconds_total{phase="model"}',
    "sampling_s": 'mlxcel_engine_seconds_total{phase="sampling"}',
}


def counters(port):
    def idle():
        status, h = request(port, "GET", "/health", timeout=30)
        d = ((h or {}).get("processes") or {}).get("daemon") or {}
        return status == 200 and d.get("running") == 0 and d.get("waiting") == 0
    wait_for("the engine went idle", idle, 300)
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = dict(line.rpartition(" ")[::2] for line in text.splitlines() if not line.startswith("#"))
    return {k: float(values.get(m, 0)) for k, m in METRICS.items()}


def level(port, clients, constrained):
    def one(c):
        out = []
        for r in range(ROUNDS):
            body = {"messages": [{"role": "user", "content": f"Shop {c}.{r}: list today's orders as JSON."}],
                    "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": c * 100 + r}
            if constrained:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "orders", "schema": SCHEMA, "strict": True}}
            else:
                body["ignore_eos"] = True
            out.append(stream_chat(port, body))
        return out
    before = counters(port)
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        runs = [x for per in pool.map(one, range(clients)) for x in per]
    wall = time.monotonic() - start
    d = {k: v - before[k] for k, v in counters(port).items()}
    steps = max(d["decode_steps"], 1)
    tokens = sum(r[2] for r in runs)
    return {"clients": clients, "constrained": constrained, "requests": len(runs), "completion_tokens": tokens,
            "wall_seconds": round(wall, 2), "aggregate_tok_s": round(tokens / wall, 2),
            "masks": int(d["masks"]), "mask_ms_per_step": round(d["mask_s"] * 1e3 / steps, 3),
            "mask_us_per_mask": round(d["mask_s"] * 1e6 / max(d["masks"], 1), 1),
            "mean_batch": round(d["decode_rows"] / steps, 2),
            "model_ms_per_step": round(d["model_s"] * 1e3 / steps, 2),
            "sampling_ms_per_step": round(d["sampling_s"] * 1e3 / steps, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--out", default=os.path.join("bench", "results", time.strftime("%Y%m%d-%H%M%S")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    server = Mlxcel("mlxcel", {})
    rows = []
    try:
        stream_chat(server.port, {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4})
        for clients in [int(c) for c in args.clients.split(",")]:
            for constrained in (False, True):
                r = level(server.port, clients, constrained)
                print(f"[constrained] x{clients} {'schema' if constrained else 'free'}: {r['aggregate_tok_s']} tok/s, "
                      f"mask {r['mask_ms_per_step']} ms/step", flush=True)
                rows.append(r)
    finally:
        server.stop()
    with open(os.path.join(args.out, "constrained.json"), "w") as f:
        json.dump({"machine": info, "rows": rows}, f)
    lines = ["# Constrained decoding", "", f"Machine: {info['system']}, {info['cpus']} CPUs; mlxcel {info['mlxcel']}. "
             f"Streaming chat, {MAX_TOKENS} tokens per request at temperature 0.8 (seeded), {ROUNDS} requests per client; "
             "with a nested JSON schema against free text (ignore_eos, so both run to max_tokens).", "",
             "| clients | free tok/s | schema tok/s | schema / free | masks | mask µs each | mask ms per step | mean batch |",
             "|---|---|---|---|---|---|---|---|"]
    for clients in sorted({r["clients"] for r in rows}):
        free = next(r for r in rows if r["clients"] == clients and not r["constrained"])
        cons = next(r for r in rows if r["clients"] == clients and r["constrained"])
        lines.append(f"| {clients} | {free['aggregate_tok_s']} | {cons['aggregate_tok_s']} | "
                     f"{cons['aggregate_tok_s'] / free['aggregate_tok_s']:.3f} | {cons['masks']} | {cons['mask_us_per_mask']} | "
                     f"{cons['mask_ms_per_step']} | {cons['mean_batch']} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "constrained.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
