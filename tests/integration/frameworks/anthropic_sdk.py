"""The Anthropic SDK's Messages API, whole and streamed."""

import json
import os

import anthropic

client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
model = os.environ["FULGOR_MODEL"]
messages = [{"role": "user", "content": "What is 2 + 3?"}]
whole = client.messages.create(model=model, max_tokens=16, messages=messages)
with client.messages.stream(model=model, max_tokens=16, messages=messages) as stream:
    streamed = stream.get_final_text()
print(json.dumps({"texts": ["".join(b.text for b in whole.content if b.type == "text"), streamed]}))
