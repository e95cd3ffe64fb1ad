"""A picture of a lifecycle (PNG, SVG, PDF) rendered from its DOT source by Graphviz's ``dot`` binary, when it is
installed (:mod:`colo_fsm.diagram.svg` draws an SVG without it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from colo_fsm.diagram.dot import to_dot
from colo_fsm.errors import ConfigError, GraphvizNotFound, RenderError
from colo_fsm.log import get_logger
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec

log = get_logger(__name__)

IMAGE_FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""Picture formats :func:`render` produces through Graphviz."""


def find_dot(binary: str | None = None) -> str:
    """Path of Graphviz's ``dot`` (or of ``binary``); raises :class:`GraphvizNotFound` when absent."""
    name = binary or "dot"
    found = shutil.which(name)
    if found is None:
        raise GraphvizNotFound(name)
    return found


def render(
    output: str | Path,
    spec: LifecycleSpec = LIFECYCLE,
    *,
    fmt: str | None = None,
    dot_binary: str | None = None,
    timeout_s: float = 60.0,
    **dot_options: object,
) -> Path:
    """Render ``spec`` to a picture at ``output`` (format from ``fmt`` or the file suffix: png, svg, pdf).

    Needs Graphviz's ``dot``; without it raises :class:`GraphvizNotFound`, which says how to install it.
    ``dot_options`` go to :func:`to_dot`.
    """
    out = Path(output)
    kind = (fmt or out.suffix.lstrip(".")).lower()
    if kind not in IMAGE_FORMATS:
        raise ConfigError("output", str(output), f"a file ending in one of {', '.join('.' + f for f in IMAGE_FORMATS)}")
    source = to_dot(spec, **dot_options)  # type: ignore[arg-type]
    dot = find_dot(dot_binary)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            [dot, f"-T{kind}", "-o", str(out)],
            input=source.encode(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RenderError(f"{dot} did not finish within {timeout_s:g}s rendering {out}") from exc
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RenderError(f"{dot} -T{kind} failed (exit {proc.returncode}): {msg[-1] if msg else 'no message'}")
    log.info("rendered %s (%d bytes)", out, out.stat().st_size)
    return out


__all__ = ["IMAGE_FORMATS", "find_dot", "render"]
