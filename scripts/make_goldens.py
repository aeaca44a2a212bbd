#!/usr/bin/env python3
"""Golden fixtures for the engine, made by independent implementations of the same GGUF file.

Writes daemon/tests/fixtures/smollm2_golden.json with:
  - token ids of tricky strings, by llama.cpp's tokenizer (llama-cpp-python), specials parsed;
  - for each chat conversation: the prompt rendered with the model's own chat template (jinja2,
    as llama-cpp-python renders it), its token ids (llama.cpp), the first 32 greedy tokens of
    scripts/reference_llama.py (NumPy float64, with the logit gap to the runner-up at each step),
    and llama.cpp's own greedy tokens for information.

Run: .venv/bin/pip install llama-cpp-python==0.3.36 jinja2 gguf numpy
     .venv/bin/python scripts/make_goldens.py
(building llama-cpp-python from source takes ~5 min on 2 cores; tests only read the JSON).

With --templates it writes only frontend/tests/fixtures/tool_templates.json: conversations with
tools, tool calls, tool results and reasoning, rendered by Hugging Face's
`apply_chat_template` (transformers, installed by `scripts/setup.sh --bench`) with the Qwen-style
template frontend/tests/fixtures/qwen_style_template.jinja, as a client's OpenAI request would
reach it (a call's arguments parsed from their JSON text, as vLLM and mlxcel pass them).
"""

import json
import platform
import sys
from pathlib import Path

import jinja2
import jinja2.sandbox

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "daemon" / "tests" / "fixtures" / "smollm2_golden.json"

TRICKY = [
    "Hello, world!",
    "  leading and   inner   spaces\t\ttabs\n\nnewlines  ",
    "naïve café déjà vu — “quotes” ‘single’ …",
    "日本語のテキストと中文字符，还有한국어.",
    "emoji: 😀👍🏽🇫🇷 and 👨‍👩‍👧‍👦 family",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12345678))",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "numbers 3.14159 1,000,000 2024-11-30 0x1F",
    "URL https://example.com/a?b=c&d=e#frag",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "user", "content": "Write a haiku about the sea."},
        {"role": "assistant", "content": "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."},
        {"role": "user", "content": "Now one about mountains."},
    ],
]


def render(template: str, messages) -> str:
    # The same environment llama-cpp-python's Jinja2ChatFormatter (and HF) use.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="<|im_start|>", eos_token="<|im_end|>")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "local_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}

# Each case is what an OpenAI client sends (arguments as JSON text); mlxcel's test converts it
# itself and must render the same text.
TOOL_CASES = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "local_time", "arguments": "{\"zone\":\"Asia/Tokyo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, clear"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21:04"},
    ], "tools": [WEATHER, CLOCK]},
    {"messages": [
        {"role": "user", "content": "Is it warm?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "30°C"},
        {"role": "assistant", "content": "<think>\nWarm.\n</think>\n\nYes, 30°C."},
        {"role": "user", "content": "Thanks"},
    ], "tools": [WEATHER], "enable_thinking": False},
    {"messages": [{"role": "system", "content": "Plain chat."}, {"role": "user", "content": "Hi"}]},
]


def tool_templates() -> None:
    import copy

    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    root = Path(__file__).resolve().parent.parent
    source = (root / "frontend/tests/fixtures/qwen_style_template.jinja").read_text()
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")))
    tok.chat_template = source
    cases = []
    for case in TOOL_CASES:
        messages = copy.deepcopy(case["messages"])
        for m in messages:
            if m.get("content") is None:
                m["content"] = ""
            for call in m.get("tool_calls", []):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        kwargs = {"enable_thinking": case["enable_thinking"]} if "enable_thinking" in case else {}
        text = tok.apply_chat_template(messages, tools=case.get("tools"), tokenize=False,
                                       add_generation_prompt=True, **kwargs)
        cases.append({**case, "rendered": text})
    import transformers
    out = root / "frontend/tests/fixtures/tool_templates.json"
    out.write_text(json.dumps({
        "made_by": f"transformers {transformers.__version__} apply_chat_template, jinja2 {jinja2.__version__}",
        "template": "qwen_style_template.jinja",
        "cases": cases,
    }, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)


def main() -> None:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_llama import ReferenceLlama

    llm = Llama(model_path=str(MODEL), n_ctx=2048, n_threads=2, verbose=False, seed=0)
    template = llm.metadata["tokenizer.chat_template"]
    tokens = [
        {"text": s, "ids": llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)} for s in TRICKY
    ]
    reference = ReferenceLlama(str(MODEL))
    chats = []
    for messages in CONVERSATIONS:
        prompt = render(template, messages)
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        greedy = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            greedy.append(int(tok))
            if len(greedy) == 32:
                break
        ref_ids, gaps = reference.greedy(ids, 32)
        chats.append({"messages": messages, "prompt": prompt, "prompt_ids": ids, "greedy_ids": ref_ids,
                      "greedy_logit_gaps": [round(g, 4) for g in gaps], "llamacpp_greedy_ids": greedy})
    # Qwen2 / Qwen3 variants of the same weights (extra parameters from variant_extras), on the
    # first chat; the engine's tests build the same variants as HF directories.
    variants = []
    for arch in ("qwen2", "qwen3"):
        ref = ReferenceLlama(str(MODEL)).with_variant(arch)
        out, gaps = ref.greedy(chats[0]["prompt_ids"], 16)
        variants.append({"arch": arch, "chat": 0, "greedy_ids": out, "greedy_logit_gaps": [round(g, 4) for g in gaps]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "made_by": f"tokens and prompts: llama-cpp-python {llama_cpp.__version__} (llama.cpp, CPU), jinja2 "
                   f"{jinja2.__version__}; greedy_ids: scripts/reference_llama.py (NumPy {np.__version__}, float64); "
                   f"python {platform.python_version()}",
        "model": MODEL.name,
        "tokenization": tokens,
        "chats": chats,
        "variants": variants,
    }, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    if "--templates" in sys.argv:
        tool_templates()
    else:
        main()
