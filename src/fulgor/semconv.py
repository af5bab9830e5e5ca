"""Span names and attribute keys: the one place that names what fulgor records.

The gateway, the agent helpers, the runners and the adapters read and write spans through
these constants, so a name changes in one place only.
"""

from __future__ import annotations

from typing import Final

# Span names.
SPAN_MODEL_CALL: Final = "fulgor.model_call"
SPAN_REWARD: Final = "fulgor.reward"
SPAN_MESSAGE: Final = "fulgor.message"
SPAN_OBJECT: Final = "fulgor.object"
SPAN_EXCEPTION: Final = "fulgor.exception"
SPAN_OPERATION: Final = "fulgor.operation"

FULGOR_SPAN_NAMES: Final = frozenset(
    {SPAN_MODEL_CALL, SPAN_REWARD, SPAN_MESSAGE, SPAN_OBJECT, SPAN_EXCEPTION, SPAN_OPERATION}
)

# Attempt metadata: how many of the attempt's spans the store never got (each was logged).
ATTEMPT_SPANS_LOST: Final = "spans_lost"

# Resource attributes (OpenTelemetry resource) that attribute a span to a rollout and attempt.
RESOURCE_ROLLOUT_ID: Final = "fulgor.rollout_id"
RESOURCE_ATTEMPT_ID: Final = "fulgor.attempt_id"

# fulgor.model_call: the whole ModelCall record travels under this key (see types.ModelCall), and
# it is the one home of what the call was: its agent's name, token_ids_missing, model_version.
ATTR_MODEL_CALL: Final = "fulgor.model_call"

# The agent that emitted a span (rewards, messages, objects, exceptions, operations).
ATTR_AGENT_NAME: Final = "fulgor.agent.name"

# OpenTelemetry's GenAI semantic conventions name an agent on its invoke_agent span with this.
ATTR_GENAI_AGENT_NAME: Final = "gen_ai.agent.name"

# The span attributes that name an agent, in the order they are read on one span: fulgor's own,
# the LangGraph node OpenTelemetry's LangChain instrumentation records on every span inside a
# node, and the GenAI semantic conventions' agent name (see fulgor.adapters.agents).
AGENT_NAME_ATTRIBUTES: Final = (
    ATTR_AGENT_NAME,
    "traceloop.association.properties.langgraph_node",
    ATTR_GENAI_AGENT_NAME,
)

# fulgor.reward
ATTR_REWARD_VALUE: Final = "fulgor.reward.value"
ATTR_REWARD_PRIMARY: Final = "fulgor.reward.primary"
ATTR_REWARD_VALUES: Final = "fulgor.reward.values"
# The task's own words on the rollout (what was wrong, what was expected); prompt optimisation
# shows it to its critic.
ATTR_REWARD_FEEDBACK: Final = "fulgor.reward.feedback"

# fulgor.message / fulgor.object
ATTR_MESSAGE_BODY: Final = "fulgor.message.body"
ATTR_OBJECT_JSON: Final = "fulgor.object.json"

# fulgor.exception (follows OpenTelemetry's exception.* keys)
ATTR_EXCEPTION_TYPE: Final = "exception.type"
ATTR_EXCEPTION_MESSAGE: Final = "exception.message"
ATTR_EXCEPTION_STACKTRACE: Final = "exception.stacktrace"

# fulgor.operation
ATTR_OPERATION_NAME: Final = "fulgor.operation.name"
ATTR_OPERATION_INPUT: Final = "fulgor.operation.input"
ATTR_OPERATION_OUTPUT: Final = "fulgor.operation.output"
