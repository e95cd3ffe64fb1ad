"""The small part of PromQL that colo-fsm's Grafana dashboard uses, evaluated over scraped series (no Prometheus).

``docs/dashboards/colo-fsm-server.json`` is written in this subset, so that the same queries Grafana sends to
Prometheus can be drawn here from ``/metrics`` scrapes (``scripts/render_server_dashboard.py``):

* a selector ``name{label="v", label=~"re", label!="v"}``, with a range ``[30s]`` / ``[1m]`` under ``rate``;
* ``rate(selector[window])`` (per-second increase of a counter, counter resets handled) and
  ``avg_over_time(selector[window])`` (a gauge's mean over the window);
* ``sum(expr)`` and ``sum by (labels) (expr)``; ``max(expr)``;
* ``histogram_quantile(q, expr)`` over ``_bucket`` series (Prometheus' linear interpolation within a bucket);
* ``a / b`` between two expressions whose series have the same labels;
* Grafana's ``$rank`` (any rank) and ``$__rate_interval`` (the ``rate_window`` given) variables.

A scrape is ``{"t": seconds, "samples": {sample name: [[labels, value], ...]}}``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Labels = tuple[tuple[str, str], ...]
Vector = dict[Labels, float]
Scrape = dict[str, Any]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<dur>\[[^\]]+\])|(?P<str>\"(?:[^\"\\]|\\.)*\")|(?P<op>=~|!=|[=(){},/])"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*))"
)


class PromQLError(ValueError):
    """A query outside the subset, or malformed."""


def duration_s(text: str) -> float:
    """``30s``, ``1m``, ``2h`` in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not m:
        raise PromQLError(f"duration {text!r}: expected a number and ms, s, m or h")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]


@dataclass(frozen=True)
class Node:
    """One node of a parsed query."""

    kind: str  # "selector", "rate", "sum", "max", "quantile", "div", "number"
    name: str = ""
    matchers: tuple[tuple[str, str, str], ...] = ()
    window_s: float = 0.0
    by: tuple[str, ...] | None = None
    args: tuple[Node, ...] = ()
    value: float = 0.0


