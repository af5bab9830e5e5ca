"""The openai SDK's chat completions API, whole and streamed."""

import json
import os

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
model = os.environ["FULGOR_MODEL"]
messages = [{"role": "user", "content": "What is 2 + 3?"}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16)
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, stream=True)
streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
print(json.dumps({"texts": [whole.choices[0].message.content or "", streamed]}))
