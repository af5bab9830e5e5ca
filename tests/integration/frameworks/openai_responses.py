"""The openai SDK's Responses API, whole and streamed."""

import json
import os

from openai import OpenAI

client = OpenAI()
model = os.environ["FULGOR_MODEL"]
whole = client.responses.create(model=model, input="What is 2 + 3?", max_output_tokens=16)
deltas = []
with client.responses.stream(model=model, input="What is 2 + 3?", max_output_tokens=16) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
print(json.dumps({"texts": [whole.output_text, "".join(deltas)]}))
