"""An agent's loop, turn by turn: a 10-turn tool conversation over Anthropic's Messages API on a
~3k-token system prompt, each turn the model's forced tool call answered by a ~200-token tool
result. For mlxcel, per turn: the prompt, the tokens it prefilled (usage: input tokens not read
from the cache), its new tokens (prompt - last prompt - last answer) and TTFT; then the same
conversation replayed to mlx_lm.server over its chat API (its chat template renders the same
turns), TTFT beside it. Goal: from turn 2 on, each turn prefills at most its new tokens + 64.

Usage: python bench/agent_loop.py [--turns 10] [--out DIR]
Writes DIR/agent_loop.json and DIR/agent_loop.md.
"""
import argparse
import http.client
import json
import os
import time

from common import MlxLm, Mlxcel, machine, stream_chat
from footprint import CAPACITY, document

TOOLS = [{"name": "lookup_ledger", "description": "Reads one ledger of the lighthouse archive.",
          "input_schema": {"type": "object", "properties": {"ledger": {"type": "integer", "minimum": 1,
                                                                       "maximum": 999}},
                           "required": ["ledger"], "additionalProperties": False}}]


def system_prompt():
    """~3k tokens of varied rules (SmolLM2's tokenizer)."""
    rules = [f"Rule {i}: in gallery {i % 17} the keeper of lens number {i * 7 % 101} logs the "
             f"{['tide', 'wind', 'fog', 'lamp', 'oil'][i % 5]} every {i % 9 + 1} hours." for i in range(110)]
    return "You are the archivist of a lighthouse museum. Use the tool to read ledgers.\n" + "\n".join(rules)


def messages_turn(port, body):
    """One streamed Messages request: (ttft_s, final message as built from the events)."""
    body = dict(body, stream=True)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    start = time.monotonic()
    conn.request("POST", "/v1/messages", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, blocks, usage, stop = None, [], {}, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        e = json.loads(line[6:])
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"], partial=""))
        elif e["type"] == "content_block_delta":
            if ttft is None:
                ttft = time.monotonic() - start
            d = e["delta"]
            blocks[-1]["partial"] += d.get("partial_json") or d.get("text") or ""
        elif e["type"] == "message_delta":
            usage, stop = e["usage"], e["delta"]["stop_reason"]
    conn.close()
    content = []
    for b in blocks:
        if b["type"] == "tool_use":
            content.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": json.loads(b["partial"])})
        elif b["type"] == "text":
            content.append({"type": "text", "text": b["partial"]})
    return ttft, {"content": content, "usage": usage, "stop_reason": stop}


def run_mlxcel(turns):
    server = Mlxcel("mlxcel", {})
    rows, convo = [], [{"role": "user", "content": "Read the ledgers one by one, starting with ledger 1."}]
    system = [{"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}}]
    last = None
    try:
        for t in range(turns):
            body = {"model": "claude-local", "max_tokens": 64, "temperature": 0, "system": system,
                    "messages": convo, "tools": TOOLS, "tool_choice": {"type": "any"}}
            ttft, msg = messages_turn(server.port, body)
            u = msg["usage"]
            prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
            new = prompt - (last["prompt"] + last["output"]) if last else prompt
            prefilled = u["input_tokens"] + u["cache_creation_input_tokens"]
            rows.append({"turn": t + 1, "prompt_tokens": prompt, "cached": u["cache_read_input_tokens"],
                         "prefilled": prefilled, "new_tokens": new, "output_tokens": u["output_tokens"],
                         "within_goal": t == 0 or prefilled <= new + 64, "ttft_s": round(ttft, 3)})
            print(f"[agent] mlxcel turn {t + 1}: prompt {prompt}, prefilled {prefilled}, new {new}, "
                  f"TTFT {ttft:.3f} s", flush=True)
            last = {"prompt": prompt, "output": u["output_tokens"]}
            use = next(b for b in msg["content"] if b["type"] == "tool_use")
            convo = convo + [{"role": "assistant", "content": msg["content"]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                           "content": document(t + 1, 9)}]}]
    finally:
        server.stop()
    return rows, convo


def as_chat(convo):
    """The conversation as chat messages whose template renders what mlxcel's does for a
    template without tools: calls in the assistant's text, results as user turns."""
    out = [{"role": "system", "content": system_prompt()}]
    for m in convo:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for b in m["content"]:
            if b["type"] == "text":
                parts.append(b["text"])
            elif b["type"] == "tool_use":
                args = json.dumps(b["input"])
                parts.append(f'<tool_call>\n{{"name": "{b["name"]}", "arguments": {args}}}\n</tool_call>')
            elif b["type"] == "tool_result":
                parts.append(f"<tool_response>\n{b['content']}\n</tool_response>")
        out.append({"role": m["role"], "content": "\n".join(parts)})
    return out


def run_mlx_lm(convo, rows):
    server = MlxLm("mlx_lm", CAPACITY)
    out = []
    try:
        chat = as_chat(convo)
        # Turn k's prompt: the system, the task, and k-1 call/result pairs.
        for row in rows:
            k = row["turn"]
            messages = chat[: 2 + 2 * (k - 1)]
            ttft, _, _, usage = stream_chat(server.port, {"messages": messages, "max_tokens": row["output_tokens"],
                                                          "temperature": 0})
            out.append({"turn": k, "ttft_s": round(ttft or 0, 3), "usage": usage})
            print(f"[agent] mlx_lm turn {k}: TTFT {ttft:.3f} s", flush=True)
    finally:
        server.stop()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--out", default=os.path.join("bench", "results", time.strftime("%Y%m%d-%H%M%S")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    rows, convo = run_mlxcel(args.turns)
    peer = run_mlx_lm(convo, rows)
    with open(os.path.join(args.out, "agent_loop.json"), "w") as f:
        json.dump({"machine": info, "mlxcel": rows, "mlx_lm": peer}, f)
    lines = ["# Agent loop", "", f"Machine: {info['system']}, {info['cpus']} CPUs; mlxcel {info['mlxcel']}. "
             f"{args.turns} turns over the Messages API (mlxcel) and the same conversation over mlx_lm.server's "
             "chat API; each turn a forced tool call answered by a ~200-token result, on a ~3k-token system prompt.",
             "", "| turn | prompt | prefilled | new | ≤ new + 64 | mlxcel TTFT s | mlx_lm TTFT s | mlx_lm / mlxcel |",
             "|---|---|---|---|---|---|---|---|"]
    for r, p in zip(rows, peer):
        ratio = f"{p['ttft_s'] / r['ttft_s']:.2f}x" if r["ttft_s"] else "-"
        lines.append(f"| {r['turn']} | {r['prompt_tokens']} | {r['prefilled']} | {r['new_tokens']} | "
                     f"{'yes' if r['within_goal'] else 'NO'} | {r['ttft_s']} | {p['ttft_s']} | {ratio} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "agent_loop.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
