"""The official `anthropic` SDK against the real stack (tests/agents_anthropic.rs): messages.create and
messages.stream, a forced tool call whose input validates and its tool_result round trip (streamed
too), count_tokens against usage, `cache_control` breakpoints (read on the next request, and a
pinned prefix that survives a churn evicting every unpinned block), `x-api-key`, errors in
Anthropic's shape, and an unknown field's 400. Exit 0 means every check passed.
"""
import json
import os

import urllib.error
import urllib.request

import anthropic
import jsonschema

URL = os.environ["MLXCEL_URL"]
KEYED = os.environ["MLXCEL_KEYED_URL"]
client = anthropic.Anthropic(base_url=URL, api_key="unused", max_retries=0, timeout=600)
MODEL = "claude-sonnet-4-5"
GREEDY = {"temperature": 0}
ask = [{"role": "user", "content": "What is the capital of France?"}]

msg = client.messages.create(model=MODEL, max_tokens=24, messages=ask, extra_body=GREEDY)
assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL, msg
text = "".join(b.text for b in msg.content if b.type == "text")
assert "Paris" in text, msg
assert msg.stop_reason in ("end_turn", "max_tokens"), msg
u = msg.usage
total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
counted = client.messages.count_tokens(model=MODEL, messages=ask).input_tokens
assert counted == total > 0, (counted, u)

with client.messages.stream(model=MODEL, max_tokens=24, messages=ask, extra_body=GREEDY) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
assert streamed == text, (streamed, text)
assert final.usage.output_tokens == msg.usage.output_tokens, final.usage

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
tools = [{"name": "get_weather", "description": "The weather in a city now.", "input_schema": WEATHER}]
forced = {"type": "tool", "name": "get_weather"}
weather = [{"role": "user", "content": "What is the weather in Oslo?"}]
call = client.messages.create(model=MODEL, max_tokens=120, messages=weather, tools=tools, tool_choice=forced,
                              extra_body=GREEDY)
uses = [b for b in call.content if b.type == "tool_use"]
assert call.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", call
assert uses[0].id.startswith("toolu_"), uses
jsonschema.validate(uses[0].input, WEATHER)
with client.messages.stream(model=MODEL, max_tokens=120, messages=weather, tools=tools, tool_choice=forced,
                            extra_body=GREEDY) as s:
    events = [e.type for e in s]
    again = s.get_final_message()
assert "input_json" in events or "content_block_delta" in events, events
assert [b.input for b in again.content if b.type == "tool_use"] == [uses[0].input], again
round_trip = weather + [
    {"role": "assistant", "content": call.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "4 degrees, snow"}]},
]
answer = client.messages.create(model=MODEL, max_tokens=24, messages=round_trip, tools=tools,
                                tool_choice={"type": "none"}, extra_body=GREEDY)
assert answer.content[0].type == "text" and answer.content[0].text, answer
first = call.usage.input_tokens + call.usage.cache_read_input_tokens + call.usage.output_tokens
assert answer.usage.cache_read_input_tokens >= first - int(os.environ["MLXCEL_BLOCK_TOKENS"]), (answer.usage, call.usage)

# cache_control: the long system prompt is written (pinned) by the first request, read by the next.
LONG = " ".join(f"Rule {i}: answer politely and cite rule {i} when it applies." for i in range(40))
system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
one = client.messages.create(model=MODEL, max_tokens=4, system=system, extra_body=GREEDY,
                             messages=[{"role": "user", "content": "Which rule is first?"}])
written = one.usage.cache_creation_input_tokens + one.usage.cache_read_input_tokens
assert written > 300, one.usage
two = client.messages.create(model=MODEL, max_tokens=4, system=system, extra_body=GREEDY,
                             messages=[{"role": "user", "content": "Which rule is last?"}])
assert two.usage.cache_read_input_tokens >= written, (one.usage, two.usage)

# Churn: distinct long prompts, more than the cache holds; the pinned system prompt survives them
# while the first churn prompt's blocks are gone.
churn = [f"Story {k}: " + " ".join(f"line {k}.{i} of a long story" for i in range(120)) for k in range(4)]
for c in churn:
    client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": c}], extra_body=GREEDY)
evicted = client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": churn[0]}],
                                 extra_body=GREEDY)
# At most the template's shared head (its default system prompt) is still cached.
assert evicted.usage.cache_read_input_tokens < 2 * int(os.environ["MLXCEL_BLOCK_TOKENS"]), evicted.usage
three = client.messages.create(model=MODEL, max_tokens=4, system=system, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Which rule is second?"}])
assert three.usage.cache_read_input_tokens >= written, three.usage

# Errors in Anthropic's shape; an unknown field named.
try:
    client.messages.create(model=MODEL, max_tokens=4, messages=ask, extra_body={"frobnicate": 1})
    raise AssertionError("an unknown field was accepted")
except anthropic.BadRequestError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
    assert "frobnicate" in e.body["error"]["message"], e.body
try:
    client.messages.create(model="not-a-model", max_tokens=4, messages=ask)
    raise AssertionError("an unknown model was accepted")
except anthropic.NotFoundError as e:
    assert e.body["error"]["type"] == "not_found_error", e.body

# x-api-key is accepted like the bearer key (SDKs before 2.0 and Claude Code send it).
def post(url, body, key):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-api-key": key})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


body = {"model": MODEL, "max_tokens": 2, "messages": ask}
assert post(KEYED + "/v1/messages", body, "sesame")[0] == 200
status, refused = post(KEYED + "/v1/messages", body, "wrong")
assert status == 401 and refused["error"]["type"] == "authentication_error", refused
keyed = anthropic.Anthropic(base_url=KEYED, api_key="sesame", max_retries=0, timeout=600)
assert keyed.messages.create(model=MODEL, max_tokens=2, messages=ask).content

print("anthropic checks passed")
