"""Walk a spec symbolically over its declared effects: where a step rests for given decisions.

The testing kit's oracle uses it to know where *your* spec puts a step (the runtime is the one interpreter that
runs adapters; this walk only applies the facts each action declares it sets, clears, decides or upgrades).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping

from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import STOP_TRIGGER, ActionSpec, Fact, LifecycleSpec, Role, State, TransitionSpec


def stop_upgrades(a: ActionSpec, facts: Mapping[Fact, bool], *, save_on_stop: bool = True) -> tuple[Fact, ...]:
    """The facts an early stop that said stop upgrades: every declared one, but ``save_this_step`` only over a
    trained step (before the first step there is nothing new to save) and only when the run saves on an early
    stop (it checkpoints, or asked to). The runtime, this walk and the checker all read it from here."""
    return tuple(
        f
        for f in a.upgrades
        if f is not Fact.SAVE_THIS_STEP or (save_on_stop and bool(facts.get(Fact.STEP_TRAINED, False)))
    )


def apply_effects(
    spec: LifecycleSpec,
    t: TransitionSpec,
    facts: dict[Fact, bool],
    decisions: Mapping[Fact, bool],
    *,
    save_on_stop: bool = True,
) -> None:
    """Apply the declared fact effects of ``t``'s actions to ``facts`` (latches read ``decisions``).

    ``save_on_stop=False``: an early stop upgrades its step to the last one but not to a save (a run that does
    not checkpoint, unless it asks for a save on early stop)."""
    for name in t.actions:
        a = spec.action(name)
        if a.issues is not None:
            facts[Fact.HANDOFF_COMPLETE] = False
        if a.role in (Role.LATCH, Role.LATCH_STOP):
            for f in a.decides:
                facts[f] = bool(decisions.get(f, False))
            if a.role is Role.LATCH_STOP and any(facts[f] for f in a.decides):
                for f in stop_upgrades(a, facts, save_on_stop=save_on_stop):
                    facts[f] = True
        for f in a.cleared():
            facts[f] = False
        for f in a.sets:
            facts[f] = True


def reachable(spec: LifecycleSpec, *, limit: int = 200_000) -> Iterator[tuple[State, frozenset[Fact]]]:
    """Every (state, facts that hold) a run of ``spec`` reaches, every latch deciding either way and an early stop
    saving or not; from each, the automatic transition the machine takes, else every user trigger enabled.

    Cheap: one walk over (state, facts) pairs on the declared effects, no ranks and no interleavings."""
    start = (spec.initial, frozenset[Fact]())
    seen = {start}
    queue = deque([start])
    while queue:
        state, true = queue.popleft()
        yield state, true
        facts = {f: f in true for f in Fact}
        enabled = [t for t in spec.outgoing(state) if t.enabled(facts)]
        auto = [t for t in enabled if t.automatic]
        for t in auto[:1] if auto else enabled:
            latches = [spec.action(n) for n in t.actions if spec.action(n).role in (Role.LATCH, Role.LATCH_STOP)]
            decided = tuple(dict.fromkeys(f for a in latches for f in a.decides))
            stops = any(spec.action(n).role is Role.LATCH_STOP for n in t.actions)
            for values in itertools.product((False, True), repeat=len(decided)):
                for save_on_stop in (True, False) if stops else (True,):
                    nxt = dict(facts)
                    apply_effects(spec, t, nxt, dict(zip(decided, values)), save_on_stop=save_on_stop)
                    key = (t.dest, frozenset(f for f, v in nxt.items() if v))
                    if key not in seen:
                        seen.add(key)
                        queue.append(key)
        if len(seen) > limit:
            return


def _facts_text(true: frozenset[Fact]) -> str:
    return ", ".join(sorted(f.value for f in true)) or "none"


def find_stuck(spec: LifecycleSpec, *, limit: int = 200_000) -> str | None:
    """The first place ``spec`` gets stuck, or None: a non-final state that some run reaches (:func:`reachable`)
    with facts under which no transition but a ``stop`` can leave it."""
    for state, true in reachable(spec, limit=limit):
        facts = {f: f in true for f in Fact}
        moves = [t for t in spec.outgoing(state) if t.trigger != STOP_TRIGGER and t.enabled(facts)]
        if not spec.state(state).final and not moves:
            return f"stuck in {state.value}: no transition enabled (facts: {_facts_text(true)})"
    return None


def find_unstoppable(spec: LifecycleSpec, *, limit: int = 200_000) -> str | None:
    """The first place a run of ``spec`` cannot be stopped from, or None: a non-terminal state some run reaches
    (the failed state too) with facts under which no ``stop`` leads into a terminal state."""
    places = list(reachable(spec, limit=limit))
    if any(s.state == spec.failed for s in spec.states):
        places.append((spec.failed, frozenset()))
    for state, true in places:
        if spec.state(state).terminal:
            continue
        t = spec.select(state, STOP_TRIGGER, {f: f in true for f in Fact})
        if t is None or not spec.state(t.dest).terminal:
            why = "no stop is enabled" if t is None else f"stop leads to {t.dest.value}, not a terminal state"
            return f"{state.value} (facts: {_facts_text(true)}): {why}"
    return None


def step_path(
    spec: LifecycleSpec,
    decisions: Mapping[Fact, bool],
    *,
    through_validation: bool = False,
    save_on_stop: bool = True,
    max_transitions: int = 100,
) -> list[TransitionSpec]:
    """The transitions a training step takes: ``begin_step`` and ``train`` from the state that begins steps,
    every automatic transition after each, and (``through_validation``) ``end_validation`` from every
    validation-only state it rests in."""
    begin = next((t for t in spec.transitions if t.trigger == "begin_step"), None)
    if begin is None:
        raise ConfigError("spec", spec.name, "a spec with a begin_step transition")
    facts: dict[Fact, bool] = dict.fromkeys(Fact, False)
    facts[Fact.ENGINE_BUILT] = True
    state = begin.source
    path: list[TransitionSpec] = []

    def take(t: TransitionSpec | None) -> None:
        nonlocal state
        while t is not None:
            if len(path) >= max_transitions:
                raise ConfigError("spec", spec.name, "a step that ends (the walk went round in circles)")
            apply_effects(spec, t, facts, decisions, save_on_stop=save_on_stop)
            path.append(t)
            state = t.dest
            t = next((x for x in spec.outgoing(state) if x.automatic and x.enabled(facts)), None)

    for trigger in ("begin_step", "train"):
        t = spec.select(state, trigger, facts)
        if t is None:
            return path
        take(t)
    while through_validation and spec.state(state).validates:
        t = spec.select(state, "end_validation", facts)
        if t is None:
            break
        take(t)
    return path


def walk_step(
    spec: LifecycleSpec,
    decisions: Mapping[Fact, bool],
    *,
    through_validation: bool = False,
    save_on_stop: bool = True,
    max_transitions: int = 100,
) -> State:
    """The state a training step rests in (the destination of :func:`step_path`'s last transition)."""
    path = step_path(
        spec,
        decisions,
        through_validation=through_validation,
        save_on_stop=save_on_stop,
        max_transitions=max_transitions,
    )
    if path:
        return path[-1].dest
    begin = next(t for t in spec.transitions if t.trigger == "begin_step")
    return begin.source


def path_text(path: list[TransitionSpec]) -> str:
    """``Generating -> Draining -> Training -> Waking -> Generating`` (empty: no transition)."""
    return " -> ".join([path[0].source.value, *(t.dest.value for t in path)]) if path else "(no transition)"


def last_step_validates(spec: LifecycleSpec) -> bool:
    """Whether ``spec``'s last step can wake the engine for validation (what ``val_at_end`` needs): a step latched
    validate-and-last rests in a validation-only state, walked over the declared effects."""
    decisions = {Fact.VALIDATE_THIS_STEP: True, Fact.LAST_STEP: True}
    try:
        return any(
            spec.state(walk_step(spec, {**decisions, Fact.SAVE_THIS_STEP: save})).validates for save in (False, True)
        )
    except ConfigError:
        return False


__all__ = [
    "apply_effects",
    "find_stuck",
    "find_unstoppable",
    "last_step_validates",
    "path_text",
    "reachable",
    "step_path",
    "stop_upgrades",
    "walk_step",
]
