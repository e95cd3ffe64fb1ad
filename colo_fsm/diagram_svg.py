"""The lifecycle drawn as an SVG picture by colo-fsm itself (no Graphviz): the import path this picture had
before it moved to :mod:`colo_fsm.diagram.svg`, kept for code that imports it from here."""

from __future__ import annotations

from colo_fsm.diagram.svg import FONT, edge_label_lines, to_svg, write_svg

__all__ = ["FONT", "edge_label_lines", "to_svg", "write_svg"]
