"""House rules checked over the package's source: every error class lives in ``colo_fsm.errors`` under
``ColoFsmError``, timeouts are ``TimeoutError``s, no type check by class name, loggers come from
``get_logger(__name__)``."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

import colo_fsm.errors as errors
from colo_fsm.errors import BarrierTimeout, ColoFsmError, WaitTimeout
from colo_fsm.log import get_logger

PKG = Path(errors.__file__).resolve().parent
# test-kit fault markers stand for a *foreign* adapter's failure, and one private wrapper never escapes
NOT_OURS = {("testing/watch.py", "InjectedFault"), ("machine/lifecycle.py", "_ActionError")}


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    """Every module of the package, parsed once for all the checks here."""
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PKG.rglob("*.py"))}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PKG)), tree) for p, tree in _trees().items()]


def _is_exception(node: ast.ClassDef) -> bool:
    names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
    return any(n.endswith(("Error", "Exception", "Timeout")) or n in {"BadRequest", "GraphvizNotFound"} for n in names)


def test_every_error_class_is_in_errors_and_a_colo_fsm_error() -> None:
    outside = [
        f"{path}: class {node.name}"
        for path, tree in _modules()
        if path != "errors.py"
        for node in tree.body
        if isinstance(node, ast.ClassDef) and _is_exception(node) and (path, node.name) not in NOT_OURS
    ]
    assert not outside, f"error classes outside colo_fsm/errors.py: {outside}"
    for name, obj in vars(errors).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__:
            assert issubclass(obj, ColoFsmError), name
            if "Timeout" in name:
                assert issubclass(obj, TimeoutError), name
    assert issubclass(BarrierTimeout, TimeoutError) and issubclass(WaitTimeout, TimeoutError)
    e = BarrierTimeout(1.5, state="Draining", rank=1, weight_version=2)
    assert (
        str(e) == "barrier timed out after 1.5s waiting for the other ranks [state=Draining, rank=1, weight_version=2]"
    )


def test_no_type_check_by_class_name() -> None:
    bad = re.compile(r"__name__\s*(==|!=|in)\s*[\"'(\[]|[\"']\s*(==|!=)\s*type\([^)]*\)\.__name__")
    hits = [
        f"{p.relative_to(PKG)}:{n}: {line.strip()}"
        for p in sorted(PKG.rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if bad.search(line) and "__main__" not in line
    ]
    assert not hits, hits


def test_loggers_are_named_by_module_through_get_logger() -> None:
    hits = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"get_logger\(\s*[\"']", line) or (
                re.search(r"logging\.getLogger\(\s*[\"'_]", line) and str(rel) != "log.py"
            ):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "use colo_fsm.log.get_logger(__name__):\n" + "\n".join(hits)


def test_one_prefix_for_the_lifecycle_and_the_components(caplog) -> None:
    import logging

    from colo_fsm.log import set_context

    log = get_logger("colo_fsm.test_house")
    set_context(rank=3, state="Training", weight_version=7, step=7)
    with caplog.at_level(logging.INFO, logger="colo_fsm"):
        log.info("component line")
        log.info("lifecycle line", extra={"rank": 0, "state": "Draining", "weight_version": 2, "step": 1})
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "[rank=3 state=Training wv=7 step=7] component line",
        "[rank=0 state=Draining wv=2 step=1] lifecycle line",
    ]
    assert [r.rank for r in caplog.records] == [3, 0]  # type: ignore[attr-defined]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, tree: ast.Module, modules: set[str], *, package: bool) -> set[str]:
    """The ``colo_fsm`` modules ``tree`` imports, anywhere in it (a function's lazy import and a
    ``TYPE_CHECKING`` import count too): ``from pkg import name`` is the module ``pkg.name`` when there is one."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) + (1 if package else 0) - node.level]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for a in node.names:
                if f"{source}.{a.name}" in modules:
                    found.add(f"{source}.{a.name}")
                elif source in modules:
                    found.add(source)
    found.discard(name)
    return found


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    trees = {_module_name(p): (p, tree) for p, tree in _trees().items()}
    modules = set(trees)
    return {name: _imports(name, tree, modules, package=p.name == "__init__.py") for name, (p, tree) in trees.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_circles_are_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from colo_fsm.diagram import to_svg\n\ndef f():\n    from . import model\n")
    modules = {"colo_fsm.diagram", "colo_fsm.diagram.model", "colo_fsm.diagram.docs"}
    assert _imports("colo_fsm.diagram.docs", tree, modules, package=False) == {
        "colo_fsm.diagram",
        "colo_fsm.diagram.model",
    }


def test_no_import_circle_in_the_package() -> None:
    graph = _import_graph()
    assert {"colo_fsm.diagram.model", "colo_fsm.diagram.svg", "colo_fsm.machine.lifecycle"} <= set(graph)
    assert "colo_fsm.diagram.model" in graph["colo_fsm.diagram.svg"]  # the graph sees the imports it must
    circles = _circles(graph)
    assert not circles, "modules that import each other (directly or around a circle): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def test_the_picture_model_reads_only_the_spec() -> None:
    """The diagram's chain runs one way: its model imports no renderer, and no renderer imports the package's
    public face (``colo_fsm.diagram``), which gathers them all."""
    graph = _import_graph()
    assert not {m for m in graph["colo_fsm.diagram.model"] if m.startswith("colo_fsm.diagram")}
    inward = [m for m, deps in graph.items() if m.startswith("colo_fsm.diagram.") and "colo_fsm.diagram" in deps]
    assert not inward, inward
    import colo_fsm.diagram
    import colo_fsm.diagram.svg
    import colo_fsm.diagram_svg

    assert colo_fsm.diagram_svg.to_svg is colo_fsm.diagram.svg.to_svg is colo_fsm.diagram.to_svg
