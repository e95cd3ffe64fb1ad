"""Mutation proof: every lifecycle bug, applied on purpose, is caught; each mutant names the rule it breaks.

Each mutant must be killed by the killers recorded in ``Mutant.expected`` (static validator, runtime machine,
exhaustive checker, hypothesis lifecycle machine); ``scripts/mutation_proof.py`` prints the full table.
"""

from __future__ import annotations

import logging

import pytest

from colo_fsm.states.rules import RULES, LifecycleRule, rule_in
from colo_fsm.states.spec import LIFECYCLE
from tests.support.mutants import (
    KILLERS,
    MUTANTS,
    SUITE_MUTANTS,
    Mutant,
    evaluate,
    kill_by_checker,
    kill_by_ranks,
    kill_by_runtime,
    kill_by_suite_test,
    kill_by_validator,
    table,
)
from tests.support.report import record_stats

_RESULTS: dict[str, list[str]] = {}
_NAMES_ITS_RULE = {  # killers whose evidence names the very rule the mutant breaks (the properties killer: always)
    "drain-calling-thread-device": {"checker", "hypothesis"},
    "last-step-wakes": {"checker"},
    "checkpoint-decision-not-latched": {"hypothesis"},
    "in-flight-cap-ignores-actor": {"hypothesis"},
    "engine-serves-while-suspended": {"hypothesis"},
    "engine-serves-while-suspended-nemo": {"hypothesis"},
}


@pytest.fixture(autouse=True)
def _quiet_lifecycle_logs():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def test_the_required_bugs_are_all_there():
    names = {m.name for m in MUTANTS}
    for required in (
        "resume-before-barrier",
        "drain-calling-thread-device",
        "checkpoint-decision-queried-twice",
        "wake-between-train-and-save",
        "teardown-at-validation",
        "weight-version-bumped-twice",
        "weight-version-not-bumped",
        "in-flight-cap-ignores-actor",
    ):
        assert required in names
    assert all(m.expected and m.expected <= set(KILLERS) for m in MUTANTS)
    assert all(isinstance(m.breaks, LifecycleRule) for m in MUTANTS)
    broken = {m.breaks for m in MUTANTS}
    required = set(RULES) - {LifecycleRule.MEMORY_BUDGET}
    assert required <= broken, f"no mutant breaks {sorted(required - broken)}"


def test_the_shipped_lifecycle_survives_every_killer():
    """No false alarms: the unmutated lifecycle passes the validator, the directed runtime run and the checker
    (the hypothesis machine over it is tests/test_lifecycle_property.py)."""
    control = Mutant("control", None, "the shipped lifecycle", spec=LIFECYCLE)
    assert kill_by_validator(control) is None
    assert kill_by_runtime(control) is None
    assert kill_by_checker(control) is None
    assert kill_by_ranks(control) is None


def test_the_nemo_rl_preset_survives_every_killer():
    """No false alarms for the NeMo-RL preset either (validator, directed run with val at start/end, checker)."""
    from colo_fsm.states import NEMO_RL

    control = Mutant("control-nemo", None, "the NeMo-RL preset", spec=NEMO_RL)
    assert kill_by_validator(control) is None
    assert kill_by_runtime(control) is None
    assert kill_by_checker(control) is None


# Mutants the hypothesis killer's drawn programs miss and a directed pass catches: their killer runs the directed
# passes first. The same programs run in either order, each pass derandomized on its own, so a mutant is killed in
# one order exactly when in the other; this only spares running all 600 drawn programs first (20-25 s each on a busy
# 2-core machine). The others keep the drawn programs first: most are caught there sooner than the directed passes
# (200 programs) would run.
_DIRECTED_FIRST = frozenset({"in-flight-cap-ignores-actor", "nemo-early-stop-without-save"})


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed(mutant):
    # the order of the hypothesis killer's passes changes only how soon it stops (the same programs run either way)
    res = evaluate(mutant, killers=sorted(mutant.expected), directed_first=mutant.name in _DIRECTED_FIRST)
    assert not res.missing, f"{mutant.name} survived {res.missing}: {res.killed_by}"
    for killer in _NAMES_ITS_RULE.get(mutant.name, set()) | ({"properties"} & set(res.killed_by)):
        assert rule_in(res.killed_by[killer]) is mutant.breaks, (killer, res.killed_by[killer][:300])
    _RESULTS[mutant.name] = sorted(res.killed_by)
    record_stats("mutants_killed", {"killed": len(_RESULTS), "of": len(MUTANTS), "by": dict(sorted(_RESULTS.items()))})


def test_validator_rejects_exactly_the_mutants_it_should():
    """Mutants whose expected killers exclude the validator pass it: proof that the other killers are needed."""
    for m in MUTANTS:
        rejected = kill_by_validator(m) is not None
        assert rejected == ("validator" in m.expected), m.name


@pytest.mark.slow
# every killer on every mutant: 313-332 s on 2 cores (docs/self-proof.md), past the suite's 300 s per test
@pytest.mark.timeout(1200)
def test_full_mutation_table():
    results = [evaluate(m) for m in MUTANTS]
    print(table(results))
    assert all(r.killed and not r.missing for r in results)
    record_stats("mutation_table", {r.name: sorted(r.killed_by) for r in results})


_SUITE_FAST = ["rollout-stamped-with-its-end-version", "find-stuck-walks-only-false-latches"]


@pytest.mark.parametrize("name", _SUITE_FAST)
def test_suite_mutant_is_killed(name):
    """The default-suite test named by the mutant fails by an assertion once its component is the mutant."""
    evidence = kill_by_suite_test(name)
    assert evidence is not None, f"{name} survived {SUITE_MUTANTS[name].test}"
    print(f"{name}: {evidence}")


@pytest.mark.slow  # one start of three gloo ranks per mutant (tests/support/three_ranks.py)
@pytest.mark.parametrize(
    "name",
    ["barrier-deadline-restarts-per-wait", "sigterm-not-agreed-across-ranks", "lockstep-follower-plans-its-own-step"],
)
def test_three_rank_mutant_is_killed(name):
    evidence = kill_by_suite_test(name)
    assert evidence is not None, f"{name} survived {SUITE_MUTANTS[name].test}"
    print(f"{name}: {evidence}")
