"""Chat templates: how a list of messages becomes the prompt text the tokenizer encodes.

* ``roles`` (:func:`role_lines_template`): ``"<role>: <content>"`` lines then ``"assistant:"`` -- needs a
  tokenizer with letters, ``:`` and newlines.
* ``digits`` (:func:`digits_chat_template`): for the demo's task alphabet (digits and ``>``): each user turn is
  its text followed by ``>`` (added when absent), assistant turns are their text; system turns are refused
  unless empty.
* a path to a Jinja2 file (HF style: ``messages`` and ``add_generation_prompt`` in scope):
  :func:`jinja_chat_template`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from colo_fsm.errors import ConfigError
from colo_fsm.server.params import BadRequest

ChatTemplate = Callable[[Sequence[Mapping[str, str]]], str]


def role_lines_template(messages: Sequence[Mapping[str, str]]) -> str:
    """``"<role>: <content>"`` lines followed by ``"assistant:"``."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def digits_chat_template(messages: Sequence[Mapping[str, str]], marker: str = ">") -> str:
    """The demo's template: user text + ``marker`` (added if absent), assistant text as is, no role names."""
    out = []
    for i, m in enumerate(messages):
        role, text = m["role"], m["content"]
        if role in ("system", "developer"):
            if text:
                raise BadRequest(f"messages.{i}.content", "the digits chat template has no system turn (send it empty)")
            continue
        if role == "user":
            out.append(text if text.endswith(marker) else text + marker)
        elif role == "assistant":
            out.append(text)
        else:
            raise BadRequest(f"messages.{i}.role", f"{role!r} is not supported by the digits chat template")
    return "".join(out)


def jinja_chat_template(source: str) -> ChatTemplate:
    """A template from Jinja2 text (``messages``, ``add_generation_prompt=True`` in scope)."""
    import jinja2

    try:
        tpl = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(source)
    except jinja2.TemplateError as exc:
        raise ConfigError("chat_template", source[:60], f"a Jinja2 chat template ({exc})") from None

    def render(messages: Sequence[Mapping[str, str]]) -> str:
        try:
            return tpl.render(messages=list(messages), add_generation_prompt=True)
        except jinja2.TemplateError as exc:
            raise BadRequest("messages", f"the chat template failed: {str(exc)[:120]}") from None

    return render


BUILTIN: dict[str, ChatTemplate] = {"roles": role_lines_template, "digits": digits_chat_template}


def resolve_chat_template(spec: str | ChatTemplate) -> ChatTemplate:
    """A callable, a built-in name (``roles``, ``digits``) or a path to a Jinja2 file."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise ConfigError("chat_template", spec, f"one of {sorted(BUILTIN)} or a Jinja2 file path")
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError("chat_template", spec, f"one of {sorted(BUILTIN)} or an existing Jinja2 file")
    return jinja_chat_template(path.read_text(encoding="utf-8"))


__all__ = [
    "BUILTIN",
    "ChatTemplate",
    "digits_chat_template",
    "jinja_chat_template",
    "resolve_chat_template",
    "role_lines_template",
]
