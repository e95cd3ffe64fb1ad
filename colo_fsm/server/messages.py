"""Chat messages of a request body: roles, text content (a string or text parts), read field by field."""

from __future__ import annotations

from typing import Any

from colo_fsm.server.params import BadRequest, Body, short

ROLES = ("system", "user", "assistant", "tool", "developer")


def text_of(content: Any, where: str) -> str:
    """A message's text: a string, or a list of text parts (``text``/``input_text``/``output_text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(where, f"expected a string or a list of text parts, got {short(content)}")
    parts = []
    for j, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") not in ("text", "input_text", "output_text")
            or not isinstance(part.get("text"), str)
        ):
            raise BadRequest(f"{where}.{j}", "only {'type': 'text', 'text': str} parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def read_messages(value: Any, key: str = "messages") -> list[dict[str, str]]:
    """``[{"role", "content"}]`` from a request's message list; a 400 naming the first field at fault."""
    if not isinstance(value, list) or not value:
        raise BadRequest(key, "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        b = Body(m, f"{key}.{i}")
        role = b.get_str("role", None)
        if role not in ROLES:
            raise BadRequest(f"{key}.{i}.role", f"expected one of {list(ROLES)}, got {short(role)}")
        content = b.raw("content")
        if content is None and role != "assistant":
            raise BadRequest(f"{key}.{i}.content", f"is required for a {role} message (a string or text parts)")
        text = text_of(content, f"{key}.{i}.content")
        b.get_str("name", None)
        b.finish(ignore=("type", "id", "status", "annotations"))
        out.append({"role": role, "content": text})
    return out


__all__ = ["ROLES", "read_messages", "text_of"]
