"""Diagrams and docs tables of the lifecycle, generated from the declared spec (never a hand-written copy).

Everything here reads a :class:`~colo_fsm.states.spec.LifecycleSpec` (by default :data:`LIFECYCLE`):

* :func:`to_mermaid` -- Mermaid ``stateDiagram-v2`` text (renders on GitHub and in most Markdown viewers);
* :func:`to_dot` -- Graphviz DOT source (no Graphviz binary needed to produce it);
* :func:`render` -- a PNG/SVG/PDF picture, through Graphviz's ``dot`` binary when it is installed;
* :func:`to_markdown` and :func:`docs_sections` -- the states, transitions and actions tables for the docs;
* :func:`update_docs` -- rewrite the generated blocks of a Markdown file between marker comments.

Conventions shared by every format: a transition is labelled ``trigger [guards] / actions``; guards read
``fact`` (must hold) and ``!fact`` (must not hold) joined by ``&``; automatic transitions (fired by the machine
itself) are marked ``(auto)`` and drawn dashed where the format can; the machine-fired failure transition
(``spec.fail_trigger``) from every failable state to Failed is drawn once, compactly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from colo_fsm.errors import GRAPHVIZ_INSTALL_HINT, ConfigError, GraphvizNotFound, RenderError
from colo_fsm.log import get_logger
from colo_fsm.states.rules import rules_table
from colo_fsm.states.spec import FACT_DESCRIPTIONS, LIFECYCLE, LifecycleSpec, State, StateSpec, TransitionSpec

log = get_logger(__name__)

FORMATS: tuple[str, ...] = ("mermaid", "dot", "markdown")
"""Text formats :func:`diagram_text` produces."""

IMAGE_FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""Picture formats :func:`render` produces through Graphviz."""

AUTO_MARK = "(auto)"
"""Prefix of the label of an automatic transition."""

FailureStyle = Literal["note", "edges"]

DEFAULT_TITLE = "colo-fsm lifecycle ({name})"
"""The default title of every picture; ``{name}`` stands for the spec's name (``lifecycle``, ``nemo_rl``...)."""


def spec_title(spec: LifecycleSpec, title: str | None = DEFAULT_TITLE) -> str | None:
    """``title`` with ``{name}`` replaced by ``spec.name`` (None or empty: no title)."""
    return title.replace("{name}", spec.name) if title else None


# ---------------------------------------------------------------------------------------------- labels
def guard_label(t: TransitionSpec) -> str:
    """The guards of ``t`` compactly: ``fact & !other`` (empty when unguarded)."""
    return " & ".join([str(f) for f in t.when] + [f"!{f}" for f in t.unless])


def transition_label(t: TransitionSpec, *, actions: bool = True) -> str:
    """``[(auto) ]trigger[ [guards]][ / action, action]`` on one line."""
    parts = [f"{AUTO_MARK} {t.trigger}" if t.automatic else t.trigger]
    guards = guard_label(t)
    if guards:
        parts.append(f"[{guards}]")
    if actions and t.actions:
        parts.append("/ " + ", ".join(t.actions))
    return " ".join(parts)


def state_conditions(s: StateSpec) -> str:
    """``engine <condition>, collector <condition>`` of one state."""
    return f"engine {s.engine.value}, collector {s.collector.value}"


def state_kind(spec: LifecycleSpec, s: StateSpec) -> str:
    """``failed``, ``terminal``, ``resting`` (waits for a user trigger) or ``transient`` (left automatically)."""
    if s.state == spec.failed:
        return "failed"
    if s.terminal:
        return "terminal"
    return "resting" if s.resting else "transient"


def failure_summary(spec: LifecycleSpec) -> str:
    """One sentence on the failure transition, naming every failable state."""
    names = ", ".join(s.value for s in spec.failable())
    return (
        f"{spec.fail_trigger}: from any of {names} when an action raises. "
        f"{spec.failed.value}: collector paused and engine suspended best effort, no teardown until stop"
    )


