"""The lifecycle drawn as an SVG picture by colo-fsm itself: no Graphviz, no browser script, no network.

:func:`to_svg` reads a :class:`~colo_fsm.states.spec.LifecycleSpec` and lays it out in layers, top to bottom
in the order the lifecycle reaches its states (a transition back up, such as a step's return to Generating,
is drawn with its arrow pointing up). Every transition is one curve with its label on it (``trigger
[guards] / actions``, automatic ones dashed blue and prefixed ``(auto)``, the same conventions as
:mod:`colo_fsm.diagram.model`); the machine-fired failure transition is a note in the Failed box naming every
failable state. The output is deterministic (the same spec gives the same bytes), so a committed picture
can be checked against the spec by regenerating it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from xml.sax.saxutils import escape

from colo_fsm.diagram.model import (
    AUTO_COLOR,
    AUTO_MARK,
    DEFAULT_TITLE,
    KIND_FILL,
    KIND_STROKE,
    checked_spec,
    spec_title,
    state_conditions,
    state_kind,
)
from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LIFECYCLE, LifecycleSpec, TransitionSpec

FONT = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
"""Every text is monospace, so its width is known without a font engine (0.6 em a character)."""

_CHAR_EM = 0.61
_NAME_PX, _SMALL_PX, _LABEL_PX, _TITLE_PX = 13.0, 10.0, 10.0, 16.0
_LINE = 1.3  # line height, in font sizes
_WRAP = 36  # characters per line of an edge label or note
_NODE_PAD_X, _NODE_PAD_Y = 12.0, 8.0
_LABEL_PAD = 4.0
_GAP_REAL, _GAP_DUMMY = 26.0, 12.0
_RANK_GAP = 16.0
_MARGIN = 20.0

_EDGE_USER, _EDGE_AUTO = "#37474f", AUTO_COLOR


def _text_w(text: str, size: float) -> float:
    return len(text) * size * _CHAR_EM


def _wrap(items: Sequence[str], sep: str, first: str = "", width: int = _WRAP) -> list[str]:
    """Join ``items`` with ``sep`` into lines of at most ``width`` characters (an item is never split);
    the first line starts with ``first``, the others are indented."""
    groups: list[list[str]] = [[]]
    for item in items:
        trial = [*groups[-1], item]
        if groups[-1] and len(first) + 1 + len((sep + " ").join(trial)) > width:
            groups.append([item])
        else:
            groups[-1] = trial
    lines = []
    for k, group in enumerate(groups):
        head = (first + " " if first else "") if k == 0 else "  "
        lines.append(head + (sep + " ").join(group) + (sep if k + 1 < len(groups) else ""))
    return lines


def edge_label_lines(t: TransitionSpec, *, actions: bool = True) -> list[str]:
    """The label of ``t`` in short lines: the trigger, the guards, then the actions."""
    lines = [f"{AUTO_MARK} {t.trigger}" if t.automatic else t.trigger]
    guards = [str(f) for f in t.when] + [f"!{f}" for f in t.unless]
    if guards:
        wrapped = _wrap(guards, " &")
        wrapped[0] = "[" + wrapped[0]
        wrapped[-1] += "]"
        lines += wrapped
    if actions and t.actions:
        lines += _wrap(list(t.actions), ",", first="/")
    return lines


@dataclass
class _Node:
    key: str
    rank: int
    w: float
    h: float
    kind: str  # "state", "label" or "bend"
    lines: list[str] = field(default_factory=list)
    x: float = 0.0
    y: float = 0.0


@dataclass
class _Edge:
    t: TransitionSpec
    upper: str
    lower: str
    reversed: bool
    chain: list[str] = field(default_factory=list)  # the dummies from upper to lower
    label: str = ""


def _ranks(spec: LifecycleSpec, edges: list[tuple[str, str]]) -> tuple[dict[str, int], set[int]]:
    """Layer of every state (longest path from the initial state once back edges are turned) and which
    edges (by index) point back up."""
    names = [s.state.value for s in spec.states]
    out_of: dict[str, list[int]] = {n: [] for n in names}
    for i, (a, _b) in enumerate(edges):
        out_of[a].append(i)
    back: set[int] = set()
    seen: set[str] = set()
    on_stack: set[str] = set()

    def dfs(n: str) -> None:
        seen.add(n)
        on_stack.add(n)
        for i in out_of[n]:
            m = edges[i][1]
            if m in on_stack:
                back.add(i)
            elif m not in seen:
                dfs(m)
        on_stack.discard(n)

    for root in [spec.initial.value, *names]:
        if root not in seen:
            dfs(root)
    dag = [(b, a) if i in back else (a, b) for i, (a, b) in enumerate(edges) if a != b]
    rank = {n: 0 for n in names}
    for _ in names:  # longest path: at most len(names) relaxations on a DAG
        for a, b in dag:
            rank[b] = max(rank[b], rank[a] + 1)
    # a state nothing leads to (Failed: entered by the machine itself) sits just above its first successor
    for _ in names:
        for n in names:
            if n != spec.initial.value and not any(b == n for _a, b in dag):
                succ = [rank[b] for a, b in dag if a == n]
                if succ:
                    rank[n] = max(0, min(succ) - 1)
    return rank, back


def _crossings(pos: dict[str, int], by_upper: dict[int, list[tuple[str, str]]], uppers: Iterable[int]) -> int:
    """Edge crossings between each layer of ``uppers`` and the layer below it."""
    total = 0
    for r in uppers:
        pairs = [(pos[a], pos[b]) for a, b in by_upper.get(r, ())]
        for i, (a1, b1) in enumerate(pairs):
            for a2, b2 in pairs[i + 1 :]:
                if (a1 - a2) * (b1 - b2) < 0:
                    total += 1
    return total


def _order(layers: list[list[str]], links: list[tuple[str, str]], rank: dict[str, int]) -> list[list[str]]:
    """Reorder each layer to cut crossings: barycenter sweeps, then adjacent swaps; keep the best seen."""
    preds: dict[str, list[str]] = {n: [] for layer in layers for n in layer}
    succs: dict[str, list[str]] = {n: [] for layer in layers for n in layer}
    by_upper: dict[int, list[tuple[str, str]]] = {}
    for a, b in links:
        succs[a].append(b)
        preds[b].append(a)
        by_upper.setdefault(rank[a], []).append((a, b))
    every = range(len(layers))

    def positions(ls: list[list[str]]) -> dict[str, int]:
        return {n: i for layer in ls for i, n in enumerate(layer)}

    best = [list(layer) for layer in layers]
    best_c = _crossings(positions(best), by_upper, every)
    cur = [list(layer) for layer in layers]
    for it in range(12):
        down = it % 2 == 0
        seq = range(1, len(cur)) if down else range(len(cur) - 2, -1, -1)
        for r in seq:
            pos = positions(cur)
            nbrs = preds if down else succs

            def key(n: str, pos: dict[str, int] = pos, nbrs: dict[str, list[str]] = nbrs) -> float:
                ns = nbrs[n]
                return sum(pos[m] for m in ns) / len(ns) if ns else float(pos[n])

            cur[r] = sorted(cur[r], key=key)
        pos = positions(cur)
        improved = True
        while improved:  # swap neighbours while that cuts the crossings next to their layer
            improved = False
            for r in every:
                near = (r - 1, r)
                for i in range(len(cur[r]) - 1):
                    u, v = cur[r][i], cur[r][i + 1]
                    before = _crossings(pos, by_upper, near)
                    pos[u], pos[v] = i + 1, i
                    if _crossings(pos, by_upper, near) < before:
                        cur[r][i], cur[r][i + 1] = v, u
                        improved = True
                    else:
                        pos[u], pos[v] = i, i + 1
        c = _crossings(pos, by_upper, every)
        if c < best_c:
            best, best_c = [list(layer) for layer in cur], c
    return best


def _place(desired: list[float], seps: list[float]) -> list[float]:
    """Positions as close as possible (least squares) to ``desired`` keeping ``p[i+1] - p[i] >= seps[i]``."""
    offs = [0.0]
    for s in seps:
        offs.append(offs[-1] + s)
    targets = [d - o for d, o in zip(desired, offs, strict=True)]
    blocks: list[list[float]] = []  # [mean, count]
    for t in targets:  # pool adjacent violators: the shifted positions must not decrease
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    out: list[float] = []
    for mean, count in blocks:
        out += [mean] * int(count)
    return [q + o for q, o in zip(out, offs, strict=True)]


def _layout(
    spec: LifecycleSpec, *, actions: bool, conditions: bool, notes: Mapping[str, Sequence[str]]
) -> tuple[dict[str, _Node], list[_Edge], list[float]]:
    pairs = [(t.source.value, t.dest.value) for t in spec.transitions]
    rank, back = _ranks(spec, pairs)
    nodes: dict[str, _Node] = {}
    for s in spec.states:
        name = s.state.value
        lines = [state_conditions(s)] if conditions else []
        if s.state == spec.failed and spec.failable():
            fail = [f"{spec.fail_trigger} (machine-fired) when an action", "raises, from any of"]
            lines += fail + _wrap([f.value for f in spec.failable()], ",")
            lines += ["collector paused, engine suspended", "best effort; no teardown until stop"]
        for note in notes.get(name, ()):  # a long note wraps at its commas
            lines += _wrap(note.split(", "), ",", width=44) if len(note) > 44 else [note]
        width = max([_text_w(name, _NAME_PX)] + [_text_w(x, _SMALL_PX) for x in lines]) + 2 * _NODE_PAD_X
        height = _NAME_PX * _LINE + len(lines) * _SMALL_PX * _LINE + 2 * _NODE_PAD_Y
        nodes[name] = _Node(name, 2 * rank[name], width, height, "state", lines)
    edges: list[_Edge] = []
    for i, t in enumerate(spec.transitions):
        a, b = pairs[i]
        rev = i in back
        upper, lower = (b, a) if rev else (a, b)
        e = _Edge(t, upper, lower, rev)
        label_lines = edge_label_lines(t, actions=actions)
        lw = max(_text_w(x, _LABEL_PX) for x in label_lines) + 2 * _LABEL_PAD
        lh = len(label_lines) * _LABEL_PX * _LINE + 2 * _LABEL_PAD
        if a == b:  # a self-loop: its label sits right of the state (placed there after the ordering)
            e.label = f"loop{i}"
            nodes[e.label] = _Node(e.label, nodes[a].rank, lw, lh, "label", label_lines)
            edges.append(e)
            continue
        r0, r1 = nodes[upper].rank, nodes[lower].rank
        label_rank = r1 - 1 if rev else r0 + 1
        for r in range(r0 + 1, r1):
            key = f"e{i}r{r}"
            if r == label_rank:
                nodes[key] = _Node(key, r, lw, lh, "label", label_lines)
                e.label = key
            else:
                nodes[key] = _Node(key, r, 6.0, 0.0, "bend")
            e.chain.append(key)
        edges.append(e)
    links: list[tuple[str, str]] = []
    for e in edges:
        if e.upper != e.lower:
            path = [e.upper, *e.chain, e.lower]
            links += list(pairwise(path))
    depth = max(n.rank for n in nodes.values()) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    for n in nodes.values():  # declaration order, then edge order: the starting order of each layer
        layers[n.rank].append(n.key)
    ranks = {k: n.rank for k, n in nodes.items()}
    layers = _order(layers, links, ranks)
    for e in edges:  # a self-loop's label goes right after its state in the layer
        if e.upper == e.lower:
            layer = layers[nodes[e.upper].rank]
            layer.remove(e.label)
            layer.insert(layer.index(e.upper) + 1, e.label)
    # x: each layer packed, then nudged toward its neighbours (straight long edges weigh most), layer by layer
    preds: dict[str, list[str]] = {k: [] for k in nodes}
    succs: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in links:
        succs[a].append(b)
        preds[b].append(a)

    def seps(layer: list[str]) -> list[float]:
        out = []
        for a, b in pairwise(layer):
            gap = _GAP_REAL if nodes[a].kind == "state" and nodes[b].kind == "state" else _GAP_DUMMY
            out.append((nodes[a].w + nodes[b].w) / 2 + gap)
        return out

    for layer in layers:
        xs = _place([0.0] * len(layer), seps(layer))
        for k, x in zip(layer, xs, strict=True):
            nodes[k].x = x
    for it in range(24):
        order = range(len(layers)) if it % 2 == 0 else range(len(layers) - 1, -1, -1)
        for r in order:
            layer = layers[r]
            desired = []
            for k in layer:
                ns = (preds[k] if it % 4 < 2 else succs[k]) if it < 20 else preds[k] + succs[k]
                if not ns:
                    ns = preds[k] + succs[k]
                if not ns:
                    desired.append(nodes[k].x)
                    continue
                weights = [8.0 if nodes[k].kind != "state" and nodes[m].kind != "state" else 2.0 for m in ns]
                desired.append(sum(w * nodes[m].x for w, m in zip(weights, ns, strict=True)) / sum(weights))
            for k, x in zip(layer, _place(desired, seps(layer)), strict=True):
                nodes[k].x = x
    left = min(n.x - n.w / 2 for n in nodes.values())
    for n in nodes.values():
        n.x += _MARGIN - left
    heights = [max([nodes[k].h for k in layer] + [0.0]) for layer in layers]
    tops: list[float] = []
    y = 0.0
    for h in heights:
        tops.append(y)
        y += h + _RANK_GAP
    for n in nodes.values():
        n.y = tops[n.rank] + heights[n.rank] / 2
    return nodes, edges, [y]


def _f(v: float) -> str:
    return f"{v:.1f}"


def _path(points: list[tuple[float, float]]) -> str:
    """A smooth curve through ``points`` (a Catmull-Rom spline), leaving the first and entering the last
    vertically."""
    n = len(points)
    sign = 1.0 if points[-1][1] >= points[0][1] else -1.0
    tangents: list[tuple[float, float]] = []
    for i, (_x, y) in enumerate(points):
        if i in (0, n - 1):
            other = points[1] if i == 0 else points[-2]
            tangents.append((0.0, sign * abs(other[1] - y)))
        else:
            tangents.append(((points[i + 1][0] - points[i - 1][0]) / 2, (points[i + 1][1] - points[i - 1][1]) / 2))
    d = [f"M{_f(points[0][0])},{_f(points[0][1])}"]
    for i in range(n - 1):
        (x1, y1), (x2, y2) = points[i], points[i + 1]
        (tx1, ty1), (tx2, ty2) = tangents[i], tangents[i + 1]
        d.append(f"C{_f(x1 + tx1 / 3)},{_f(y1 + ty1 / 3)} {_f(x2 - tx2 / 3)},{_f(y2 - ty2 / 3)} {_f(x2)},{_f(y2)}")
    return " ".join(d)


def to_svg(
    spec: LifecycleSpec = LIFECYCLE,
    *,
    title: str | None = DEFAULT_TITLE,
    actions: bool = True,
    conditions: bool = True,
    notes: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """An SVG picture of ``spec``, laid out and drawn by colo-fsm (no Graphviz).

    ``title`` may hold ``{name}`` (the spec's name; the default names it); ``notes`` adds lines under a
    state's conditions (e.g. the calls of another framework made in that state).
    """
    spec = checked_spec(spec)
    notes = dict(notes or {})
    unknown = sorted(set(notes) - {s.state.value for s in spec.states})
    if unknown:
        raise ConfigError("notes", unknown, f"state names of spec {spec.name!r}")
    nodes, edges, (body_h,) = _layout(spec, actions=actions, conditions=conditions, notes=notes)
    text_title = spec_title(spec, title)
    head = (_TITLE_PX * 2.2 if text_title else 0.0) + 34.0  # title, then room for the start marker
    legend_h = 34.0
    width = (
        max([n.x + n.w / 2 for n in nodes.values()] + [_text_w(text_title or "", _TITLE_PX) + _MARGIN, 640.0]) + _MARGIN
    )
    height = head + body_h + legend_h + _MARGIN
    for n in nodes.values():
        n.y += head
    kinds = {s.state.value: state_kind(spec, s) for s in spec.states}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(width)}" height="{_f(height)}" '
        f'viewBox="0 0 {_f(width)} {_f(height)}" font-family="{FONT}" role="img">',
        f"<title>{escape(text_title or spec.name)}</title>",
        "<defs>",
    ]
    for name, color in (("user", _EDGE_USER), ("auto", _EDGE_AUTO)):
        out.append(
            f'<marker id="arrow-{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>'
        )
    out.append("</defs>")
    out.append(f'<rect x="0" y="0" width="{_f(width)}" height="{_f(height)}" fill="#ffffff"/>')
    if text_title:
        out.append(
            f'<text x="{_f(width / 2)}" y="{_f(_MARGIN + _TITLE_PX)}" font-size="{_TITLE_PX:g}" font-weight="bold" '
            f'text-anchor="middle" fill="#1b1b1b">{escape(text_title)}</text>'
        )
    # ports: the edges leaving a state's bottom (or entering its top) spread along it in the order they go
    bottom: dict[str, list[tuple[float, int]]] = {}
    top: dict[str, list[tuple[float, int]]] = {}
    for i, e in enumerate(edges):
        if e.upper == e.lower:
            continue
        first = nodes[e.chain[0]] if e.chain else nodes[e.lower]
        last = nodes[e.chain[-1]] if e.chain else nodes[e.upper]
        bottom.setdefault(e.upper, []).append((first.x, i))
        top.setdefault(e.lower, []).append((last.x, i))

    def ports(table: dict[str, list[tuple[float, int]]]) -> dict[tuple[str, int], float]:
        got: dict[tuple[str, int], float] = {}
        for key, items in table.items():
            n = nodes[key]
            items.sort()
            span = n.w * 0.7
            for j, (_x, i) in enumerate(items):
                got[(key, i)] = n.x + (span * ((j + 0.5) / len(items) - 0.5) if len(items) > 1 else 0.0)
        return got

    out_port, in_port = ports(bottom), ports(top)
    labels: list[str] = []
    for i, e in enumerate(edges):
        color, dash = (_EDGE_AUTO, ' stroke-dasharray="6 4"') if e.t.automatic else (_EDGE_USER, "")
        marker = "auto" if e.t.automatic else "user"
        if e.upper == e.lower:
            n = nodes[e.upper]
            x0, y0, bulge = n.x + n.w / 2, n.y - n.h / 4, 2 * _GAP_DUMMY + 8
            d = f"M{_f(x0)},{_f(y0)} C{_f(x0 + bulge)},{_f(y0 - 10)} {_f(x0 + bulge)},{_f(y0 + n.h / 2 + 10)} "
            d += f"{_f(x0)},{_f(y0 + n.h / 2)}"
        else:
            u, lo = nodes[e.upper], nodes[e.lower]
            pts = [(out_port[(e.upper, i)], u.y + u.h / 2)]
            pts += [(nodes[k].x, nodes[k].y) for k in e.chain]
            pts.append((in_port[(e.lower, i)], lo.y - lo.h / 2))
            d = _path(pts[::-1] if e.reversed else pts)
        out.append(
            f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.4"{dash} marker-end="url(#arrow-{marker})">'
            f"<title>{escape(e.t.source.value)} -&gt; {escape(e.t.dest.value)}</title></path>"
        )
        lab = nodes[e.label]
        lx, ly = lab.x - lab.w / 2, lab.y - lab.h / 2
        labels.append(
            f'<rect x="{_f(lx)}" y="{_f(ly)}" width="{_f(lab.w)}" height="{_f(lab.h)}" rx="3" fill="#ffffff" '
            f'fill-opacity="0.92" stroke="{color}" stroke-width="0.6"/>'
        )
        for j, line in enumerate(lab.lines):
            ty = ly + _LABEL_PAD + (j + 0.8) * _LABEL_PX * _LINE
            weight = ' font-weight="bold"' if j == 0 else ""
            labels.append(
                f'<text x="{_f(lx + _LABEL_PAD)}" y="{_f(ty)}" font-size="{_LABEL_PX:g}"{weight} fill="{color}" '
                f'xml:space="preserve">{escape(line)}</text>'
            )
    out += labels
    init = nodes[spec.initial.value]
    sx, sy = init.x, init.y - init.h / 2 - 26
    out.append(f'<circle cx="{_f(sx)}" cy="{_f(sy)}" r="6" fill="#1b1b1b"/>')
    out.append(
        f'<path d="M{_f(sx)},{_f(sy + 6)} L{_f(sx)},{_f(init.y - init.h / 2)}" stroke="{_EDGE_USER}" '
        'stroke-width="1.4" marker-end="url(#arrow-user)"/>'
    )
    for s in spec.states:
        n = nodes[s.state.value]
        kind = kinds[n.key]
        x, y = n.x - n.w / 2, n.y - n.h / 2
        dash = ' stroke-dasharray="5 3"' if kind == "transient" else ""
        sw = "2" if kind in ("terminal", "failed") else "1.4"
        out.append(
            f'<g><title>{escape(n.key)} ({kind})</title><rect x="{_f(x)}" y="{_f(y)}" width="{_f(n.w)}" '
            f'height="{_f(n.h)}" rx="8" fill="{KIND_FILL[kind]}" stroke="{KIND_STROKE[kind]}" stroke-width="{sw}"{dash}/>'
        )
        if s.terminal:
            out.append(
                f'<rect x="{_f(x + 3)}" y="{_f(y + 3)}" width="{_f(n.w - 6)}" height="{_f(n.h - 6)}" rx="6" '
                f'fill="none" stroke="{KIND_STROKE[kind]}" stroke-width="1"/>'
            )
        ty = y + _NODE_PAD_Y + _NAME_PX
        out.append(
            f'<text x="{_f(n.x)}" y="{_f(ty)}" font-size="{_NAME_PX:g}" font-weight="bold" text-anchor="middle" '
            f'fill="#1b1b1b">{escape(n.key)}</text>'
        )
        for j, line in enumerate(n.lines):
            ty = y + _NODE_PAD_Y + _NAME_PX * _LINE + (j + 0.85) * _SMALL_PX * _LINE
            style = ' font-style="italic"' if j > 0 or not conditions else ""  # notes in italics
            out.append(
                f'<text x="{_f(n.x)}" y="{_f(ty)}" font-size="{_SMALL_PX:g}" text-anchor="middle" fill="#37474f"'
                f'{style} xml:space="preserve">{escape(line)}</text>'
            )
        out.append("</g>")
    out += _legend(height - legend_h, width)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(y: float, width: float) -> list[str]:
    items: list[str] = []
    x = _MARGIN
    cy = y + 12
    for kind in ("resting", "transient", "terminal", "failed"):
        dash = ' stroke-dasharray="4 2"' if kind == "transient" else ""
        items.append(
            f'<rect x="{_f(x)}" y="{_f(cy - 7)}" width="22" height="14" rx="3" fill="{KIND_FILL[kind]}" '
            f'stroke="{KIND_STROKE[kind]}"{dash}/>'
        )
        items.append(f'<text x="{_f(x + 28)}" y="{_f(cy + 4)}" font-size="10" fill="#37474f">{kind}</text>')
        x += 28 + _text_w(kind, 10) + 18
    for name, color, dash, text in (
        ("user", _EDGE_USER, "", "trigger called by you"),
        ("auto", _EDGE_AUTO, ' stroke-dasharray="6 4"', "(auto) fired by the machine"),
    ):
        items.append(
            f'<path d="M{_f(x)},{_f(cy)} L{_f(x + 30)},{_f(cy)}" stroke="{color}" stroke-width="1.4"{dash} '
            f'marker-end="url(#arrow-{name})"/>'
        )
        items.append(f'<text x="{_f(x + 36)}" y="{_f(cy + 4)}" font-size="10" fill="#37474f">{text}</text>')
        x += 36 + _text_w(text, 10) + 18
    return items


def write_svg(path: str | Path, spec: LifecycleSpec = LIFECYCLE, **options: object) -> Path:
    """Write :func:`to_svg` of ``spec`` to ``path`` (a ``.svg`` file); return the path."""
    out = Path(path)
    if out.suffix.lower() != ".svg":
        raise ConfigError("output", str(path), "a file ending in .svg")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_svg(spec, **options), encoding="utf-8")  # type: ignore[arg-type]
    return out


__all__ = ["FONT", "edge_label_lines", "to_svg", "write_svg"]
