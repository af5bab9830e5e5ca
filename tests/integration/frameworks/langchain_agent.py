"""LangChain's ChatOpenAI, invoked and streamed."""

import json
import os

from langchain_openai import ChatOpenAI

llm = ChatOpenAI(model=os.environ["FULGOR_MODEL"], base_url=os.environ["OPENAI_BASE_URL"], max_tokens=16)
whole = llm.invoke("What is 2 + 3?")
streamed = "".join(str(chunk.content) for chunk in llm.stream("What is 2 + 3?"))
print(json.dumps({"texts": [str(whole.content), streamed]}))
