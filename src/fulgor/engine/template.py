"""The chat template fulgor gives the models it builds: ChatML turns with Hermes-style tools.

Tools are listed in the system turn inside ``<tools></tools>``; the assistant calls them with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and tool results come back in a user
turn as ``<tool_response>...</tool_response>``. This is the layout Qwen2.5 and Hermes models use, so
:mod:`fulgor.engine.tool_calls` parses the output of those models and of fulgor's own alike. Unlike
theirs, the system turn carries no instructions on how to call a tool: models built here learn the
format from their training data, and every prompt token costs training time on a CPU.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "TEXT_MARKERS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
END_OF_TEXT: Final = "<|endoftext|>"
TOOL_CALL_OPEN: Final = "<tool_call>"
TOOL_CALL_CLOSE: Final = "</tool_call>"

# Special tokens are skipped when output is decoded to text; the tool markers are ordinary added
# tokens, so they survive decoding and the tool-call parser can see them.
SPECIAL_TOKENS: Final = (END_OF_TEXT, IM_START, IM_END)
TEXT_MARKERS: Final = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
)

_NL = "{{- '\\n' -}}"

CHAT_TEMPLATE: Final = "".join(
    [
        "{%- macro text(content) -%}",
        "{%- if content is none -%}",
        "{%- elif content is string -%}{{- content -}}",
        "{%- else -%}{%- for part in content -%}",
        "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}",
        "{%- endfor -%}{%- endif -%}",
        "{%- endmacro -%}",
        "{%- if messages and messages[0].role == 'system' -%}",
        "{%- set system = text(messages[0].content) -%}{%- set turns = messages[1:] -%}",
        "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}",
        "{%- if tools -%}",
        "{{- '<|im_start|>system\\n' -}}",
        "{{- system if system else 'You are a helpful assistant.' -}}",
        "{{- '\\n<tools>' -}}",
        "{%- for tool in tools -%}",
        _NL,
        "{{- (tool.function if tool.function is defined else tool) | tojson -}}",
        "{%- endfor -%}",
        "{{- '\\n</tools><|im_end|>\\n' -}}",
        "{%- elif system -%}",
        "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}",
        "{%- endif -%}",
        "{%- for message in turns -%}",
        "{%- if message.role == 'tool' -%}",
        "{%- if loop.first or turns[loop.index0 - 1].role != 'tool' -%}",
        "{{- '<|im_start|>user' -}}",
        "{%- endif -%}",
        "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}",
        "{%- if loop.last or turns[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}",
        "{%- elif message.role == 'assistant' -%}",
        "{%- set content = text(message.content) -%}",
        "{{- '<|im_start|>assistant\\n' + content -}}",
        "{%- if message.tool_calls -%}",
        "{%- for call in message.tool_calls -%}",
        "{%- set fn = call.function if call.function is defined else call -%}",
        "{%- if content or not loop.first -%}",
        _NL,
        "{%- endif -%}",
        '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}',
        "{%- if fn.arguments is string -%}{{- fn.arguments -}}",
        "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}",
        "{{- '}\\n</tool_call>' -}}",
        "{%- endfor -%}",
        "{%- endif -%}",
        "{{- '<|im_end|>\\n' -}}",
        "{%- else -%}",
        "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
    ]
)
