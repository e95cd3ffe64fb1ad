"""The runs every checked rank executes: the latched decisions of each step (:class:`StepPlan`), by scenario.

Shared by the exhaustive checker (:mod:`colo_fsm.testing.checker`) and anything that drives the lifecycle
through the same steps (the project's mutation proof and fault injection), so none of them imports another.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    """The latched decisions of one step."""

    save: bool = False
    validate: bool = False

    def label(self) -> str:
        return "+".join(k for k, v in (("save", self.save), ("validate", self.validate)) if v) or "plain"


SCENARIOS: dict[str, tuple[StepPlan, ...]] = {
    # plain, checkpoint, validate, checkpoint+validate, then a plain last step
    "all-step-kinds": (StepPlan(), StepPlan(save=True), StepPlan(validate=True), StepPlan(True, True), StepPlan()),
    "last-step-saves": (StepPlan(), StepPlan(save=True, validate=True)),
    "last-step-validates": (StepPlan(validate=True),),
}
"""Runs every rank executes; the last step of each is the run's last."""

__all__ = ["SCENARIOS", "StepPlan"]
