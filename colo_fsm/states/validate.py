"""Static checks of a :class:`~colo_fsm.states.spec.LifecycleSpec`: the facts that can be read off the data.

The runtime machine refuses to build on a spec that fails these; the exhaustive checker
(:mod:`colo_fsm.testing.checker`) proves the cross-rank facts that need interleavings.
"""

from __future__ import annotations

import itertools
from collections import deque

from colo_fsm.errors import SpecError
from colo_fsm.states.spec import CollectorCondition, EngineCondition, Fact, LifecycleSpec, State


def _fact_assignments() -> list[dict[Fact, bool]]:
    facts = list(Fact)
    return [dict(zip(facts, values)) for values in itertools.product((False, True), repeat=len(facts))]


def validate_spec(spec: LifecycleSpec) -> None:
    """Raise :class:`SpecError` on the first structural rule ``spec`` breaks.

    Rules: actions and states exist; every state is reachable; nothing enters the initial state;
    ``build_engine`` runs only when leaving the initial state, ``shutdown_engine`` only on the way into a
    terminal state; every ``barrier`` directly follows a ``drain_device`` with no collective-issuing action
    between; for each state and trigger at most one transition is enabled under any facts; and each
    transition's actions take the source state's declared engine/collector condition to the destination's.
    """
    names = {a.name for a in spec.actions}
    declared = {s.state for s in spec.states}
    for t in spec.transitions:
        where = f"{t.trigger}: {t.source.value} -> {t.dest.value}"
        if t.source not in declared or t.dest not in declared:
            raise SpecError(where, "source and destination are declared states")
        for a in t.actions:
            if a not in names:
                raise SpecError(where, f"action {a!r} is declared in spec.actions")
        if t.dest == spec.initial:
            raise SpecError(where, f"no transition re-enters {spec.initial.value} (the engine is built once)")
        if "build_engine" in t.actions and t.source != spec.initial:
            raise SpecError(where, f"build_engine only on transitions leaving {spec.initial.value}")
        if "shutdown_engine" in t.actions and not spec.state(t.dest).terminal:
            raise SpecError(where, "shutdown_engine only on transitions into a terminal state (Stopped)")
        _check_handoff_order(spec, t.actions, where)
        _check_conditions(spec, t, where)
    _check_reachable(spec)
    _check_deterministic(spec)


def _check_handoff_order(spec: LifecycleSpec, actions: tuple[str, ...], where: str) -> None:
    drained = False
    for a in actions:
        if a == "drain_device":
            drained = True
        elif a == "barrier":
            if not drained:
                raise SpecError(where, "every barrier directly follows drain_device (drain own device first)")
            drained = False
        elif spec.action(a).issues is not None:
            drained = False


def _check_conditions(spec: LifecycleSpec, t, where: str) -> None:  # type: ignore[no-untyped-def]
    src, dst = spec.state(t.source), spec.state(t.dest)
    engine, collector = src.engine, src.collector
    for a in t.actions:
        act = spec.action(a)
        engine = act.engine or engine
        collector = act.collector or collector
    if (
        dst.engine is not EngineCondition.UNKNOWN
        and engine is not dst.engine
        and src.engine is not EngineCondition.UNKNOWN
    ):
        raise SpecError(
            where, f"actions leave the engine {engine.value}; {dst.state.value} declares {dst.engine.value}"
        )
    if (
        dst.collector is not CollectorCondition.UNKNOWN
        and collector is not dst.collector
        and src.collector is not CollectorCondition.UNKNOWN
    ):
        raise SpecError(
            where, f"actions leave the collector {collector.value}; {dst.state.value} declares {dst.collector.value}"
        )


def _check_reachable(spec: LifecycleSpec) -> None:
    seen = {spec.initial}
    queue = deque([spec.initial])
    while queue:
        s = queue.popleft()
        for t in spec.outgoing(s):
            if t.dest not in seen:
                seen.add(t.dest)
                queue.append(t.dest)
    missing = [s.state.value for s in spec.states if s.state not in seen and s.state != spec.failed]
    if missing:
        raise SpecError("states", f"every state reachable from {spec.initial.value}; unreachable: {missing}")


def _check_deterministic(spec: LifecycleSpec) -> None:
    assignments = _fact_assignments()
    for state in State:
        if state not in {s.state for s in spec.states}:
            continue
        for trigger in spec.triggers(state):
            candidates = [t for t in spec.outgoing(state) if t.trigger == trigger]
            for facts in assignments:
                enabled = [t for t in candidates if t.enabled(facts)]
                if len(enabled) > 1:
                    dests = ", ".join(t.dest.value for t in enabled)
                    on = ", ".join(f.value for f, v in facts.items() if v) or "no facts"
                    raise SpecError(
                        f"{trigger} from {state.value}",
                        f"at most one enabled transition; with {on} it could go to {dests}",
                    )


__all__ = ["SpecError", "validate_spec"]
