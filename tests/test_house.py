"""House rules checked over the package's source: every error class lives in ``colo_fsm.errors`` under
``ColoFsmError``, timeouts are ``TimeoutError``s, no type check by class name, loggers come from
``get_logger(__name__)``."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import colo_fsm.errors as errors
from colo_fsm.errors import BarrierTimeout, ColoFsmError, WaitTimeout
from colo_fsm.log import get_logger

PKG = Path(errors.__file__).resolve().parent
# test-kit fault markers stand for a *foreign* adapter's failure, and one private wrapper never escapes
NOT_OURS = {("testing/watch.py", "InjectedFault"), ("machine/lifecycle.py", "_ActionError")}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PKG)), ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PKG.rglob("*.py"))]


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
