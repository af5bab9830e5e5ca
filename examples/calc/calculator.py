"""The calc task's calculator, its tool definition and the agent's system prompt: the standard
library only, so that an agent in another environment (the AutoGen example's MCP server) shares
them exactly."""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

__all__ = ["CALCULATOR_TOOL", "MAX_TURNS", "SYSTEM_PROMPT", "calculate", "run_tool"]

SYSTEM_PROMPT = "Use the calculator, then reply with Answer: and the number."
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic: + - * / ( ).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
MAX_TURNS = 3

_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """Evaluate arithmetic safely (no names, calls or attributes); errors come back as text.

    >>> calculate("37*48"), calculate("(2+3)/2"), calculate("__import__('os')")
    ('1776', '2.5', 'error: only numbers and + - * / ( ) are allowed')
    """
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as error:
        return f"error: {error}"
    return str(int(value)) if float(value).is_integer() else str(value)


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.operand)))
    raise ValueError("only numbers and + - * / ( ) are allowed")


def run_tool(name: str | None, arguments: str | None) -> str:
    """What a tool call of the model gets back: the calculator's result, or an error as text.

    >>> run_tool("calculator", '{"expression": "12*7"}'), run_tool("search", "{}")
    ('84', "error: unknown tool 'search'")
    """
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        expression = json.loads(arguments or "{}")["expression"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: call calculator with {"expression": "..."}'
    return calculate(str(expression))
