"""The docs' reference tables stay complete against the code: every error class has a row in operations.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from colo_fsm import errors

ROOT = Path(__file__).resolve().parents[1]


def _section(page: str, name: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    m = re.search(rf"<!-- BEGIN {name} -->(.*?)<!-- END {name} -->", text, re.S)
    assert m, f"{page}: no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' section"
    return m.group(1)


def _first_column(table: str) -> list[str]:
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", ln).group(1) for ln in rows]  # type: ignore[union-attr]


def test_every_error_has_a_row_in_operations() -> None:
    classes = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.ColoFsmError) and obj.__module__ == errors.__name__
    }
    listed = _first_column(_section("docs/operations.md", "ERRORS TABLE"))
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(n for n in listed if listed.count(n) > 1)}"
    missing, stale = classes - set(listed) - {"ColoFsmError"}, set(listed) - classes
    assert not missing, f"docs/operations.md: errors without a row: {sorted(missing)}"
    assert not stale, f"docs/operations.md: rows for errors that do not exist: {sorted(stale)}"
