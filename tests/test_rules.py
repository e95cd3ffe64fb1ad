"""The lifecycle rules as data: parsing, marks on checks and messages, the invariants and violations keyed by
them, and no reference to a document outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.states.rules import RULES, LifecycleRule, checks, rule_in, rule_of, rules_table
from colo_fsm.testing.checker import check
from colo_fsm.testing.lifecycle_machine import LifecycleMachine

R = LifecycleRule
ROOT = Path(__file__).resolve().parents[1]


def test_every_rule_has_a_heading_and_a_statement() -> None:
    assert [r.number for r in RULES] == list(range(1, len(RULES) + 1))
    for r in RULES:
        assert r.heading and r.statement.endswith(".")
        assert f"`{r.name}`" in rules_table() and r.statement in rules_table()


@pytest.mark.parametrize(
    ("ref", "rule"),
    [
        (R.BUILD_ONCE, R.BUILD_ONCE),
        ("build-once", R.BUILD_ONCE),
        ("PARK_NOT_DRAIN", R.PARK_NOT_DRAIN),
        (2, R.ONE_COMMUNICATOR),
        ("11: uniform model mode", R.UNIFORM_MODEL_MODE),
    ],
)
def test_of_names_a_rule(ref: object, rule: LifecycleRule) -> None:
    assert LifecycleRule.of(ref) is rule  # type: ignore[arg-type]


@pytest.mark.parametrize("ref", ["nope", 0, len(RULES) + 1, True, None, "99: x"])
def test_of_refuses_what_names_no_rule(ref: object) -> None:
    with pytest.raises(ConfigError) as info:
        LifecycleRule.of(ref)  # type: ignore[arg-type]
    assert info.value.field == "rule"


def test_tag_and_rule_in_round_trip() -> None:
    for r in RULES:
        assert rule_in(r.tag("something broke")) is r
        assert rule_in(f"rank 1: {r.tag('x')}") is r
    assert rule_in("deadlock: no rank can move") is None
    assert rule_in("[not-a-rule] x") is None
    assert rule_in(None) is None


def test_checks_marks_the_function_and_its_failure() -> None:
    @checks(R.DECIDE_ONCE)
    def prop(ok: bool) -> None:
        """Doc."""
        assert ok, "two answers"

    assert rule_of(prop) is R.DECIDE_ONCE and prop.__doc__ == "Doc." and prop.__name__ == "prop"
    prop(True)
    with pytest.raises(AssertionError, match=r"^\[decide-once\] two answers"):
        prop(False)
    assert rule_of(lambda: None) is None


def test_the_lifecycle_machine_invariants_are_keyed_by_rule() -> None:
    marked = {name: rule_of(getattr(LifecycleMachine, name)) for name in dir(LifecycleMachine)}
    marked = {k: v for k, v in marked.items() if v is not None}
    assert marked["build_once"] is R.BUILD_ONCE
    assert marked["drain_own_device_then_barrier"] is R.ONE_COMMUNICATOR
    assert marked["checkpoint_suspends_everything"] is R.CHECKPOINT_SUSPENDS
    assert marked["save_decision_reused"] is R.DECIDE_ONCE
    assert marked["weight_version_once_per_step"] is R.WEIGHT_VERSIONS
    assert marked["in_flight_within_actor_capacity"] is R.BOUNDED_INFLIGHT
    covered = set(marked.values())
    assert set(RULES[:6]) <= covered, f"no invariant checks {sorted(set(RULES[:6]) - covered)}"


def test_checker_violations_name_the_rule() -> None:
    assert check(2).rule is None  # the shipped lifecycle: no violation
    from tests.support.mutants import MUTANTS

    by_name = {m.name: m for m in MUTANTS}
    for name, rule in [
        ("drain-calling-thread-device", R.ONE_COMMUNICATOR),
        ("last-step-wakes", R.CHECKPOINT_SUSPENDS),
        ("weight-version-bumped-twice", R.WEIGHT_VERSIONS),
    ]:
        res = check(2, **by_name[name].checker_kwargs())
        assert not res.ok and res.rule is rule, (name, res.violation)
        assert rule.tag("") in res.report()


# -------------------------------------------------------------------------- no document outside the repository
_OUTSIDE = re.compile(
    "|".join(
        [
            "DES" + r"IGN(\.md)?\b",  # split so this file does not match itself
            r"\b[Ff]act" + r"s? \d",
            r"\bsection \d\b",
            "design" + " brief",
        ]
    )
)
_SCANNED = ("colo_fsm", "tests", "docs", "scripts", "bench", "examples")
_TOP_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")


def test_no_file_refers_to_a_document_outside_the_repository() -> None:
    hits = []
    paths = [ROOT / name for name in _TOP_FILES] + [p for top in _SCANNED for p in sorted((ROOT / top).rglob("*"))]
    for path in paths:
        if path.name not in _TOP_FILES and (
            path.suffix not in {".py", ".md", ".sh", ".toml", ".txt"} or "gpu-runs" in path.parts
        ):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "refer to colo_fsm.states.rules.LifecycleRule instead:\n" + "\n".join(hits)
