"""Drives mlxcel's front end with the official `openai` Python SDK.

Run by tests/openai_sdk.rs against the real stack: MLXCEL_URL is the front end's base URL.
Every check raises AssertionError with what it saw; exit 0 means all passed.
"""
import os

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["MLXCEL_URL"] + "/v1", api_key="unused", max_retries=0)

models = client.models.list()
ids = [m.id for m in models.data]
assert len(ids) == 1, ids
model = ids[0]

messages = [{"role": "user", "content": "What is the capital of France?"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
text = chat.choices[0].message.content
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant", chat
assert "Paris" in text, text
assert chat.choices[0].finish_reason in ("stop", "length"), chat
assert chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0, chat.usage
assert chat.usage.prompt_tokens_details.cached_tokens >= 0, chat.usage

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage, roles = [], None, None, []
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
assert "".join(pieces) == text, (pieces, text)
assert roles == ["assistant"], roles
assert finish == chat.choices[0].finish_reason, finish
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                       temperature=0)
assert completion.object == "text_completion", completion
assert completion.choices[0].text, completion
assert completion.usage.completion_tokens == 8, completion.usage
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(model=model, prompt="The capital of France is",
                                       max_tokens=8, temperature=0, stream=True)
    if c.choices
)
assert streamed == completion.choices[0].text, (streamed, completion.choices[0].text)

# Errors map to the SDK's exception classes by status.
try:
    client.chat.completions.create(model=model, messages=messages, temperature=5)
    raise AssertionError("temperature=5 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "temperature" in str(e), e
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404, e
keyless = OpenAI(base_url=os.environ["MLXCEL_KEYED_URL"] + "/v1", api_key="wrong", max_retries=0)
try:
    keyless.models.list()
    raise AssertionError("a wrong API key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e
keyed = OpenAI(base_url=os.environ["MLXCEL_KEYED_URL"] + "/v1", api_key="sesame", max_retries=0)
assert [m.id for m in keyed.models.list().data] == ids

print("openai", openai.__version__, "SDK checks passed")