def _check_spec(spec: object) -> LifecycleSpec:
    if not isinstance(spec, LifecycleSpec):
        raise ConfigError("spec", spec, "a colo_fsm.states.spec.LifecycleSpec")
    return spec


def _check_failure(failure: object) -> FailureStyle:
    if failure not in ("note", "edges"):
        raise ConfigError("failure", failure, "'note' or 'edges'")
    return failure


# ---------------------------------------------------------------------------------------------- mermaid
_MERMAID_CLASSES: dict[str, str] = {
    "resting": "fill:#e8f5e9,stroke:#2e7d32,color:#1b1b1b",
    "transient": "fill:#fffde7,stroke:#f9a825,stroke-dasharray:5 3,color:#1b1b1b",
    "terminal": "fill:#eceff1,stroke:#37474f,stroke-width:2px,color:#1b1b1b",
    "failed": "fill:#ffebee,stroke:#c62828,stroke-width:2px,color:#1b1b1b",
}


def _mermaid_id(state: State | str) -> str:
    ident = str(state)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident) or ident in ("end", "state", "note", "class"):
        raise ConfigError("state", ident, "a state name of letters, digits and _ that is not a Mermaid keyword")
    return ident


def _mermaid_text(text: str) -> str:
    # ';' ends a statement and '#' starts an entity in Mermaid; neither appears in names we generate.
    return text.replace(";", ",").replace("#", "no. ").replace("%%", "%")


