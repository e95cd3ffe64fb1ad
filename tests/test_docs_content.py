"""The docs' reference tables stay complete against the code: every error class has a row in operations.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from colo_fsm import errors

ROOT = Path(__file__).resolve().parents[1]


def _section(page: str, name: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    m = re.search(rf"<!-- BEGIN {name} -->(.*?)<!-- END {name} -->", text, re.S)
    assert m, f"{page}: no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' section"
    return m.group(1)


def _first_column(table: str) -> list[str]:
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", ln).group(1) for ln in rows]  # type: ignore[union-attr]


def test_every_error_has_a_row_in_operations() -> None:
    named = {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.ColoFsmError) and obj.__module__ == errors.__name__
    }
    classes = {obj.__name__ for obj in named.values()}  # an alias (another name for a class) shares its row
    table = _section("docs/operations.md", "ERRORS TABLE")
    aliases = sorted(name for name, obj in named.items() if name != obj.__name__)
    assert all(f"`{a}`" in table for a in aliases), f"docs/operations.md: aliases not named in the table: {aliases}"
    listed = _first_column(table)
    assert len(listed) == len(set(listed)), f"listed twice: {sorted(n for n in listed if listed.count(n) > 1)}"
    missing, stale = classes - set(listed) - {"ColoFsmError"}, set(listed) - classes
    assert not missing, f"docs/operations.md: errors without a row: {sorted(missing)}"
    assert not stale, f"docs/operations.md: rows for errors that do not exist: {sorted(stale)}"


# ---------------------------------------------------------------------------------------------- NeMo-RL mapping
def _nemo_rl_diagram_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nemo_rl_diagram", ROOT / "docs" / "_ext" / "nemo_rl_diagram.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nemo_rl_annotated_diagram_is_generated_from_the_preset() -> None:
    from mermaid_subset import parse_state_diagram

    gen = _nemo_rl_diagram_module()
    page = (ROOT / "docs" / "embedding.md").read_text(encoding="utf-8")
    assert gen.current(page) == gen.block(), (
        "docs/embedding.md: the annotated NeMo-RL diagram is out of date; run python docs/_ext/nemo_rl_diagram.py"
    )
    diagram = parse_state_diagram(gen.annotated_mermaid())
    noted = {state for _, state, _ in diagram.notes}
    assert set(gen.NEMO_RL_CALLS) <= noted


def _mapping_rows() -> list[list[str]]:
    rows = [ln for ln in _section("docs/embedding.md", "NEMO-RL MAPPING").splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in rows[2:]]  # past the header and the rule


def test_nemo_rl_mapping_names_what_the_preset_and_protocols_have() -> None:
    from colo_fsm.adapters.protocols import Collector, GenerationEngine, Trainer
    from colo_fsm.states import NEMO_RL

    triggers = {t.trigger for t in NEMO_RL.transitions}
    actions = {a.name for a in NEMO_RL.actions}
    states = {s.state.value for s in NEMO_RL.states}
    gen = _nemo_rl_diagram_module()
    protocols = {"GenerationEngine": GenerationEngine, "Trainer": Trainer, "Collector": Collector}
    rows = _mapping_rows()
    assert len(rows) >= 15
    problems: list[str] = []
    for nemo, colo, adapter in rows:
        for name in re.findall(r"`([a-z_]+)`", colo):
            if name not in triggers | actions:
                problems.append(f"{name!r} is neither a trigger nor an action of NEMO_RL ({nemo[:40]})")
        for group in re.findall(r"\(([^)]*)\)", colo):
            for word in re.findall(r"\b[A-Z][a-z]+\b", group):
                if word not in states:
                    problems.append(f"{word!r} is not a state of NEMO_RL ({nemo[:40]})")
        for proto, method in re.findall(r"`(GenerationEngine|Trainer|Collector)\.([a-z_]+)\(", adapter):
            cls = protocols[proto]
            if not hasattr(cls, method) and method not in (cls.__doc__ or ""):
                problems.append(f"{proto}.{method} is not part of the {proto} protocol")
    calls = " ".join(nemo for nemo, _, _ in rows)
    for state, notes in gen.NEMO_RL_CALLS.items():  # the diagram's notes name calls the table maps
        for note in notes:
            for call in re.findall(r"([a-z_]+)\(", note):
                if call not in calls and call not in ("get_logprobs",):
                    problems.append(f"diagram note of {state} names {call}(), which the table does not map")
    assert not problems, "\n".join(problems)
