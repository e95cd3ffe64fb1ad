"""Walk a spec symbolically over its declared effects: where a step rests for given decisions.

The testing kit's oracle uses it to know where *your* spec puts a step (the runtime is the one interpreter that
runs adapters; this walk only applies the facts each action declares it sets, clears, decides or upgrades).
"""

from __future__ import annotations

from collections.abc import Mapping

from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import Fact, LifecycleSpec, Role, State, TransitionSpec


def apply_effects(
    spec: LifecycleSpec, t: TransitionSpec, facts: dict[Fact, bool], decisions: Mapping[Fact, bool]
) -> None:
    """Apply the declared fact effects of ``t``'s actions to ``facts`` (latches read ``decisions``)."""
    for name in t.actions:
        a = spec.action(name)
        if a.issues is not None:
            facts[Fact.HANDOFF_COMPLETE] = False
        if a.role in (Role.LATCH, Role.LATCH_STOP):
            for f in a.decides:
                facts[f] = bool(decisions.get(f, False))
            if a.role is Role.LATCH_STOP and any(facts[f] for f in a.decides):
                for f in a.upgrades:
                    facts[f] = True
        for f in a.cleared():
            facts[f] = False
        for f in a.sets:
            facts[f] = True


def walk_step(
    spec: LifecycleSpec,
    decisions: Mapping[Fact, bool],
    *,
    through_validation: bool = False,
    max_transitions: int = 100,
) -> State:
    """The state a training step rests in: ``begin_step`` and ``train`` from the state that begins steps, every
    automatic transition after each, and (``through_validation``) ``end_validation`` from every validation-only
    state it rests in."""
    begin = next((t for t in spec.transitions if t.trigger == "begin_step"), None)
    if begin is None:
        raise ConfigError("spec", spec.name, "a spec with a begin_step transition")
    facts: dict[Fact, bool] = dict.fromkeys(Fact, False)
    facts[Fact.ENGINE_BUILT] = True
    state = begin.source
    budget = [max_transitions]

    def take(t: TransitionSpec) -> None:
        nonlocal state
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError("spec", spec.name, "a step that ends (the walk went round in circles)")
        apply_effects(spec, t, facts, decisions)
        state = t.dest
        while True:
            auto = [x for x in spec.outgoing(state) if x.automatic and x.enabled(facts)]
            if not auto:
                return
            budget[0] -= 1
            if budget[0] < 0:
                raise ConfigError("spec", spec.name, "a step that ends (the walk went round in circles)")
            apply_effects(spec, auto[0], facts, decisions)
            state = auto[0].dest

    for trigger in ("begin_step", "train"):
        t = spec.select(state, trigger, facts)
        if t is None:
            return state
        take(t)
    while through_validation and spec.state(state).validates:
        t = spec.select(state, "end_validation", facts)
        if t is None:
            break
        take(t)
    return state


__all__ = ["apply_effects", "walk_step"]
