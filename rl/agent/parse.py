"""The tool-call format of the agent and its parser.

A policy turn that contains ``<tool>`` is a tool call; the JSON object between ``<tool>`` and the first
``</tool>`` after it names the tool and gives its arguments::

    <tool>{"name": "zoom", "image": 2, "box": [0.25, 0.5, 0.5, 0.75]}</tool>
    <tool>{"name": "compare", "images": [1, 2]}</tool>

Coordinates: boxes are ``[x0, y0, x1, y1]`` in normalised note coordinates, fractions of the image's
width (x) and height (y) in [0, 1], origin top-left, ``x0 < x1`` and ``y0 < y1``. The same box names
the same content at any resolution, so the policy (which sees a downsample) and the tools (which crop
the full-resolution source) agree, and ``compare`` reports its regions in the same coordinates.
Images are numbered from 1 in the order of the note.

A turn without ``<tool>`` is an answer. :func:`parse_call` returns a :class:`ToolCall`, or a
:class:`ParseError` with a reason code and a message meant for the policy (the loop returns it as the
observation and goes on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

_TOOL = re.compile(r"<tool>.*?(</tool>|$)", re.S)
_ANSWER = re.compile(r"<answer>(.*?)(</answer>|$)", re.S)


def answer_text(text: str) -> str:
    """``text`` without tool calls; only the ``<answer>`` block when there is one."""
    m = _ANSWER.search(text)
    return m.group(1) if m else _TOOL.sub(" ", text)


TOOL_OPEN = "<tool>"
TOOL_CLOSE = "</tool>"

REASONS = (
    "unclosed",
    "malformed_json",
    "not_object",
    "no_name",
    "unknown_tool",
    "missing_arg",
    "extra_arg",
    "bad_type",
    "bad_value",
    "image_out_of_range",
    "bad_box",
)
"""Reason codes of :class:`ParseError`: the tags, the JSON, the tool name, then the arguments."""


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call of a registered tool with validated arguments."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    """The arguments (the JSON object without ``name``)."""


@dataclass(frozen=True)
class ParseError:
    """Why a tool call cannot run: ``reason`` (one of :data:`REASONS`) and a message for the policy."""

    reason: str
    message: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown parse error reason {self.reason!r}; known: {REASONS}")

    @property
    def observation(self) -> str:
        """The error observation the loop appends."""
        return f"error: {self.message}"


class Registry(Protocol):
    """What parsing needs of a tool registry (``rl.agent.tools.ToolRegistry``)."""

    @property
    def names(self) -> list[str]: ...

    def __contains__(self, name: object) -> bool: ...

    def validate(self, name: str, args: dict[str, Any], *, n_images: int) -> ParseError | None: ...


def is_call(text: str) -> bool:
    """Whether a policy turn is a tool call (it contains ``<tool>``)."""
    return TOOL_OPEN in text


def call_json(text: str) -> str | ParseError:
    """The text between the first ``<tool>`` and the ``</tool>`` after it."""
    start = text.find(TOOL_OPEN)
    if start < 0:
        return ParseError("unclosed", f"no {TOOL_OPEN} tag in the turn")
    start += len(TOOL_OPEN)
    end = text.find(TOOL_CLOSE, start)
    if end < 0:
        return ParseError("unclosed", f"the call has no closing {TOOL_CLOSE}")
    return text[start:end]


def parse_call(text: str, registry: Registry, *, n_images: int) -> ToolCall | ParseError:
    """Parse and validate the tool call in a policy turn against ``registry`` for a note of ``n_images``.

    Checks, in order: the tags, the JSON (an object with a string ``name``), that the tool is
    registered, then the arguments against the tool's schema (missing / extra / wrong type / out of
    range; image indices in 1..n_images) and the tool's own check (e.g. zoom's box).
    """
    body = call_json(text)
    if isinstance(body, ParseError):
        return body
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ParseError("malformed_json", f"the call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict):
        return ParseError("not_object", f"the call must be a JSON object, got {type(obj).__name__}")
    name = obj.pop("name", None)
    if not isinstance(name, str):
        return ParseError("no_name", 'the call needs a string "name" naming the tool')
    if name not in registry:
        return ParseError("unknown_tool", f"unknown tool {name!r}; tools: {', '.join(registry.names)}")
    problem = registry.validate(name, obj, n_images=n_images)
    return problem if problem is not None else ToolCall(name=name, args=obj)
