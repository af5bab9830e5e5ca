"""A model's chat format: its template, what the template can render, and how to parse its output.

Every chat request is rendered by the served model's chat template (its own, or one given with
``--chat-template``) and its output parsed by the tool-call parser and reasoning parser of that
model's family (:mod:`fulgor.engine.tool_calls`, :mod:`fulgor.engine.reasoning`): named, or detected
from the template. :class:`ChatFormat` holds all of it for one served model, and learns once, by
rendering probes, what the template can render:

- tool definitions: a request that offers tools to a template that leaves them out is refused
  (the model would never see them) with a message that says which template to pass instead;
- assistant turns with tool calls: for a template without them, the calls are written into the
  turn's content in the family's own format, as the model wrote them;
- tool results: for a template with no ``tool`` role, they become a user turn of
  ``<tool_response>`` blocks.

Agent history is normalised that way once, before rendering, and a missing ``content`` becomes
``""``: the openai SDK sends an assistant turn with tool calls and no content, which many templates
cannot concatenate. vLLM gets the same template and parser names (:mod:`fulgor.engine.vllm`) and
renders what it is sent, so the gateway sends it history normalised the same way, as an OpenAI
request still (``normalise(..., wire=True)``), when the template cannot render tool calls or
results (:attr:`ChatFormat.rewrites_history`).

This module knows neither HTTP nor the OpenAI request models.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fulgor.engine.errors import InvalidRequestError
from fulgor.engine.reasoning import reasoning_parser
from fulgor.engine.template import CHAT_TEMPLATE, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from fulgor.engine.tool_calls import ParsedOutput, tool_arguments_for_template, tool_parser
from fulgor.errors import ConfigError

__all__ = [
    "SHIPPED_TEMPLATES",
    "ChatFormat",
    "check_chat_options",
    "choose_parsers",
    "detect_reasoning_parser",
    "detect_tool_parser",
    "model_chat_template",
    "read_chat_template",
    "write_tool_calls",
]

_TEMPLATES: Final = Path(__file__).with_name("templates")
SHIPPED_TEMPLATES: Final[dict[str, str]] = {
    "chatml-tools": CHAT_TEMPLATE,
    "llama3-json-tools": (_TEMPLATES / "llama3-json-tools.jinja").read_text(encoding="utf-8"),
    "gemma3-pythonic-tools": (_TEMPLATES / "gemma3-pythonic-tools.jinja").read_text(encoding="utf-8"),
}
"""Tool-aware templates fulgor ships, by the name ``--chat-template`` takes, for models whose own
template leaves tools out: ``chatml-tools`` is ChatML (``<|im_start|>``: Qwen, SmolLM2, fulgor's own
models) with Hermes-style tools; ``llama3-json-tools`` is Llama 3.1's turns with its JSON calls
(``llama3_json``); ``gemma3-pythonic-tools`` is Gemma 3's turns with pythonic calls."""

_PROBE_TOOL: Final = "fulgor_probe_tool"
_PROBE_CALL: Final = "fulgor_probe_call"
_TOOL_ROLE = re.compile(r"""['"]tool['"]""")
_OWN_FORMATS: weakref.WeakKeyDictionary[Any, ChatFormat] = weakref.WeakKeyDictionary()


def read_chat_template(value: str) -> str:
    """The template ``--chat-template`` names: a Jinja file, or one fulgor ships by name.

    A file that does not exist or does not parse as Jinja is a ConfigError that says so.
    """
    if value in SHIPPED_TEMPLATES:
        return SHIPPED_TEMPLATES[value]
    path = Path(value)
    if not path.is_file():
        raise ConfigError(
            f"--chat-template {value}: no such file, and not a template fulgor ships "
            f"({', '.join(SHIPPED_TEMPLATES)}); pass a Jinja chat template file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --chat-template {value}: {exc}") from exc
    _check_parses(text, value)
    return text


def _check_parses(text: str, source: str) -> None:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        environment.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"the chat template {source} does not parse: line {exc.lineno}: {exc.message}; "
            "fix the Jinja, or pass another template"
        ) from exc


def check_chat_options(
    chat_template: str | None, tool_call_parser: str | None, reasoning: str | None
) -> None:
    """A ConfigError now for a template that cannot be read or parsed or a parser name that does not
    exist, before any model loads."""
    if chat_template is not None:
        read_chat_template(chat_template)
    if tool_call_parser is not None:
        tool_parser(tool_call_parser)
    if reasoning is not None:
        reasoning_parser(reasoning)