def substitute(query: str, rate_window: str = "15s") -> str:
    """Grafana's variables as a renderer sees them: every rank, and ``rate_window`` for ``$__rate_interval``."""
    return query.replace("$__rate_interval", rate_window).replace('"$rank"', '".*"')


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise PromQLError(f"cannot read {text[pos : pos + 20]!r} in {text!r}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.text = text

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            raise PromQLError(f"expected {value or kind} at token {self.i} of {self.text!r}, got {tok}")
        self.i += 1
        return tok[1]

    def parse(self) -> Node:
        node = self.expr()
        if self.peek() is not None:
            raise PromQLError(f"unexpected {self.peek()} in {self.text!r}")
        return node

    def expr(self) -> Node:
        left = self.term()
        while self.peek() == ("op", "/"):
            self.take("/")
            left = Node("div", args=(left, self.term()))
        return left

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = [self.take(kind="name")]
        while self.peek() == ("op", ","):
            self.take(",")
            names.append(self.take(kind="name"))
        self.take(")")
        return tuple(names)

    def term(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise PromQLError(f"unexpected end of {self.text!r}")
        if tok[0] == "num":
            self.i += 1
            return Node("number", value=float(tok[1]))
        name = self.take(kind="name")
        if name in ("sum", "max"):
            by = None
            if self.peek() == ("name", "by"):
                self.take("by")
                by = self.labels()
            self.take("(")
            inner = self.expr()
            self.take(")")
            if by is None and self.peek() == ("name", "by"):
                self.take("by")
                by = self.labels()
            return Node(name, by=by, args=(inner,))
        if name in ("rate", "avg_over_time"):
            self.take("(")
            sel = self.selector(self.take(kind="name"))
            self.take(")")
            if not sel.window_s:
                raise PromQLError(f"{name}() needs a range selector in {self.text!r}")
            return Node(name, name=sel.name, matchers=sel.matchers, window_s=sel.window_s)
        if name == "histogram_quantile":
            self.take("(")
            q = float(self.take(kind="num"))
            self.take(",")
            inner = self.expr()
            self.take(")")
            return Node("quantile", value=q, args=(inner,))
        return self.selector(name)

    def selector(self, name: str) -> Node:
        matchers: list[tuple[str, str, str]] = []
        if self.peek() == ("op", "{"):
            self.take("{")
            while self.peek() != ("op", "}"):
                label = self.take(kind="name")
                op = self.take(kind="op")
                if op not in ("=", "=~", "!="):
                    raise PromQLError(f"matcher {label}{op}: only =, =~ and != in {self.text!r}")
                value = self.take(kind="str")[1:-1].replace('\\"', '"')
                matchers.append((label, op, value))
                if self.peek() == ("op", ","):
                    self.take(",")
            self.take("}")
        window = 0.0
        if self.peek() is not None and self.peek()[0] == "dur":  # type: ignore[index]
            window = duration_s(self.take(kind="dur")[1:-1])
        return Node("selector", name=name, matchers=tuple(matchers), window_s=window)


def parse(query: str) -> Node:
    """Parse ``query`` (after :func:`substitute`); :class:`PromQLError` outside the subset."""
    return _Parser(query).parse()


def metric_names(node: Node) -> set[str]:
    """The sample names a query reads."""
    out = {node.name} if node.kind in ("selector", "rate", "avg_over_time") else set()
    for a in node.args:
        out |= metric_names(a)
    return out


def _match(labels: dict[str, str], matchers: Sequence[tuple[str, str, str]]) -> bool:
    for label, op, value in matchers:
        got = labels.get(label, "")
        if op == "=" and got != value:
            return False
        if op == "!=" and got == value:
            return False
        if op == "=~" and not re.fullmatch(value, got):
            return False
    return True


def _select(scrape: Scrape, name: str, matchers: Sequence[tuple[str, str, str]]) -> Vector:
    out: Vector = {}
    for labels, value in scrape["samples"].get(name, []):
        if _match(labels, matchers):
            out[tuple(sorted(labels.items()))] = float(value)
    return out


def _rate(scrapes: Sequence[Scrape], at: int, node: Node) -> Vector:
    now = scrapes[at]
    points: dict[Labels, list[tuple[float, float]]] = {}
    for s in scrapes[: at + 1]:
        if s["t"] < now["t"] - node.window_s:
            continue
        for labels, v in _select(s, node.name, node.matchers).items():
            points.setdefault(labels, []).append((s["t"], v))
    out: Vector = {}
    for labels, pts in points.items():
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            continue
        increase = 0.0
        for (_, a), (_, b) in itertools.pairwise(pts):
            increase += b - a if b >= a else b  # a counter reset: it counted b since
        out[labels] = increase / (pts[-1][0] - pts[0][0])
    return out


def _avg_over_time(scrapes: Sequence[Scrape], at: int, node: Node) -> Vector:
    points: dict[Labels, list[float]] = {}
    for s in scrapes[: at + 1]:
        if s["t"] >= scrapes[at]["t"] - node.window_s:
            for labels, v in _select(s, node.name, node.matchers).items():
                points.setdefault(labels, []).append(v)
    return {labels: sum(vs) / len(vs) for labels, vs in points.items()}


def _aggregate(vec: Vector, by: tuple[str, ...] | None, fn: Callable[[list[float]], float]) -> Vector:
    groups: dict[Labels, list[float]] = {}
    for labels, v in vec.items():
        key = tuple((k, v2) for k, v2 in labels if by is not None and k in by)
        groups.setdefault(key, []).append(v)
    return {k: fn(vs) for k, vs in groups.items()}


def _quantile(q: float, vec: Vector) -> Vector:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, v in vec.items():
        le = dict(labels).get("le")
        if le is None:
            continue
        key = tuple((k, x) for k, x in labels if k != "le")
        groups.setdefault(key, []).append((math.inf if le == "+Inf" else float(le), v))
    out: Vector = {}
    for key, buckets in groups.items():
        buckets.sort()
        count = buckets[-1][1] if buckets else 0.0
        if count <= 0 or buckets[-1][0] != math.inf:
            out[key] = math.nan
            continue
        rank = q * count
        prev_le, prev_c = 0.0, 0.0
        for bound, c in buckets:
            if c >= rank:
                if bound == math.inf:
                    out[key] = prev_le  # in the last bucket: its lower bound, as Prometheus does
                elif c == prev_c:
                    out[key] = bound
                else:
                    out[key] = prev_le + (bound - prev_le) * (rank - prev_c) / (c - prev_c)
                break
            prev_le, prev_c = bound, c
    return out


def evaluate(node: Node, scrapes: Sequence[Scrape], at: int) -> Vector:
    """The instant vector of ``node`` at scrape index ``at``."""
    if node.kind == "number":
        return {(): node.value}
    if node.kind == "selector":
        return _select(scrapes[at], node.name, node.matchers)
    if node.kind == "rate":
        return _rate(scrapes, at, node)
    if node.kind == "avg_over_time":
        return _avg_over_time(scrapes, at, node)
    if node.kind == "sum":
        return _aggregate(evaluate(node.args[0], scrapes, at), node.by, sum)
    if node.kind == "max":
        return _aggregate(evaluate(node.args[0], scrapes, at), node.by, max)
    if node.kind == "quantile":
        return _quantile(node.value, evaluate(node.args[0], scrapes, at))
    if node.kind == "div":
        a, b = (evaluate(x, scrapes, at) for x in node.args)
        return {k: (v / b[k] if b.get(k) else math.nan) for k, v in a.items() if k in b}
    raise PromQLError(f"unknown node {node.kind}")  # pragma: no cover


def legend(fmt: str, labels: Labels) -> str:
    """Grafana's ``{{label}}`` legend format filled in."""
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt) if fmt else ",".join(d.values())


__all__ = ["Node", "PromQLError", "duration_s", "evaluate", "legend", "metric_names", "parse", "substitute"]
