"""The lifecycle's tables for the docs (states, transitions, actions, facts) and a Markdown page of them under
its Mermaid diagram."""

from __future__ import annotations

from collections.abc import Iterable

from colo_fsm.diagram.mermaid import to_mermaid
from colo_fsm.diagram.model import checked_spec, spec_title, state_kind
from colo_fsm.states.rules import rules_table
from colo_fsm.states.spec import FACT_DESCRIPTIONS, LIFECYCLE, LifecycleSpec


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if text else "-"


def _md_code(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in items)


def states_table(spec: LifecycleSpec = LIFECYCLE) -> str:
    """Markdown table of the states: kind, declared engine and collector conditions, description."""
    spec = checked_spec(spec)
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
    spec = checked_spec(spec)
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
    spec = checked_spec(spec)
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
    spec = checked_spec(spec)
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
    every spec; ``picture`` links the SVG :func:`~colo_fsm.diagram.docs.update_docs` writes at :func:`picture_path`)."""
    spec = checked_spec(spec)
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


__all__ = [
    "actions_table",
    "docs_sections",
    "facts_table",
    "picture_path",
    "states_table",
    "to_markdown",
    "transitions_table",
]
