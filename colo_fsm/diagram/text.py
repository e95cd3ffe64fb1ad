"""The diagram as text in a format named at run time (what ``colo-fsm diagram --format`` writes)."""

from __future__ import annotations

from colo_fsm.diagram.dot import to_dot
from colo_fsm.diagram.markdown import to_markdown
from colo_fsm.diagram.mermaid import to_mermaid
from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec

FORMATS: tuple[str, ...] = ("mermaid", "dot", "markdown")
"""Text formats :func:`diagram_text` produces."""


def diagram_text(fmt: str, spec: LifecycleSpec = LIFECYCLE, **options: object) -> str:
    """The diagram of ``spec`` as text in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "mermaid":
        return to_mermaid(spec, **options)  # type: ignore[arg-type]
    if fmt == "dot":
        return to_dot(spec, **options)  # type: ignore[arg-type]
    if fmt == "markdown":
        if options:
            raise ConfigError("options", sorted(options), "no options for the markdown format")
        return to_markdown(spec)
    raise ConfigError("format", fmt, f"one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "diagram_text"]
