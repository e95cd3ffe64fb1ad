"""Diagrams and docs tables of the lifecycle, generated from the declared spec (never a hand-written copy).

Everything here reads a :class:`~colo_fsm.states.spec.LifecycleSpec` (by default :data:`LIFECYCLE`). One module
holds the picture model, and each renderer is a module that reads it (and nothing beside it):

* :mod:`~colo_fsm.diagram.model` -- what every picture says: labels (``trigger [guards] / actions``, ``(auto)``
  for automatic transitions), state kinds and their colours, the title, the failure transition drawn once;
* :mod:`~colo_fsm.diagram.mermaid` -- :func:`to_mermaid`, Mermaid ``stateDiagram-v2`` text (renders on GitHub
  and in most Markdown viewers);
* :mod:`~colo_fsm.diagram.dot` -- :func:`to_dot`, Graphviz DOT source (no Graphviz binary needed to produce it);
* :mod:`~colo_fsm.diagram.graphviz` -- :func:`render`, a PNG/SVG/PDF picture through Graphviz's ``dot`` binary
  when it is installed;
* :mod:`~colo_fsm.diagram.svg` -- :func:`to_svg`, an SVG picture laid out and drawn by colo-fsm (no Graphviz);
* :mod:`~colo_fsm.diagram.markdown` -- :func:`to_markdown` and :func:`docs_sections`, the states, transitions,
  actions and facts tables for the docs (under the Mermaid diagram);
* :mod:`~colo_fsm.diagram.text` -- :func:`diagram_text`, the text formats by name;
* :mod:`~colo_fsm.diagram.docs` -- :func:`update_docs`, rewrite the generated blocks of a Markdown file between
  marker comments (and its SVG picture).

The chain runs one way: ``model`` <- ``mermaid``, ``dot``, ``svg`` <- ``graphviz`` (dot), ``markdown``
(mermaid) <- ``text``, ``docs`` <- this package, which only gathers the public names
(``tests/test_house.py`` fails on an import circle anywhere in ``colo_fsm``).
"""

from __future__ import annotations

from colo_fsm.diagram.docs import DocsUpdate, regenerate_docs, update_docs
from colo_fsm.diagram.dot import to_dot
from colo_fsm.diagram.graphviz import IMAGE_FORMATS, find_dot, render
from colo_fsm.diagram.markdown import (
    actions_table,
    docs_sections,
    facts_table,
    picture_path,
    states_table,
    to_markdown,
    transitions_table,
)
from colo_fsm.diagram.mermaid import to_mermaid
from colo_fsm.diagram.model import (
    AUTO_MARK,
    DEFAULT_TITLE,
    FailureStyle,
    failure_summary,
    guard_label,
    spec_title,
    state_conditions,
    state_kind,
    transition_label,
)
from colo_fsm.diagram.svg import to_svg, write_svg
from colo_fsm.diagram.text import FORMATS, diagram_text
from colo_fsm.errors import GRAPHVIZ_INSTALL_HINT, GraphvizNotFound, RenderError

__all__ = [
    "AUTO_MARK",
    "DEFAULT_TITLE",
    "FORMATS",
    "GRAPHVIZ_INSTALL_HINT",
    "IMAGE_FORMATS",
    "DocsUpdate",
    "FailureStyle",
    "GraphvizNotFound",
    "RenderError",
    "actions_table",
    "diagram_text",
    "docs_sections",
    "facts_table",
    "failure_summary",
    "find_dot",
    "guard_label",
    "picture_path",
    "regenerate_docs",
    "render",
    "spec_title",
    "state_conditions",
    "state_kind",
    "states_table",
    "to_dot",
    "to_markdown",
    "to_mermaid",
    "to_svg",
    "transition_label",
    "transitions_table",
    "update_docs",
    "write_svg",
]
