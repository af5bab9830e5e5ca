"""A LangGraph graph of one node calling ChatOpenAI: run whole, then streamed token by token."""

import json
import os
from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

llm = ChatOpenAI(model=os.environ["FULGOR_MODEL"], base_url=os.environ["OPENAI_BASE_URL"], max_tokens=16)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def answer(state: State) -> State:
    return {"messages": [llm.invoke(state["messages"])]}


builder = StateGraph(State)
builder.add_node("answer", answer)
builder.add_edge(START, "answer")
builder.add_edge("answer", END)
graph = builder.compile()
question = {"messages": [HumanMessage("What is 2 + 3?")]}
whole = graph.invoke(question)["messages"][-1].content
streamed = "".join(str(chunk.content) for chunk, _ in graph.stream(question, stream_mode="messages"))
print(json.dumps({"texts": [str(whole), streamed]}))
