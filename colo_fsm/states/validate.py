"""Static checks of a :class:`~colo_fsm.states.spec.LifecycleSpec`: the facts that can be read off the data.

The runtime machine refuses to build on a spec that fails these; the exhaustive checker
(:mod:`colo_fsm.testing.checker`) proves the cross-rank facts that need interleavings.
"""

from __future__ import annotations

import itertools
from collections import deque

from colo_fsm.errors import SpecError
from colo_fsm.states.rules import LifecycleRule
from colo_fsm.states.spec import (
    STEP_WORK,
    STOP_TRIGGER,
    USER_TRIGGERS,
    Collective,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    RequestCondition,
    Role,
    State,
    TransitionSpec,
)
from colo_fsm.states.walk import find_stuck, find_unstoppable

_REQUESTS_FOR_ENGINE = {
    EngineCondition.ABSENT: RequestCondition.NONE,
    EngineCondition.TORN_DOWN: RequestCondition.NONE,
    EngineCondition.AWAKE: RequestCondition.RUNNING,
    EngineCondition.SUSPENDED: RequestCondition.PARKED,
    EngineCondition.UNKNOWN: RequestCondition.UNKNOWN,
}


def _fact_assignments() -> list[dict[Fact, bool]]:
    facts = list(Fact)
    return [dict(zip(facts, values)) for values in itertools.product((False, True), repeat=len(facts))]


def validate_spec(spec: LifecycleSpec) -> None:
    """Raise :class:`SpecError` on the first structural rule ``spec`` breaks.

    Rules: actions and states exist and every action has a role; every state is reachable; nothing enters the
    initial state; the build runs only when leaving the initial state, the teardown only on the way into a
    terminal state; every barrier directly follows a drain with no collective-issuing action between; for each
    state and trigger at most one transition is enabled under any facts; each transition's actions take the
    source state's declared engine/collector/request conditions to the destination's; every fact a guard reads
    is set by some action; on every path, work of one kind starts only after the previous kind was drained and
    met at a barrier (so a validation-only wake is drained, barriered and suspended before a save); an async
    save is finalized before any wake and before the run ends; an early stop upgrades its step to save-and-stop;
    requests are served only in resting states with the engine awake; no non-final state a run can reach gets
    stuck (no transition but a stop enabled under the facts it is reached with); a run can be stopped from every
    state it reaches (and from the failed state), and a stop runs none of a step's work; every state, action and
    transition is declared once.
    """
    check_names(spec)
    names = {a.name for a in spec.actions}
    declared = {s.state for s in spec.states}
    for a in spec.actions:
        if a.role is None:
            raise SpecError(f"action {a.name}", f"every action declares its Role (one of {', '.join(Role)})")
        if a.role is Role.LATCH_STOP and not {Fact.SAVE_THIS_STEP, Fact.LAST_STEP} <= set(a.upgrades):
            raise SpecError(
                f"action {a.name}",
                f"[{LifecycleRule.STEP_ORDER_IS_DATA}] an early stop upgrades its step to save-and-stop "
                "(upgrades save_this_step and last_step)",
            )
    for s in spec.states:
        if s.requests is not _REQUESTS_FOR_ENGINE[s.engine]:
            raise SpecError(
                f"state {s.state.value}",
                f"[{LifecycleRule.PARK_NOT_DRAIN}] requests {s.requests.value} with the engine {s.engine.value} "
                f"(expected {_REQUESTS_FOR_ENGINE[s.engine].value})",
            )
        if s.serves_requests and not (s.resting and s.engine is EngineCondition.AWAKE):
            raise SpecError(
                f"state {s.state.value}", "requests are served only in resting states with the engine awake"
            )
    written = {f for act in spec.actions for f in act.writes()}
    for t in spec.transitions:
        where = f"{t.trigger}: {t.source.value} -> {t.dest.value}"
        if t.source not in declared or t.dest not in declared:
            raise SpecError(where, "source and destination are declared states")
        for name in t.actions:
            if name not in names:
                raise SpecError(where, f"action {name!r} is declared in spec.actions")
        if t.dest == spec.initial:
            raise SpecError(where, f"no transition re-enters {spec.initial.value} (the engine is built once)")
        roles = {spec.action(a).role: a for a in t.actions}
        for role in (Role.BUILD, Role.ADOPT):
            if role in roles and t.source != spec.initial:
                raise SpecError(where, f"{roles[role]} only on transitions leaving {spec.initial.value}")
        up = spec.engine_up_at_construction
        wrong = Role.BUILD if up else Role.ADOPT
        if wrong in roles:
            said = "awake (up at construction: adopt it)" if up else "absent (built by start)"
            raise SpecError(where, f"{roles[wrong]}: {spec.initial.value} declares the engine {said}")
        if Role.TEARDOWN in roles and not spec.state(t.dest).terminal:
            raise SpecError(where, f"{roles[Role.TEARDOWN]} only on transitions into a terminal state (Stopped)")
        step_work = [a for a in t.actions if spec.action(a).role in STEP_WORK]
        if t.trigger == STOP_TRIGGER and step_work:
            raise SpecError(
                where,
                f"a stop abandons the step in progress: it trains, saves and wakes nothing ({', '.join(step_work)}; "
                "an async save already started is finalized)",
            )
        _check_handoff_order(spec, t.actions, where)
        _check_conditions(spec, t, where)
        for f in (*t.when, *t.unless):
            if f not in written:
                raise SpecError(
                    where, f"the guard reads {f.value}, which no action sets (declare it in an action's sets)"
                )
    _check_reachable(spec)
    _check_deterministic(spec)
    _check_paths(spec)
    stuck = find_stuck(spec)
    if stuck is not None:
        raise SpecError(
            f"spec {spec.name}", f"every non-final state has a way out under every reachable facts; {stuck}"
        )
    unstoppable = find_unstoppable(spec)
    if unstoppable is not None:
        raise SpecError(
            f"spec {spec.name}",
            f"[{LifecycleRule.BUILD_ONCE}] a way to stop from every state (a stop into a terminal state, which tears "
            f"the engine down); {unstoppable}: lc.stop() there raises and the engine is never torn down "
            "(colo_fsm.states.spec.with_stops(spec) derives the missing stops)",
        )


