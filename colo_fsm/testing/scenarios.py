"""The runs every checked rank executes: the latched decisions of each step (:class:`StepPlan`), by scenario.

Shared by the exhaustive checker (:mod:`colo_fsm.testing.checker`) and anything that drives the lifecycle
through the same steps (the project's mutation proof and fault injection), so none of them imports another.
A spec whose latches decide more facts (validation at start, early stop) gets the matching
:data:`EXTRA_SCENARIOS` too (:func:`scenarios_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

from colo_fsm.states.spec import Fact, LifecycleSpec


@dataclass(frozen=True)
class StepPlan:
    """The latched decisions of one step (``early_stop``: the early-stop latch after validation says stop)."""

    save: bool = False
    validate: bool = False
    early_stop: bool = False

    def label(self) -> str:
        parts = (("save", self.save), ("validate", self.validate), ("early-stop", self.early_stop))
        return "+".join(k for k, v in parts if v) or "plain"


SCENARIOS: dict[str, tuple[StepPlan, ...]] = {
    # plain, checkpoint, validate, checkpoint+validate, then a plain last step
    "all-step-kinds": (StepPlan(), StepPlan(save=True), StepPlan(validate=True), StepPlan(True, True), StepPlan()),
    "last-step-saves": (StepPlan(), StepPlan(save=True, validate=True)),
    "last-step-validates": (StepPlan(validate=True),),
}
"""Runs every rank executes; the last step of each is the run's last."""

EXTRA_SCENARIOS: dict[Fact, dict[str, tuple[StepPlan, ...]]] = {
    Fact.VALIDATE_AT_START: {
        "val-at-start": (StepPlan(), StepPlan(save=True, validate=True), StepPlan(validate=True)),
    },
    Fact.STOP_EARLY: {
        "early-stop": (StepPlan(validate=True), StepPlan(validate=True, early_stop=True), StepPlan(), StepPlan()),
        "early-stop-saving": (StepPlan(save=True, validate=True, early_stop=True), StepPlan()),
        "early-stop-at-start": (StepPlan(validate=True), StepPlan()),  # stops before its first step
    },
}
"""Scenarios added for a spec whose latches decide these facts (validation at start, early stop)."""

VAL_AT_START_SCENARIOS = frozenset({"val-at-start", "early-stop-at-start"})
"""Scenarios that validate at start."""

STOP_AT_START_SCENARIOS = frozenset({"early-stop-at-start"})
"""Scenarios whose validation at start decides an early stop (no step runs)."""


def scenarios_for(spec: LifecycleSpec) -> dict[str, tuple[StepPlan, ...]]:
    """:data:`SCENARIOS` plus the :data:`EXTRA_SCENARIOS` of every fact ``spec``'s latches decide."""
    decided = {f for a in spec.actions for f in a.decides}
    out = dict(SCENARIOS)
    for fact, extra in EXTRA_SCENARIOS.items():
        if fact in decided:
            out.update(
                (k, v) for k, v in extra.items() if k not in VAL_AT_START_SCENARIOS or Fact.VALIDATE_AT_START in decided
            )
    return out


__all__ = [
    "EXTRA_SCENARIOS",
    "SCENARIOS",
    "STOP_AT_START_SCENARIOS",
    "VAL_AT_START_SCENARIOS",
    "StepPlan",
    "scenarios_for",
]