def to_mermaid(
    spec: LifecycleSpec = LIFECYCLE,
    *,
    title: str | None = DEFAULT_TITLE,
    direction: Literal["TB", "LR"] = "TB",
    actions: bool = True,
    conditions: bool = True,
    failure: FailureStyle = "note",
) -> str:
    """Mermaid ``stateDiagram-v2`` text of ``spec``.

    Every state is declared (with its engine/collector conditions when ``conditions``) and styled by kind
    (resting, transient, terminal, failed); every transition is one edge labelled ``trigger [guards] /
    actions``, automatic ones prefixed ``(auto)``. The failure transition is a note on Failed naming every
    failable state (``failure="note"``) or one edge per failable state (``failure="edges"``).
    """
    spec = _check_spec(spec)
    failure = _check_failure(failure)
    if direction not in ("TB", "LR"):
        raise ConfigError("direction", direction, "'TB' or 'LR'")
    out: list[str] = []
    title = spec_title(spec, title)
    if title:
        out += ["---", f"title: {_mermaid_text(title)}", "---"]
    out += ["stateDiagram-v2", f"    direction {direction}"]
    for cls, style in _MERMAID_CLASSES.items():
        out.append(f"    classDef {cls} {style}")
    for s in spec.states:
        sid = _mermaid_id(s.state)
        out.append(f"    {sid} : {state_conditions(s)}" if conditions else f"    {sid} : {sid}")
    out.append(f"    [*] --> {_mermaid_id(spec.initial)}")
    for t in spec.transitions:
        label = _mermaid_text(transition_label(t, actions=actions))
        out.append(f"    {_mermaid_id(t.source)} --> {_mermaid_id(t.dest)} : {label}")
    if failure == "edges":
        for fs in spec.failable():
            out.append(f"    {_mermaid_id(fs)} --> {_mermaid_id(spec.failed)} : {spec.fail_trigger} [an action raised]")
    for s in spec.states:
        if s.terminal:
            out.append(f"    {_mermaid_id(s.state)} --> [*]")
    if failure == "note":
        out.append(f"    note left of {_mermaid_id(spec.failed)}")
        names = [s.value for s in spec.failable()]
        out.append(f"        {spec.fail_trigger} (machine-fired) when an action raises, from any of")
        for i in range(0, len(names), 4):
            tail = "," if i + 4 < len(names) else ""
            out.append("        " + ", ".join(names[i : i + 4]) + tail)
        out.append("        collector paused and engine suspended best effort")
        out.append("        no teardown until stop")
        out.append("    end note")
    kinds: dict[str, list[str]] = {k: [] for k in _MERMAID_CLASSES}
    for s in spec.states:
        kinds[state_kind(spec, s)].append(_mermaid_id(s.state))
    for cls, members in kinds.items():
        if members:
            out.append(f"    class {','.join(members)} {cls}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- dot
def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_DOT_FILL = {"resting": "#e8f5e9", "transient": "#fffde7", "terminal": "#eceff1", "failed": "#ffebee"}
_DOT_LINE = {"resting": "#2e7d32", "transient": "#f9a825", "terminal": "#37474f", "failed": "#c62828"}


def _dot_edge_label(t: TransitionSpec, actions: bool) -> str:
    head = f"{AUTO_MARK} {t.trigger}" if t.automatic else t.trigger
    guards = guard_label(t)
    lines = [head + (f" [{guards}]" if guards else "")]
    if actions and t.actions:
        acts = list(t.actions)
        # two actions per line keeps the edge labels narrow enough for a readable layout
        for i in range(0, len(acts), 2):
            lines.append(("/ " if i == 0 else "  ") + ", ".join(acts[i : i + 2]))
    return "\n".join(lines)


def to_dot(
    spec: LifecycleSpec = LIFECYCLE,
    *,
    title: str | None = DEFAULT_TITLE,
    rankdir: Literal["TB", "LR"] = "TB",
    actions: bool = True,
    conditions: bool = True,
    failure: FailureStyle = "note",
) -> str:
    """Graphviz DOT source of ``spec`` (needs no Graphviz binary).

    Automatic transitions are dashed and blue. The failable states sit in one cluster; with
    ``failure="note"`` the failure transition is a single dotted red edge from that cluster to Failed,
    with ``failure="edges"`` one such edge per failable state.
    """
    spec = _check_spec(spec)
    failure = _check_failure(failure)
    if rankdir not in ("TB", "LR"):
        raise ConfigError("rankdir", rankdir, "'TB' or 'LR'")
    failable = set(spec.failable())
    out = ["digraph colo_fsm_lifecycle {"]
    graph_attrs = [f"rankdir={rankdir}", "compound=true", "fontname=Helvetica", "nodesep=0.5", "ranksep=0.6"]
    title = spec_title(spec, title)
    if title:
        graph_attrs += [f"label={_dot_quote(title)}", "labelloc=t", "fontsize=16"]
    out.append(f"    graph [{', '.join(graph_attrs)}];")
    out.append('    node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=11];')
    out.append("    edge [fontname=Helvetica, fontsize=9];")
    out.append('    "__start__" [shape=point, width=0.15, label=""];')

    def node(s: StateSpec) -> str:
        kind = state_kind(spec, s)
        label = f"{s.state.value}\n{state_conditions(s)}" if conditions else s.state.value
        extra = ", peripheries=2" if s.terminal else ""
        return (
            f"{_dot_quote(s.state.value)} [label={_dot_quote(label)}, fillcolor={_dot_quote(_DOT_FILL[kind])}, "
            f"color={_dot_quote(_DOT_LINE[kind])}{extra}];"
        )

    out.append("    subgraph cluster_failable {")
    out.append(
        f"        graph [label={_dot_quote(f'failable: an action raising fires {spec.fail_trigger}')}, "
        "style=dashed, color=gray60, fontcolor=gray40, fontsize=10];"
    )
    for s in spec.states:
        if s.state in failable:
            out.append("        " + node(s))
    out.append("    }")
    for s in spec.states:
        if s.state not in failable:
            out.append("    " + node(s))
    out.append(f'    "__start__" -> {_dot_quote(spec.initial.value)};')
    for t in spec.transitions:
        attrs = [f"label={_dot_quote(_dot_edge_label(t, actions))}"]
        if t.automatic:
            attrs += ["style=dashed", 'color="#1565c0"', 'fontcolor="#1565c0"']
        out.append(f"    {_dot_quote(t.source.value)} -> {_dot_quote(t.dest.value)} [{', '.join(attrs)}];")
    fail_attrs = 'style=dotted, color="#c62828", fontcolor="#c62828", penwidth=1.5'
    if failure == "edges":
        for fs in spec.failable():
            out.append(
                f"    {_dot_quote(fs.value)} -> {_dot_quote(spec.failed.value)} "
                f"[label={_dot_quote(spec.fail_trigger)}, {fail_attrs}];"
            )
    elif spec.failable():
        # one compound edge leaving the cluster stands for the failure edge of every failable state
        anchor = spec.failable()[-1]
        label = f"{spec.fail_trigger} (any failable state)\ncollector paused, engine suspended\nno teardown until stop"
        out.append(
            f"    {_dot_quote(anchor.value)} -> {_dot_quote(spec.failed.value)} "
            f"[ltail=cluster_failable, label={_dot_quote(label)}, {fail_attrs}];"
        )
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- render
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


# ---------------------------------------------------------------------------------------------- markdown
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if text else "-"


def _md_code(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in items)


def states_table(spec: LifecycleSpec = LIFECYCLE) -> str:
    """Markdown table of the states: kind, declared engine and collector conditions, description."""
    spec = _check_spec(spec)
    rows = [
        "| State | Kind | Engine | Collector | Requests | Serves requests | Ends a step | Description |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in spec.states:
        name = f"**{s.state.value}**" + (" (initial)" if s.state == spec.initial else "")
        kind = state_kind(spec, s) + (", validation-only" if s.validates else "")
        rows.append(
            f"| {name} | {kind} | {s.engine.value} | {s.collector.value} | {s.requests.value} | "
            f"{'yes' if s.serves_requests else '-'} | {'yes' if s.ends_step else '-'} | {_md_cell(s.description)} |"
        )
    return "\n".join(rows) + "\n"


def transitions_table(spec: LifecycleSpec = LIFECYCLE) -> str:
    """Markdown table of every transition (in declaration order) plus a line on the failure transition."""
    spec = _check_spec(spec)
    rows = [
        "| # | Trigger | Source | Destination | Guards | Actions | Automatic | Why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, t in enumerate(spec.transitions, 1):
        guards = " & ".join([f"`{f}`" for f in t.when] + [f"`!{f}`" for f in t.unless])
        rows.append(
            f"| {i} | `{t.trigger}` | {t.source.value} | {t.dest.value} | {_md_cell(guards)} | "
            f"{_md_cell(_md_code(t.actions))} | {'yes' if t.automatic else 'no'} | {_md_cell(t.description)} |"
        )
    failable = ", ".join(s.value for s in spec.failable())
    rows.append("")
    rows.append(
        f"Failure: `{spec.fail_trigger}` is fired by the machine itself when an action raises, from any of "
        f"{failable}, to {spec.failed.value}."
    )
    return "\n".join(rows) + "\n"


def actions_table(spec: LifecycleSpec = LIFECYCLE) -> str:
    """Markdown table of the actions: the collective work each issues and the conditions it leaves."""
    spec = _check_spec(spec)
    rows = [
        "| Action | Role | Calls | Issues on the device | Facts | Leaves | Description |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in spec.actions:
        leaves = ", ".join(
            x
            for x in (
                f"engine {a.engine.value}" if a.engine else "",
                f"collector {a.collector.value}" if a.collector else "",
                f"requests {a.requests.value}" if a.requests else "",
            )
            if x
        )
        facts = "; ".join(
            x
            for x in (
                ("sets " + _md_code(f.value for f in a.sets)) if a.sets else "",
                ("decides " + _md_code(f.value for f in a.decides)) if a.decides else "",
                ("upgrades " + _md_code(f.value for f in a.upgrades)) if a.upgrades else "",
                ("clears " + _md_code(f.value for f in a.cleared())) if a.cleared() else "",
            )
            if x
        )
        calls = f"`{a.calls[0]}.{a.calls[1]}`" if a.calls else "-"
        rows.append(
            f"| `{a.name}` | {a.role.value if a.role else '-'} | {calls} | {a.issues.value if a.issues else '-'} | "
            f"{_md_cell(facts)} | {_md_cell(leaves)} | {_md_cell(a.description)} |"
        )
    return "\n".join(rows) + "\n"


def facts_table(spec: LifecycleSpec = LIFECYCLE) -> str:
    """Markdown table of the facts the guards read: which actions set and clear each, read off the declarations."""
    spec = _check_spec(spec)
    rows = ["| Fact | Set by | Cleared by | Why it exists |", "|---|---|---|---|"]
    used = [f for f in FACT_DESCRIPTIONS if f in spec.guard_facts() or spec.writers(f)]
    for f in used:
        setters = spec.writers(f)
        clearers = tuple(a.name for a in spec.actions if f in a.cleared())
        rows.append(
            f"| `{f.value}` | {_md_cell(_md_code(setters))} | {_md_cell(_md_code(clearers))} | "
            f"{_md_cell(FACT_DESCRIPTIONS[f])} |"
        )
    return "\n".join(rows) + "\n"


def picture_path(spec: LifecycleSpec) -> str:
    """Where the ``picture`` block of a docs page points: ``diagrams/<spec name>.svg`` next to the page."""
    return f"diagrams/{spec.name}.svg"


def docs_sections(spec: LifecycleSpec = LIFECYCLE) -> dict[str, str]:
    """The generated blocks of the docs, by marker name: ``rules``, ``picture``, ``mermaid``, ``states``,
    ``transitions``, ``actions``, ``facts`` (``rules`` is :data:`~colo_fsm.states.rules.RULES`, the same for
    every spec; ``picture`` links the SVG :func:`update_docs` writes at :func:`picture_path`)."""
    spec = _check_spec(spec)
    alt = spec_title(spec) or spec.name
    return {
        "rules": rules_table(),
        "picture": f"[![{alt}]({picture_path(spec)})]({picture_path(spec)})\n",
        "mermaid": "```mermaid\n" + to_mermaid(spec) + "```\n",
        "states": states_table(spec),
        "transitions": transitions_table(spec),
        "actions": actions_table(spec),
        "facts": facts_table(spec),
    }


def to_markdown(spec: LifecycleSpec = LIFECYCLE) -> str:
    """A Markdown page: the Mermaid diagram, then the states, transitions and actions tables."""
    sec = docs_sections(spec)
    return (
        "## Diagram\n\n"
        + sec["mermaid"]
        + "\n## States\n\n"
        + sec["states"]
        + "\n## Transitions\n\n"
        + sec["transitions"]
        + "\n## Actions\n\n"
        + sec["actions"]
        + "\n## Facts\n\n"
        + sec["facts"]
    )


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


# ---------------------------------------------------------------------------------------------- docs markers
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
    :func:`colo_fsm.diagram_svg.to_svg`, no Graphviz) at :func:`picture_path` next to it; a missing or
    different SVG counts as the ``picture`` block being stale.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("docs", str(p), "an existing Markdown file with <!-- BEGIN GENERATED: name --> markers")
    text = p.read_text(encoding="utf-8")
    new, changed, found = regenerate_docs(text, spec, source=str(p), required=required)
    if "picture" in found:
        from colo_fsm.diagram_svg import to_svg

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


__all__ = [
    "AUTO_MARK",
    "DEFAULT_TITLE",
    "FORMATS",
    "GRAPHVIZ_INSTALL_HINT",
    "IMAGE_FORMATS",
    "DocsUpdate",
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
    "transition_label",
    "transitions_table",
    "update_docs",
]