def choose_parsers(
    template: str | None, tool_call_parser: str | None, reasoning: str | None
) -> tuple[str, str | None]:
    """The tool-call and reasoning parsers a model with ``template`` is served with: as named, else
    detected from the template (``hermes`` when it shows no call format); the same for fulgor's
    engine and vLLM. An unknown name is a ConfigError listing the known ones."""
    parser = tool_call_parser or detect_tool_parser(template) or "hermes"
    tool_parser(parser)
    reasoning = reasoning or detect_reasoning_parser(template)
    if reasoning is not None:
        reasoning_parser(reasoning)
    return parser, reasoning


def model_chat_template(path: str | Path) -> str | None:
    """The chat template a model directory ships, read from its files without loading it:
    ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (the default one
    when it lists several by name); None when it ships none."""
    folder = Path(path)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def detect_tool_parser(template: str | None) -> str | None:
    """The tool-call parser whose format ``template`` teaches, by the markers it writes; None when
    it shows none."""
    if not template:
        return None
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_start|>" in template or re.search(r"\[\w+\(\w+=", template):
        return "pythonic"
    if "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template):
        return "llama3_json"
    return None


def detect_reasoning_parser(template: str | None) -> str | None:
    """``deepseek_r1`` when the generation prompt opens ``<think>`` itself, ``qwen3`` when the
    template otherwise knows ``</think>``; None when it shows no reasoning."""
    if not template or "</think>" not in template:
        return None
    generation = template.rpartition("add_generation_prompt")[2]
    opens_thinking = "<think>" in generation and "enable_thinking" not in generation
    return "deepseek_r1" if opens_thinking else "qwen3"


@dataclass(frozen=True)
class ChatFormat:
    """How one served model's chat requests are rendered and its answers parsed."""

    template: str | None
    tool_parser: str
    reasoning_parser: str | None
    renders_tools: bool
    renders_tool_calls: bool
    knows_tool_role: bool

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        chat_template: str | None = None,
        tool_call_parser: str | None = None,
        reasoning: str | None = None,
    ) -> ChatFormat:
        """The format of a model with ``tokenizer``: ``chat_template`` (text) in place of the
        tokenizer's own when given; parsers as named, else detected from the template (``hermes``
        when it shows no format). An unknown parser name is a ConfigError listing the known ones."""
        template = chat_template or getattr(tokenizer, "chat_template", None) or None
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        parser, reasoning = choose_parsers(template, tool_call_parser, reasoning)
        if template is None:
            return cls(None, parser, reasoning, False, False, False)
        return cls(
            template=template,
            tool_parser=parser,
            reasoning_parser=reasoning,
            renders_tools=_renders(tokenizer, template, _PROBE_TOOL, [_probe_user()], [_probe_tool()]),
            renders_tool_calls=_renders(tokenizer, template, _PROBE_CALL, _probe_call_turns(), None),
            knows_tool_role=bool(_TOOL_ROLE.search(template)),
        )

    @classmethod
    def own(cls, tokenizer: Any) -> ChatFormat:
        """The format of ``tokenizer``'s own template with detected parsers, probed once per tokenizer."""
        known = _OWN_FORMATS.get(tokenizer)
        if known is None or known.template != (getattr(tokenizer, "chat_template", None) or None):
            known = _OWN_FORMATS[tokenizer] = cls.of(tokenizer)
        return known

    @property
    def rewrites_history(self) -> bool:
        """Whether :meth:`normalise` rewrites turns the template cannot render: it has no tool
        calls or no ``tool`` role."""
        return self.template is not None and not (self.renders_tool_calls and self.knows_tool_role)

    @property
    def tool_support(self) -> str:
        """One line on what the template does with tools (``fulgor doctor`` prints it)."""
        if self.template is None:
            return "no chat template"
        if not self.renders_tools:
            return "leaves tool definitions out: requests with tools are refused"
        parts = [f"renders tool definitions; tool calls parsed as {self.tool_parser}"]
        if not self.renders_tool_calls:
            parts.append("earlier calls written into the assistant's content")
        if not self.knows_tool_role:
            parts.append("tool results sent as <tool_response> user turns")
        if self.reasoning_parser:
            parts.append(f"reasoning parsed as {self.reasoning_parser}")
        return "; ".join(parts)

    def render(
        self,
        tokenizer: Any,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """``messages`` (OpenAI chat messages as dicts) normalised and rendered to prompt text."""
        if self.template is None:
            raise InvalidRequestError(
                "this model has no chat template; use /v1/completions, add a chat_template to its "
                "tokenizer files, or serve it with --chat-template FILE"
            )
        if tools and not self.renders_tools:
            raise InvalidRequestError(
                f"this model's chat template leaves tool definitions out, so the model would never see "
                f"the {len(tools)} tool(s) this request offers; serve it with a tool-aware template: "
                f"--chat-template FILE, or one fulgor ships ({', '.join(SHIPPED_TEMPLATES)}: "
                "chatml-tools for a ChatML model such as SmolLM2), or send the request without tools",
                param="tools",
            )
        normalised = self.normalise(messages)
        try:
            text: str = tokenizer.apply_chat_template(
                normalised,
                tools=tools or None,
                chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except Exception as exc:  # template errors come from Jinja and the template's own raise_exception
            raise InvalidRequestError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from exc
        return text

    def normalise(self, messages: Sequence[dict[str, Any]], *, wire: bool = False) -> list[dict[str, Any]]:
        """Agent history as this template accepts it (see the module's docstring).

        With ``wire`` the turns stay OpenAI chat messages for a server that renders them itself
        (vLLM): the tool calls the template renders keep their arguments as the agent sent them
        (JSON text); otherwise they become mappings, as templates read them. A tool call without
        ``function.name`` is an InvalidRequestError."""
        result: list[dict[str, Any]] = []
        results_turn: dict[str, Any] | None = None  # the user turn the latest tool results went into
        for message in messages:
            turn = {**message, "content": "" if message.get("content") is None else message["content"]}
            calls = turn.get("tool_calls")
            if calls:
                template_calls = [_template_call(call) for call in calls]
                if not self.renders_tool_calls:
                    written = write_tool_calls(self.tool_parser, template_calls)
                    del turn["tool_calls"]
                    text = _text(turn["content"])
                    turn["content"] = f"{text}\n{written}" if text else written
                elif not wire:
                    turn["tool_calls"] = template_calls
            if turn.get("role") == "tool" and not self.knows_tool_role:
                block = f"<tool_response>\n{_text(turn['content'])}\n</tool_response>"
                if results_turn is not None and result[-1] is results_turn:
                    results_turn["content"] += "\n" + block
                    continue
                turn = results_turn = {"role": "user", "content": block}
            result.append(turn)
        return result

    def parse(self, text: str, tools_active: bool) -> ParsedOutput:
        """Generated ``text`` split into reasoning, content and (when tools are active) tool calls."""
        reasoning: str | None = None
        if self.reasoning_parser is not None:
            reasoning, text = reasoning_parser(self.reasoning_parser)(text)
        if tools_active:
            parsed = tool_parser(self.tool_parser)(text)
        else:
            parsed = ParsedOutput(content=text, tool_calls=[])
        if reasoning is None:
            return parsed
        return ParsedOutput(parsed.content or None, parsed.tool_calls, reasoning)


def write_tool_calls(parser: str, calls: Sequence[dict[str, Any]]) -> str:
    """``calls`` (OpenAI tool calls, arguments as mappings) written as ``parser``'s format reads them."""
    functions = [call.get("function", call) for call in calls]
    payloads = [{"name": f.get("name"), "arguments": f.get("arguments", {})} for f in functions]
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": p["name"], "parameters": p["arguments"]}) for p in payloads)
    if parser == "mistral":
        return "[TOOL_CALLS]" + json.dumps(payloads)
    if parser == "pythonic":
        return "[" + ", ".join(_python_call(p["name"], p["arguments"]) for p in payloads) + "]"
    return "\n".join(f"{TOOL_CALL_OPEN}\n{json.dumps(p)}\n{TOOL_CALL_CLOSE}" for p in payloads)


def _python_call(name: str, arguments: Any) -> str:
    """``name(key=value, ...)`` with each value as fulgor's pythonic template writes it."""
    items = arguments.items() if isinstance(arguments, dict) else []
    return f"{name}(" + ", ".join(f"{key}={_python_value(value)}" for key, value in items) + ")"


def _python_value(value: Any) -> str:
    named = {True: "True", False: "False", None: "None"}
    if value is None or isinstance(value, bool):
        return named[value]
    return json.dumps(value)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if "name" not in function:
        raise InvalidRequestError("every assistant tool call needs function.name", param="messages")
    function["arguments"] = tool_arguments_for_template(function.get("arguments", {}))
    return {**call, "function": function}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _probe_user() -> dict[str, Any]:
    return {"role": "user", "content": "What is 2 + 3?"}


def _probe_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": "probe",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }


def _probe_call_turns() -> list[dict[str, Any]]:
    call = {"id": "call_0", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {"a": 2}}}
    return [_probe_user(), {"role": "assistant", "content": "", "tool_calls": [call]}]


def _renders(
    tokenizer: Any,
    template: str,
    marker: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> bool:
    """Whether ``template`` writes ``marker`` when rendering ``messages`` (and ``tools``)."""
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that raises on the probe cannot render it
        return False
    return marker in str(text)
