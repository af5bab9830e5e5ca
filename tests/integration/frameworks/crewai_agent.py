"""A CrewAI crew of one agent and one task, its LLM whole and then streamed."""

import json
import os

from crewai import LLM, Agent, Crew, Task

texts = []
for stream in (False, True):
    llm = LLM(
        model=f"openai/{os.environ['FULGOR_MODEL']}",
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        max_tokens=16,
        stream=stream,
    )
    agent = Agent(
        role="Calculator",
        goal="Add numbers",
        backstory="You add numbers.",
        llm=llm,
        max_iter=1,
        verbose=False,
    )
    task = Task(description="What is 2 + 3?", expected_output="A number", agent=agent)
    result = Crew(agents=[agent], tasks=[task], verbose=False).kickoff()
    texts.append(result.raw)
print(json.dumps({"texts": texts}))