def _where(t: TransitionSpec) -> str:
    """``trigger: Source -> Dest``, readable whatever the fields hold (a typo is named, not crashed on)."""

    def name(x: object) -> str:
        return x.value if isinstance(x, State) else repr(x)

    return f"{t.trigger if isinstance(t.trigger, str) else repr(t.trigger)}: {name(t.source)} -> {name(t.dest)}"


def check_names(spec: LifecycleSpec) -> None:
    """Raise :class:`SpecError` naming the transition when a source, destination, trigger, guard fact or action
    is not one the spec declares (the checks every tool runs before it reads the spec)."""
    declared = {s.state for s in spec.states if isinstance(s.state, State)}
    for s in spec.states:
        if not isinstance(s.state, State):
            raise SpecError(f"state {s.state!r}", f"a colo_fsm.states.State (one of {', '.join(State)})")
    names = {a.name for a in spec.actions}
    for t in spec.transitions:
        where = _where(t)
        for field_name, value in (("source", t.source), ("destination", t.dest)):
            if not isinstance(value, State) or value not in declared:
                hint = (
                    f" (write State.{State(value).name})"
                    if value in set(State) and not isinstance(value, State)
                    else ""
                )
                shown = value.value if isinstance(value, State) else repr(value)
                raise SpecError(
                    where, f"the {field_name} {shown} is one of the spec's states ({', '.join(sorted(declared))}){hint}"
                )
        if not isinstance(t.trigger, str) or not t.trigger.isidentifier():
            raise SpecError(where, f"the trigger {t.trigger!r} is a name (a Python identifier)")
        if t.trigger == spec.fail_trigger:
            raise SpecError(where, f"the trigger {t.trigger!r} is not the fail trigger (the machine fires it itself)")
        if not t.automatic and t.trigger not in USER_TRIGGERS:
            raise SpecError(
                where,
                f"the trigger {t.trigger!r} is one the training loop fires ({', '.join(USER_TRIGGERS)}), or the "
                "transition is automatic=True",
            )
        for f in (*t.when, *t.unless):
            if not isinstance(f, Fact):
                raise SpecError(where, f"the guard {f!r} is a colo_fsm.states.Fact (one of {', '.join(Fact)})")
        for a in t.actions:
            if a not in names:
                raise SpecError(where, f"action {a!r} is declared in spec.actions")
    _check_duplicates(spec)


