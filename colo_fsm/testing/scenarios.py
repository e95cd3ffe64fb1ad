"""The runs every checked rank executes: the latched decisions of each step (:class:`StepPlan`), by scenario.

Shared by the exhaustive checker (:mod:`colo_fsm.testing.checker`) and anything that drives the lifecycle
through the same steps (the project's mutation proof and fault injection), so none of them imports another.
A spec whose latches decide more facts (validation at start, early stop) gets the matching
:data:`EXTRA_SCENARIOS` too (:func:`scenarios_for`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from colo_fsm.states.spec import STOP_TRIGGER, Fact, LifecycleSpec, State
from colo_fsm.states.walk import apply_effects


@dataclass(frozen=True)
class StepPlan:
    """The latched decisions of one step (``early_stop``: the early-stop latch after validation says stop);
    ``stop_in``: the loop stops the run (``stop``) the first time this step reaches that state (the first step's
    also covers the start), as a loop that raised there does."""

    save: bool = False
    validate: bool = False
    early_stop: bool = False
    stop_in: State | None = None

    def label(self) -> str:
        parts = (("save", self.save), ("validate", self.validate), ("early-stop", self.early_stop))
        text = "+".join(k for k, v in parts if v) or "plain"
        return f"{text}, stopped in {self.stop_in.value}" if self.stop_in is not None else text


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


_FIRST_STEPS: tuple[StepPlan, ...] = (StepPlan(), StepPlan(save=True), StepPlan(validate=True), StepPlan(True, True))


def stop_scenarios(spec: LifecycleSpec) -> dict[str, tuple[StepPlan, ...]]:
    """``stop-in-<state>``: for every non-final state ``spec`` declares a stop from, the shortest run that reaches
    it (a first step that is plain, saves, validates or both, then a plain last step), stopped the first time it
    does."""
    stops = {t.source for t in spec.transitions if t.trigger == STOP_TRIGGER}
    runs = [(first, StepPlan()) for first in _FIRST_STEPS]
    visits = [visited_states(spec, run) for run in runs]
    out: dict[str, tuple[StepPlan, ...]] = {}
    for s in spec.states:
        if s.final or s.state not in stops:
            continue
        found = [(v[s.state], k) for k, v in enumerate(visits) if s.state in v]
        if not found:
            continue
        step, k = min(found)
        at = max(step, 0)
        out[f"stop-in-{s.state.value.lower()}"] = tuple(
            dataclasses.replace(p, stop_in=s.state) if i == at else p for i, p in enumerate(runs[k])
        )
    return out


def scenarios_for(spec: LifecycleSpec) -> dict[str, tuple[StepPlan, ...]]:
    """:data:`SCENARIOS` plus the :data:`EXTRA_SCENARIOS` of every fact ``spec``'s latches decide, plus a
    ``stop-in-<state>`` scenario for every state a short run visits (:func:`stop_scenarios`)."""
    decided = {f for a in spec.actions for f in a.decides}
    out = dict(SCENARIOS)
    for fact, extra in EXTRA_SCENARIOS.items():
        if fact in decided:
            out.update(
                (k, v) for k, v in extra.items() if k not in VAL_AT_START_SCENARIOS or Fact.VALIDATE_AT_START in decided
            )
    out.update(stop_scenarios(spec))
    return out


def visited_states(spec: LifecycleSpec, steps: tuple[StepPlan, ...]) -> dict[State, int]:
    """The states a run of ``steps`` passes through (walked over the declared effects), each with the step in
    which it first does (-1: during the start); the run's last step is the last of ``steps``."""
    facts: dict[Fact, bool] = dict.fromkeys(Fact, False)
    visits: dict[State, int] = {spec.initial: -1}
    state, step = spec.initial, -1

    def fire(trigger: str, decisions: dict[Fact, bool]) -> bool:
        nonlocal state
        t = spec.select(state, trigger, facts)
        fired = t is not None
        while t is not None:
            apply_effects(spec, t, facts, decisions)
            state = t.dest
            visits.setdefault(state, step)
            t = next((x for x in spec.outgoing(state) if x.automatic and x.enabled(facts)), None)
        return fired

    def validations(decisions: dict[Fact, bool]) -> None:
        for _ in range(4):
            if not spec.state(state).validates or not fire("end_validation", decisions):
                return

    fire("start", {})
    validations({})
    for i, p in enumerate(steps):
        if spec.state(state).final:
            break
        step = i
        decisions = {
            Fact.SAVE_THIS_STEP: p.save,
            Fact.VALIDATE_THIS_STEP: p.validate,
            Fact.LAST_STEP: i == len(steps) - 1,
            Fact.STOP_EARLY: p.early_stop,
        }
        if fire("begin_step", decisions) and fire("train", decisions):
            validations(decisions)
    return visits


__all__ = [
    "EXTRA_SCENARIOS",
    "SCENARIOS",
    "STOP_AT_START_SCENARIOS",
    "VAL_AT_START_SCENARIOS",
    "StepPlan",
    "scenarios_for",
    "stop_scenarios",
    "visited_states",
]
