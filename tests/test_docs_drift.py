"""docs/lifecycle.md embeds the generated diagram and tables; fail when the docs and the spec drift apart.

Fix a failure with ``colo-fsm diagram --update-docs docs/lifecycle.md`` (and, if a fact, state or lifecycle rule
was added, explain it in the page's prose).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from colo_fsm import diagram
from colo_fsm.states.spec import LIFECYCLE, Fact

DOCS = Path(__file__).resolve().parents[1] / "docs" / "lifecycle.md"
REQUIRED = ("rules", "picture", "mermaid", "states", "transitions", "actions", "facts")
NEMO_DOCS = DOCS.with_name("nemo-rl.md")
NEMO_REQUIRED = tuple(name for name in REQUIRED if name != "rules")  # the rules table lives on lifecycle.md


def test_generated_blocks_match_the_spec() -> None:
    text = DOCS.read_text(encoding="utf-8")
    _, changed, found = diagram.regenerate_docs(text, source=str(DOCS), required=REQUIRED)
    assert set(found) == set(REQUIRED)
    assert changed == (), (
        f"{DOCS} is out of date with colo_fsm/states/spec.py in block(s) {', '.join(changed)}; "
        "run `colo-fsm diagram --update-docs docs/lifecycle.md`"
    )


def test_prose_explains_every_fact_and_state() -> None:
    """The hand-written part of the page names every fact the guards read and every state."""
    text = DOCS.read_text(encoding="utf-8")
    prose = text
    for name in REQUIRED:
        start = prose.index(f"<!-- BEGIN GENERATED: {name} -->")
        end = prose.index(f"<!-- END GENERATED: {name} -->")
        prose = prose[:start] + prose[end:]
    facts_section = prose.split("## The facts the guards read")[1].split("\n## ")[0]
    missing = [f.value for f in Fact if f"`{f.value}`" not in facts_section]
    assert not missing, f"docs/lifecycle.md does not explain fact(s) {missing}"
    for s in LIFECYCLE.states:
        assert s.state.value in prose, f"docs/lifecycle.md prose never mentions {s.state.value}"


def test_drift_is_detected() -> None:
    """The check can fail: the current page is stale against a spec with one transition less."""
    variant = dataclasses.replace(LIFECYCLE, transitions=LIFECYCLE.transitions[:-1])
    _, changed, _ = diagram.regenerate_docs(DOCS.read_text(encoding="utf-8"), variant, required=REQUIRED)
    assert {"mermaid", "transitions"} <= set(changed)


def test_nemo_rl_page_matches_the_preset() -> None:
    """docs/nemo-rl.md holds the NeMo-RL preset's generated diagram and tables, up to date."""
    from colo_fsm.states import NEMO_RL

    text = NEMO_DOCS.read_text(encoding="utf-8")
    _, changed, found = diagram.regenerate_docs(text, NEMO_RL, source=str(NEMO_DOCS), required=NEMO_REQUIRED)
    assert set(found) == set(NEMO_REQUIRED)
    assert changed == (), f"run `colo-fsm diagram --spec nemo_rl --update-docs docs/nemo-rl.md` ({changed})"
    _, stale, _ = diagram.regenerate_docs(text, LIFECYCLE, required=NEMO_REQUIRED)
    assert {"mermaid", "transitions", "facts"} <= set(stale)  # the two specs' pages really differ


def test_no_hand_written_fact_table() -> None:
    """The "Set by" table is generated from the actions' declared effects, not written by hand."""
    text = DOCS.read_text(encoding="utf-8")
    start, end = text.index("<!-- BEGIN GENERATED: facts -->"), text.index("<!-- END GENERATED: facts -->")
    assert text.count("| Fact | Set by |") == 1 and start < text.index("| Fact | Set by |") < end
