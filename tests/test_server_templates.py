"""Chat templates: the demo's digits template, role lines, a Jinja2 file; bad names fail naming the field."""

from __future__ import annotations

import pytest

from colo_fsm.demo.config import DemoConfig
from colo_fsm.errors import ConfigError
from colo_fsm.server.params import BadRequest
from colo_fsm.server.templates import digits_chat_template, resolve_chat_template, role_lines_template


def test_digits_template_fits_the_demo_alphabet() -> None:
    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": "123"}]
    assert digits_chat_template(msgs) == "123>"
    turns = [
        {"role": "user", "content": "12>"},
        {"role": "assistant", "content": "21"},
        {"role": "user", "content": "3"},
    ]
    assert digits_chat_template(turns) == "12>213>"
    with pytest.raises(BadRequest) as info:
        digits_chat_template([{"role": "system", "content": "be nice"}, {"role": "user", "content": "1"}])
    assert info.value.param == "messages.0.content"


def test_resolve_names_and_jinja_files(tmp_path) -> None:
    assert resolve_chat_template("roles") is role_lines_template
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}>{% endfor %}")
    assert resolve_chat_template(str(f))([{"role": "user", "content": "42"}]) == "42>"
    for bad in ("nope", "", str(tmp_path / "missing.jinja")):
        with pytest.raises(ConfigError) as info:
            resolve_chat_template(bad)
        assert info.value.field == "chat_template"
    with pytest.raises(ConfigError):
        DemoConfig(chat_template="nope")
