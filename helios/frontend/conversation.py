"""The normalized conversation: what every protocol decodes into and every renderer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES = ("system", "developer", "user", "assistant", "tool")


class FrontendError(ValueError):
    """A request the frontend cannot render; ``field`` names the offending input."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass
class TextBlock:
    text: str
    hint: bool = False  # an advisory cache breakpoint at the end of this block


@dataclass
class ImageBlock:
    """An image given inline (data URL or base64); ``image_index`` is its order in the request."""

    media_type: str
    data: bytes
    image_index: int
    hint: bool = False


Block = Union[TextBlock, ImageBlock]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass
class Message:
    role: Role
    content: list[Block] = field(default_factory=list)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # for role == "tool"
    name: str | None = None
    hint: bool = False  # a breakpoint after the whole message (e.g. a tool result)

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


@dataclass
class Options:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    enable_thinking: bool | None = None  # None: the recipe's prepared default
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # explicit template kwargs


@dataclass
class Conversation:
    messages: list[Message]
    options: Options = field(default_factory=Options)
    sampling: dict[str, Any] = field(default_factory=dict)  # request sampling options (before clamping)

    def images(self) -> list[ImageBlock]:
        return [b for m in self.messages for b in m.content if isinstance(b, ImageBlock)]

    def has_hints(self) -> bool:
        return any(m.hint or any(b.hint for b in m.content) for m in self.messages)
