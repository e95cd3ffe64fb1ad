"""Mermaid ``stateDiagram-v2`` text of a lifecycle (renders on GitHub and in most Markdown viewers)."""

from __future__ import annotations

import re
from typing import Literal

from colo_fsm.diagram.model import (
    DEFAULT_TITLE,
    FailureStyle,
    checked_failure,
    checked_spec,
    spec_title,
    state_conditions,
    state_kind,
    transition_label,
)
from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec, State

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
    spec = checked_spec(spec)
    failure = checked_failure(failure)
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


__all__ = ["to_mermaid"]
