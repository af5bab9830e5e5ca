"""The OpenAI Agents SDK: an Agent on the Responses API, run whole and streamed token by token."""

import asyncio
import json
import os

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # its traces go to OpenAI's servers otherwise


async def main() -> None:
    model = OpenAIResponsesModel(model=os.environ["FULGOR_MODEL"], openai_client=AsyncOpenAI())
    settings = ModelSettings(max_tokens=16)
    agent = Agent(name="assistant", instructions="Answer briefly.", model=model, model_settings=settings)
    whole = await Runner.run(agent, "What is 2 + 3?")
    streamed = Runner.run_streamed(agent, "What is 2 + 3?")
    deltas = []
    async for event in streamed.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
    assert "".join(deltas) == streamed.final_output
    print(json.dumps({"texts": [str(whole.final_output), str(streamed.final_output)]}))


asyncio.run(main())
