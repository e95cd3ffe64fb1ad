"""A griffe extension for the docs build: turn the Sphinx roles of colo-fsm's docstrings into links.

The docstrings use reST roles (``:class:`~colo_fsm.machine.Lifecycle```, ``:func:`render_timeline```) so they
read well in ``help()``; mkdocs renders Markdown. A role naming a ``colo_fsm`` object becomes an optional
cross-reference (a link when the target is documented, plain code otherwise, never a build warning); any
other role becomes inline code. Double-backtick literals are left to Markdown.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`<>]+?)`")


def _resolve(target: str, obj: griffe.Object) -> str | None:
    """The full dotted path of ``target`` as written in ``obj``'s docstring, or None when it cannot be told."""
    target = target.strip().rstrip("()")
    if target.startswith("colo_fsm"):
        return target
    if target.startswith("."):  # relative to the enclosing package
        module = obj if obj.is_module else obj.module
        base = module.path if module.is_package else module.path.rsplit(".", 1)[0]
        return base + target
    module = obj if obj.is_module else obj.module
    head = target.split(".", 1)[0]
    if head in module.members:  # a name the module defines or imports
        member = module.members[head]
        try:
            base = member.target_path if member.is_alias else member.path
        except Exception:
            return None
        return base + target[len(head) :]
    return None


def rewrite(text: str, obj: griffe.Object) -> str:
    """``text`` with every role replaced by an optional cross-reference or inline code."""

    def sub(m: re.Match[str]) -> str:
        short, target = m.group(1) == "~", m.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
        path = _resolve(target, obj)
        if path is None or not path.startswith("colo_fsm"):
            return f"`{shown}`"
        return f'<autoref identifier="{path.rstrip("()")}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(sub, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring once the package is loaded (imports are resolved by then)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out.extend(_walk(member))  # type: ignore[arg-type]
    return out
