"""What agents send, through the official `openai` SDK against the real stack (tests/agents_openai.rs).

Structured outputs (100 seeded json_schema answers at temperature 0.8 that must parse and validate;
json_object answers that must complete and parse), a forced tool call (created, streamed and reassembled by the
SDK, then answered with a tool result), the agent-turn cache, logit_bias, the Responses API
(create, stream, a function call round trip), and the 400s: tools the default model's template
cannot offer, unknown fields on every API. Exit 0 means every check passed.
"""
import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
from openai import OpenAI

URL = os.environ["MLXCEL_URL"]
BLOCK = int(os.environ["MLXCEL_BLOCK_TOKENS"])
client = OpenAI(base_url=URL + "/v1", api_key="unused", max_retries=0, timeout=600)
model = client.models.list().data[0].id

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "enum": ["cat", "dog", "fish"]},
                    "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                },
                "required": ["kind", "legs"],
                "additionalProperties": False,
            },
        },
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "pets", "address"],
    "additionalProperties": False,
}


def person(i):
    r = client.chat.completions.create(
        model=model, temperature=0.8, seed=i, max_tokens=400,
        messages=[{"role": "user", "content": f"Invent person number {i} with their pets and address, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    return r.choices[0]


with ThreadPoolExecutor(8) as pool:
    answers = list(pool.map(person, range(100)))
for i, choice in enumerate(answers):
    assert choice.finish_reason == "stop", (i, choice.finish_reason, choice.message.content)
    jsonschema.validate(json.loads(choice.message.content), PERSON)
distinct = {c.message.content for c in answers}
assert len(distinct) > 50, f"only {len(distinct)} distinct answers at temperature 0.8"


def any_object(i):
    r = client.chat.completions.create(
        model=model, temperature=0.8, seed=1000 + i, max_tokens=300,
        messages=[{"role": "user", "content": f"Give a JSON object about the number {i}."}],
        response_format={"type": "json_object"},
    )
    return r.choices[0]


# An object's arrays and strings are unbounded; near its token limit the answer lands (closes
# what is open), so every answer completes and parses.
with ThreadPoolExecutor(8) as pool:
    for choice in pool.map(any_object, range(16)):
        assert choice.finish_reason == "stop", (choice.finish_reason, choice.message.content)
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": WEATHER, "strict": True}}]
named = {"type": "function", "function": {"name": "get_weather"}}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]

call = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice=named,
                                      temperature=0, max_tokens=120)
choice = call.choices[0]
assert choice.finish_reason == "tool_calls", choice
calls = choice.message.tool_calls
assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "get_weather", calls
jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)

with client.chat.completions.stream(model=model, messages=ask, tools=tools, tool_choice=named,
                                    temperature=0, max_tokens=120) as stream:
    deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
    final = stream.get_final_completion()
streamed = final.choices[0].message.tool_calls
assert deltas, "no streamed arguments"
assert streamed[0].function.arguments == calls[0].function.arguments, (streamed, calls)
assert streamed[0].function.parsed_arguments == json.loads(calls[0].function.arguments)

# The tool's result goes back; the next turn answers in words and reuses the first turn's blocks.
turn2 = ask + [choice.message, {"role": "tool", "tool_call_id": calls[0].id, "content": "18 degrees and sunny"}]
answer = client.chat.completions.create(model=model, messages=turn2, tools=tools, tool_choice="none",
                                        temperature=0, max_tokens=24)
assert answer.choices[0].message.content, answer
assert not answer.choices[0].message.tool_calls, answer
first = call.usage.prompt_tokens + call.usage.completion_tokens
assert answer.usage.prompt_tokens_details.cached_tokens >= first - BLOCK, (answer.usage, call.usage)

# A template that renders no tools cannot choose to call one: 400, naming `tools`.
try:
    client.chat.completions.create(model=model, messages=ask, tools=tools, max_tokens=8)
    raise AssertionError("tools with tool_choice auto were accepted by a template without tools")
except openai.BadRequestError as e:
    assert e.param == "tools", e

# logit_bias: +100 on one token makes every token that one.
biased = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, temperature=0,
                                   logprobs=1, logit_bias={"1000": 100})
tokens = biased.choices[0].logprobs.tokens
assert len(tokens) == 4 and len(set(tokens)) == 1, tokens

# Responses: text, streamed, and a function call answered with its output.
r = client.responses.create(model=model, input="What is the capital of France?", max_output_tokens=16,
                            temperature=0)
assert r.status in ("completed", "incomplete") and r.output_text, r
assert r.usage.input_tokens > 0 and r.usage.input_tokens_details.cached_tokens >= 0, r.usage
with client.responses.stream(model=model, input="What is the capital of France?", max_output_tokens=200,
                             temperature=0, instructions="Answer in one short sentence.") as s:
    kinds = [e.type for e in s]
    final = s.get_final_response()
assert kinds[0] == "response.created" and "response.output_text.delta" in kinds, kinds
assert final.output_text, final
flat = [{"type": "function", "name": "get_weather", "description": "The weather in a city now.",
         "parameters": WEATHER, "strict": True}]
fc = client.responses.create(model=model, input="Weather in Rome?", tools=flat, temperature=0,
                             tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120)
calls = [o for o in fc.output if o.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "get_weather", fc.output
jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
done = client.responses.create(model=model, tools=flat, tool_choice="none", temperature=0, max_output_tokens=24,
                               input=[{"role": "user", "content": "Weather in Rome?"}, *fc.output,
                                      {"type": "function_call_output", "call_id": calls[0].call_id,
                                       "output": "25 degrees"}])
assert done.output_text, done
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_1")
    raise AssertionError("previous_response_id was accepted")
except openai.BadRequestError as e:
    assert e.param == "previous_response_id", e

# Unknown fields: 400 naming them, on every OpenAI route.
for call in (
    lambda: client.chat.completions.create(model=model, messages=ask, max_tokens=2, extra_body={"frobnicate": 1}),
    lambda: client.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"frobnicate": 1}),
    lambda: client.responses.create(model=model, input="x", max_output_tokens=2, extra_body={"frobnicate": 1}),
):
    try:
        call()
        raise AssertionError("an unknown field was accepted")
    except openai.BadRequestError as e:
        assert e.param == "frobnicate" and "frobnicate" in e.message, e

print("agent checks passed")
