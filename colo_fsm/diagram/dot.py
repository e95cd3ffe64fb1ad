"""Graphviz DOT source of a lifecycle (no Graphviz binary needed to produce it)."""

from __future__ import annotations

from typing import Literal

from colo_fsm.diagram.model import (
    AUTO_COLOR,
    AUTO_MARK,
    DEFAULT_TITLE,
    KIND_FILL,
    KIND_STROKE,
    FailureStyle,
    checked_failure,
    checked_spec,
    guard_label,
    spec_title,
    state_conditions,
    state_kind,
)
from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec, StateSpec, TransitionSpec


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


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
    spec = checked_spec(spec)
    failure = checked_failure(failure)
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
            f"{_dot_quote(s.state.value)} [label={_dot_quote(label)}, fillcolor={_dot_quote(KIND_FILL[kind])}, "
            f"color={_dot_quote(KIND_STROKE[kind])}{extra}];"
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
            attrs += ["style=dashed", f'color="{AUTO_COLOR}"', f'fontcolor="{AUTO_COLOR}"']
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


__all__ = ["to_dot"]
