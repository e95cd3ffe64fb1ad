"""A strict parser of the Mermaid ``stateDiagram-v2`` subset colo-fsm emits (test support).

Every line must match one statement of the subset; every state an edge, a class or a note names must be
declared (``Name : description``); text may use only characters that are inert in Mermaid. It is stricter
than Mermaid on purpose: anything it accepts, Mermaid parses the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IDENT = r"[A-Za-z][A-Za-z0-9_]*"
_TEXT = r"[A-Za-z0-9 _,.()\[\]&!/+'=-]+"
_KEYWORDS = {"end", "state", "note", "class", "classDef", "direction", "as"}

_RE = {
    "direction": re.compile(r"direction (TB|BT|LR|RL)"),
    "classdef": re.compile(rf"classDef ({_IDENT}) ([a-z-]+:[#A-Za-z0-9. ]+(?:,[a-z-]+:[#A-Za-z0-9. ]+)*)"),
    "class": re.compile(rf"class ({_IDENT}(?:,{_IDENT})*) ({_IDENT})"),
    "edge": re.compile(rf"({_IDENT}|\[\*\]) --> ({_IDENT}|\[\*\])(?: : ({_TEXT}))?"),
    "describe": re.compile(rf"({_IDENT}) : ({_TEXT})"),
    "note": re.compile(rf"note (left|right) of ({_IDENT})"),
    "comment": re.compile(r"%%.*"),
}


class MermaidSyntaxError(ValueError):
    """A line outside the subset, or a reference to an undeclared state; names the line number."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class StateDiagram:
    title: str | None = None
    direction: str | None = None
    states: dict[str, str] = field(default_factory=dict)  # name -> description
    edges: list[tuple[str, str, str | None]] = field(default_factory=list)  # (source, dest, label)
    class_defs: dict[str, str] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)  # state -> class
    notes: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (side, state, lines)


def parse_state_diagram(text: str) -> StateDiagram:
    """Parse ``text``; raise :class:`MermaidSyntaxError` on the first line outside the subset."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    d = StateDiagram()
    i = 0
    if lines and lines[0] == "---":
        i = 1
        while i < len(lines) and lines[i] != "---":
            m = re.fullmatch(rf"title: ({_TEXT})", lines[i])
            if not m:
                raise MermaidSyntaxError(i + 1, f"front matter allows only 'title: ...', got {lines[i]!r}")
            d.title = m.group(1)
            i += 1
        if i == len(lines):
            raise MermaidSyntaxError(1, "front matter is not closed with '---'")
        i += 1
    if i >= len(lines) or lines[i] != "stateDiagram-v2":
        raise MermaidSyntaxError(i + 1, "expected the header 'stateDiagram-v2'")
    i += 1
    uses: list[tuple[int, str, str]] = []  # (line, state, what)
    open_note: tuple[int, str, str, list[str]] | None = None
    for n in range(i, len(lines)):
        raw = lines[n]
        lineno = n + 1
        if raw.strip() == "":
            continue
        if raw != raw.rstrip():
            raise MermaidSyntaxError(lineno, "trailing whitespace")
        stmt = raw.strip()
        if open_note is not None:
            if stmt == "end note":
                d.notes.append((open_note[1], open_note[2], open_note[3]))
                open_note = None
            elif re.fullmatch(_TEXT, stmt):
                open_note[3].append(stmt)
            else:
                raise MermaidSyntaxError(lineno, f"note text outside the allowed characters: {stmt!r}")
            continue
        if not raw.startswith("    "):
            raise MermaidSyntaxError(lineno, "statements are indented by four spaces")
        if _RE["comment"].fullmatch(stmt):
            continue
        if m := _RE["direction"].fullmatch(stmt):
            if d.direction is not None:
                raise MermaidSyntaxError(lineno, "direction given twice")
            d.direction = m.group(1)
        elif m := _RE["classdef"].fullmatch(stmt):
            d.class_defs[m.group(1)] = m.group(2)
        elif m := _RE["class"].fullmatch(stmt):
            for name in m.group(1).split(","):
                if name in d.classes:
                    raise MermaidSyntaxError(lineno, f"{name} is assigned a class twice")
                d.classes[name] = m.group(2)
                uses.append((lineno, name, "class"))
            if m.group(2) not in d.class_defs:
                raise MermaidSyntaxError(lineno, f"class {m.group(2)!r} has no classDef")
        elif m := _RE["edge"].fullmatch(stmt):
            src, dst, label = m.group(1), m.group(2), m.group(3)
            if src == "[*]" and dst == "[*]":
                raise MermaidSyntaxError(lineno, "an edge from [*] to [*]")
            for s in (src, dst):
                if s != "[*]":
                    uses.append((lineno, s, "edge"))
            d.edges.append((src, dst, label))
        elif m := _RE["note"].fullmatch(stmt):
            uses.append((lineno, m.group(2), "note"))
            open_note = (lineno, m.group(1), m.group(2), [])
        elif m := _RE["describe"].fullmatch(stmt):
            name = m.group(1)
            if name in d.states:
                raise MermaidSyntaxError(lineno, f"state {name} declared twice")
            d.states[name] = m.group(2)
        else:
            raise MermaidSyntaxError(lineno, f"not a statement of the stateDiagram-v2 subset: {stmt!r}")
    if open_note is not None:
        raise MermaidSyntaxError(open_note[0], "note is not closed with 'end note'")
    for name in d.states:
        if name in _KEYWORDS:
            raise MermaidSyntaxError(0, f"state name {name!r} is a Mermaid keyword")
    for lineno, name, what in uses:
        if name not in d.states:
            raise MermaidSyntaxError(lineno, f"{what} names {name!r}, which is not a declared state")
    return d


_LABEL = re.compile(
    r"(?P<auto>\(auto\) )?(?P<trigger>[a-z_][a-z0-9_]*)"
    r"(?: \[(?P<guards>!?[a-z_]+(?: & !?[a-z_]+)*)\])?"
    r"(?: / (?P<actions>[a-z_]+(?:, [a-z_]+)*))?"
)


@dataclass(frozen=True)
class EdgeLabel:
    automatic: bool
    trigger: str
    when: tuple[str, ...]
    unless: tuple[str, ...]
    actions: tuple[str, ...]


def parse_label(label: str) -> EdgeLabel:
    """Parse ``[(auto) ]trigger[ [g & !h]][ / a, b]``; raise ValueError when it is not that."""
    m = _LABEL.fullmatch(label)
    if not m:
        raise ValueError(f"edge label is not 'trigger [guards] / actions': {label!r}")
    guards = m.group("guards").split(" & ") if m.group("guards") else []
    return EdgeLabel(
        automatic=bool(m.group("auto")),
        trigger=m.group("trigger"),
        when=tuple(g for g in guards if not g.startswith("!")),
        unless=tuple(g[1:] for g in guards if g.startswith("!")),
        actions=tuple(m.group("actions").split(", ")) if m.group("actions") else (),
    )
