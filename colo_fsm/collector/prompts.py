"""What a rollout starts from: :class:`Prompt` (a stable id, the text, metadata) and :func:`as_prompts`, which
turns the forms a collector accepts (prompts, ``(prompt_id, text)`` pairs, plain strings) into prompts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One prompt to roll out: a stable id, the text, and free-form metadata (e.g. the reference answer)."""

    prompt_id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_id, str) or not self.prompt_id:
            raise ConfigError("prompt_id", self.prompt_id, "a non-empty string")
        if not isinstance(self.text, str):
            raise ConfigError("text", self.text, "a string")


def as_prompts(items: Iterable[Prompt | str | tuple[str, str]]) -> Iterator[Prompt]:
    """Prompts from :class:`Prompt` objects, ``(prompt_id, text)`` pairs or plain strings (ids ``p0, p1, ...``)."""
    for n, item in enumerate(items):
        if isinstance(item, Prompt):
            yield item
        elif isinstance(item, str):
            yield Prompt(f"p{n}", item)
        elif isinstance(item, tuple) and len(item) == 2:
            yield Prompt(str(item[0]), item[1])
        else:
            raise ConfigError(f"prompts[{n}]", item, "a Prompt, a str or a (prompt_id, text) pair")
