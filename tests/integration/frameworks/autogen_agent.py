"""An AutoGen AgentChat AssistantAgent on OpenAIChatCompletionClient, run whole and streamed."""

import asyncio
import json
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_ext.models.openai import OpenAIChatCompletionClient

# A model AutoGen does not know by name needs its capabilities stated.
INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


async def main() -> None:
    client = OpenAIChatCompletionClient(
        model=os.environ["FULGOR_MODEL"],
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        model_info=INFO,
        max_tokens=16,
    )
    whole = await AssistantAgent("assistant", model_client=client).run(task="What is 2 + 3?")
    streaming = AssistantAgent("assistant", model_client=client, model_client_stream=True)
    streamed = None
    async for item in streaming.run_stream(task="What is 2 + 3?"):
        if isinstance(item, TaskResult):
            streamed = item
    assert streamed is not None
    texts = [str(result.messages[-1].content) for result in (whole, streamed)]
    await client.close()
    print(json.dumps({"texts": texts}))


asyncio.run(main())
