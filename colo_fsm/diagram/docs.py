"""The generated blocks of a Markdown page (``<!-- BEGIN GENERATED: name -->`` ... ``<!-- END GENERATED: name -->``)
rewritten from the spec, and the page's SVG picture with them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from colo_fsm.diagram.markdown import docs_sections, picture_path
from colo_fsm.diagram.svg import to_svg
from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec

log = get_logger(__name__)

_BEGIN = re.compile(r"^<!-- BEGIN GENERATED: ([a-z_]+) -->[ \t]*$", re.MULTILINE)


def _end_marker(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


@dataclass(frozen=True)
class DocsUpdate:
    """The outcome of :func:`update_docs`: the new text and which generated blocks changed."""

    path: Path
    text: str
    changed: tuple[str, ...]
    found: tuple[str, ...]

    @property
    def stale(self) -> bool:
        """Whether any generated block differed from the spec."""
        return bool(self.changed)


def regenerate_docs(
    text: str, spec: LifecycleSpec = LIFECYCLE, *, source: str = "<docs>", required: Sequence[str] = ()
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Replace every ``<!-- BEGIN GENERATED: name -->`` ... ``<!-- END GENERATED: name -->`` block of ``text``.

    Returns ``(new_text, changed_names, found_names)``. An unknown name, a missing end marker, a
    duplicated block or a missing ``required`` block raises :class:`ConfigError` naming ``source`` and
    the line.
    """
    sections = docs_sections(spec)
    pieces: list[str] = []
    changed: list[str] = []
    found: list[str] = []
    pos = 0
    for m in _BEGIN.finditer(text):
        if m.start() < pos:
            continue
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        if name not in sections:
            raise ConfigError(f"{source}:{line}", name, f"a generated block named one of {', '.join(sections)}")
        if name in found:
            raise ConfigError(f"{source}:{line}", name, "each generated block once")
        end = text.find(_end_marker(name), m.end())
        if end < 0:
            raise ConfigError(f"{source}:{line}", name, f"a closing {_end_marker(name)}")
        body_start = m.end() + 1 if text.startswith("\n", m.end()) else m.end()
        old = text[body_start:end]
        new = sections[name]
        if old != new:
            changed.append(name)
        pieces.append(text[pos:body_start])
        pieces.append(new)
        pos = end
        found.append(name)
    pieces.append(text[pos:])
    missing = [n for n in required if n not in found]
    if missing:
        raise ConfigError(
            source,
            ", ".join(missing),
            "generated blocks present: <!-- BEGIN GENERATED: name --> ... <!-- END GENERATED: name -->",
        )
    return "".join(pieces), tuple(changed), tuple(found)


def update_docs(
    path: str | Path,
    spec: LifecycleSpec = LIFECYCLE,
    *,
    check: bool = False,
    required: Sequence[str] = ("mermaid", "transitions"),
) -> DocsUpdate:
    """Regenerate the generated blocks of the Markdown file at ``path`` from ``spec``.

    With ``check=True`` nothing is written; the result says which blocks are stale. The file must hold
    at least the ``required`` blocks. A page with a ``picture`` block also gets its SVG (drawn by
    :func:`~colo_fsm.diagram.svg.to_svg`, no Graphviz) at :func:`~colo_fsm.diagram.markdown.picture_path` next to it; a missing or
    different SVG counts as the ``picture`` block being stale.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("docs", str(p), "an existing Markdown file with <!-- BEGIN GENERATED: name --> markers")
    text = p.read_text(encoding="utf-8")
    new, changed, found = regenerate_docs(text, spec, source=str(p), required=required)
    if "picture" in found:
        svg_path = p.parent / picture_path(spec)
        svg = to_svg(spec)
        if not svg_path.is_file() or svg_path.read_text(encoding="utf-8") != svg:
            changed = (*changed, "picture") if "picture" not in changed else changed
            if not check:
                svg_path.parent.mkdir(parents=True, exist_ok=True)
                svg_path.write_text(svg, encoding="utf-8")
    if changed and not check:
        p.write_text(new, encoding="utf-8")
        log.info("updated %s: %s", p, ", ".join(changed))
    return DocsUpdate(p, new, changed, found)


__all__ = ["DocsUpdate", "regenerate_docs", "update_docs"]