def _check_duplicates(spec: LifecycleSpec) -> None:
    """Every state, action and transition declared once (a later declaration would silently replace or shadow
    the earlier one)."""
    for kind, names in (("state", [s.state.value for s in spec.states]), ("action", [a.name for a in spec.actions])):
        for name in dict.fromkeys(names):
            if names.count(name) > 1:
                raise SpecError(
                    f"{kind} {name}",
                    f"each {kind} declared once (it is declared {names.count(name)} times: a duplicate)",
                )
    seen: dict[tuple[str, State, frozenset[Fact], frozenset[Fact]], int] = {}
    for i, t in enumerate(spec.transitions, 1):
        key = (t.trigger, t.source, frozenset(t.when), frozenset(t.unless))
        if key in seen:
            j = seen[key]
            other = spec.transitions[j - 1]
            what = (
                "an exact duplicate"
                if other == t
                else f"a duplicate (the same trigger, source and guards, to {other.dest.value} and {t.dest.value})"
            )
            raise SpecError(_where(t), f"each transition declared once: #{i} is {what} of #{j}; remove one")
        seen[key] = i


_PathState = tuple[State, Collective | None, bool, bool, bool]  # state, last kind, handed off, drained, save pending


def _check_paths(spec: LifecycleSpec) -> None:
    """Walk every path (guards ignored, but those reading save_pending honoured) tracking device work."""
    start: _PathState = (spec.initial, None, True, True, False)
    seen = {start}
    queue = deque([start])
    while queue:
        state, last, handed, drained, pending = queue.popleft()
        for t in spec.outgoing(state):
            if (Fact.SAVE_PENDING in t.when and not pending) or (Fact.SAVE_PENDING in t.unless and pending):
                continue
            where = f"{t.trigger}: {t.source.value} -> {t.dest.value}"
            cur_last, cur_handed, cur_drained, cur_pending = last, handed, drained, pending
            for name in t.actions:
                a = spec.action(name)
                kind = a.issues
                if kind is not None:
                    if kind is Collective.DECODE and cur_pending:
                        raise SpecError(
                            f"{where} · {name}",
                            f"[{LifecycleRule.CHECKPOINT_SUSPENDS}] the async save is finalized (every checkpoint "
                            "collective done) before any wake: this path skips the finalize",
                        )
                    if cur_last is not None and cur_last is not kind and not cur_handed:
                        hint = (
                            " (a validation-only wake is drained, barriered and suspended before the first "
                            "checkpoint collective)"
                            if cur_last is Collective.DECODE and kind is Collective.CHECKPOINT
                            else ""
                        )
                        raise SpecError(
                            f"{where} · {name}",
                            f"[{LifecycleRule.ONE_COMMUNICATOR}] {kind.value} work starts after {cur_last.value} "
                            f"work with no drain + barrier in between{hint}",
                        )
                    cur_last, cur_handed, cur_drained = kind, False, False
                if a.role is Role.DRAIN:
                    cur_drained = True
                elif a.role is Role.BARRIER:
                    cur_handed = cur_handed or cur_drained
                if Fact.SAVE_PENDING in a.writes():
                    cur_pending = True
                if Fact.SAVE_PENDING in a.cleared():
                    cur_pending = False
            if cur_pending and spec.state(t.dest).final:
                raise SpecError(
                    where,
                    f"[{LifecycleRule.CHECKPOINT_SUSPENDS}] the async save is finalized before the run ends: "
                    f"{t.dest.value} is reached with the save pending (the finalize can be skipped)",
                )
            nxt = (t.dest, cur_last, cur_handed, cur_drained, cur_pending)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)


def _check_handoff_order(spec: LifecycleSpec, actions: tuple[str, ...], where: str) -> None:
    drained = False
    for a in actions:
        role = spec.action(a).role
        if role is Role.DRAIN:
            drained = True
        elif role is Role.BARRIER:
            if not drained:
                raise SpecError(where, f"every barrier ({a}) directly follows a drain (drain own device first)")
            drained = False
        elif spec.action(a).issues is not None:
            drained = False


def _check_conditions(spec: LifecycleSpec, t, where: str) -> None:  # type: ignore[no-untyped-def]
    src, dst = spec.state(t.source), spec.state(t.dest)
    engine, collector, requests = src.engine, src.collector, src.requests
    for a in t.actions:
        act = spec.action(a)
        engine = act.engine or engine
        collector = act.collector or collector
        requests = act.requests or requests
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
    if (
        dst.requests is not RequestCondition.UNKNOWN
        and requests is not dst.requests
        and src.requests is not RequestCondition.UNKNOWN
    ):
        raise SpecError(
            where,
            f"[{LifecycleRule.PARK_NOT_DRAIN}] actions leave the requests {requests.value}; "
            f"{dst.state.value} declares {dst.requests.value}",
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


__all__ = ["SpecError", "check_names", "validate_spec"]
