"""One rank's program: the transitions a lifecycle spec selects for a run, flattened into the actions a rank runs.

:func:`plan_program` walks the spec as the runtime would, with the latched decisions a list of
:class:`~colo_fsm.testing.scenarios.StepPlan` gives, and notes every problem a single rank can show on its own
(a second build, training with the engine awake, a bump missing, ...). The exhaustive checker
(:mod:`colo_fsm.testing.checker`) then interleaves N ranks' programs to find what needs several ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from colo_fsm.states.rules import LifecycleRule
from colo_fsm.states.spec import (
    STEP_WORK,
    STOP_TRIGGER,
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
from colo_fsm.states.walk import stop_upgrades
from colo_fsm.testing.scenarios import StepPlan

R = LifecycleRule


@dataclass(frozen=True)
class Op:
    """One action of one transition in a rank's program."""

    index: int
    transition: TransitionSpec
    action: str
    issues: Collective | None
    step: int | None
    role: Role | None = None
    pending: int = 0  # +1: starts a save that runs on in the background; -1: finalizes it

    def label(self) -> str:
        t = self.transition
        where = f"step {self.step} " if self.step is not None else ""
        return f"{where}{t.trigger}: {t.source.value} -> {t.dest.value} · {self.action}"


@dataclass
class Program:
    """The ops one rank executes, with what the spec says about the engine/collector before each op."""

    ops: list[Op]
    engine_before: list[EngineCondition]
    collector_before: list[CollectorCondition]
    problems: list[str] = field(default_factory=list)
    final_state: State = State.CREATED


_STEP_FACTS = (Fact.SAVE_THIS_STEP, Fact.VALIDATE_THIS_STEP, Fact.LAST_STEP)


def plan_program(
    spec: LifecycleSpec, steps: Sequence[StepPlan], *, val_at_start: bool = False, stop_at_start: bool = False
) -> Program:
    """The transitions the spec selects for ``steps`` (the last one is the run's last), flattened into ops.

    Guards are evaluated on facts the actions declare (``sets``, ``clears``, ``decides``, ``upgrades``), exactly
    as the runtime applies them; a latch's decisions come from ``steps`` (and ``val_at_start``; ``stop_at_start``:
    the early stop decided by the validation at start says stop, so no step runs). Problems found
    while planning are returned in ``problems``: a stuck state, a second build, a teardown outside a terminal
    state, training or a save with the engine awake, a double or missing bump, a collector resumed after the
    last step latched (an engine resume then only into a validation-only state), a wake with an async save not
    finalized, a decode step while requests are parked, a parked request resumed twice, a save before the
    step's validation in a validate-before-save spec, and a step that saved other than its decisions say (an
    early stop saves and ends the run).
    """
    facts: dict[Fact, bool] = dict.fromkeys(Fact, False)
    state = spec.initial
    ops: list[Op] = []
    engine_before: list[EngineCondition] = []
    collector_before: list[CollectorCondition] = []
    st0 = spec.state(state)
    engine, collector, requests = st0.engine, st0.collector, st0.requests
    problems: list[str] = []
    drained = True
    builds = 0
    bumps = 0
    step: int | None = None
    last_latched = False
    validated = False
    saves: dict[int, int] = {}
    early_stopped: int | None = None
    has_stop_latch = any(a.role is Role.LATCH_STOP for a in spec.actions)
    stopping = False
    watch_stop = any(p.stop_in is not None for p in steps)
    stop_now = False  # the loop stops the run where the machine is now (a step plan's stop_in reached)

    def decision(fact: Fact, plan: StepPlan, i: int) -> bool:
        return {
            Fact.SAVE_THIS_STEP: plan.save,
            Fact.VALIDATE_THIS_STEP: plan.validate,
            Fact.LAST_STEP: i == len(steps) - 1,
            Fact.VALIDATE_AT_START: val_at_start,
            Fact.STOP_EARLY: plan.early_stop if step is not None else stop_at_start,
        }.get(fact, False)

    def run(t: TransitionSpec) -> None:
        nonlocal state, engine, collector, requests, drained, builds, bumps, step, last_latched, validated
        nonlocal early_stopped, stop_now
        if spec.state(t.source).validates and t.dest != t.source:
            validated = True
        for name in t.actions:
            act = spec.action(name)
            role = act.role
            if role is Role.LATCH and any(f in _STEP_FACTS for f in act.decides):
                step = 0 if step is None else step + 1
                bumps = 0
                validated = False
            pending = 1 if Fact.SAVE_PENDING in act.writes() else -1 if Fact.SAVE_PENDING in act.cleared() else 0
            op = Op(len(ops), t, name, act.issues, step, role, pending)
            where = op.label()
            plan = steps[step] if step is not None and step < len(steps) else StepPlan()
            ops.append(op)
            engine_before.append(engine)
            collector_before.append(collector)
            if act.issues is not None:
                if act.issues in (Collective.TRAIN, Collective.CHECKPOINT) and (
                    engine is EngineCondition.AWAKE or collector is CollectorCondition.RUNNING
                ):
                    rule = R.CHECKPOINT_SUSPENDS if act.issues is Collective.CHECKPOINT else R.ONE_COMMUNICATOR
                    problems.append(
                        rule.tag(
                            f"{where}: {act.issues.value} work starts with the engine {engine.value} and "
                            f"the collector {collector.value} (both must be down)"
                        )
                    )
                if act.issues is Collective.DECODE:
                    if last_latched and (role is not Role.RESUME or not spec.state(t.dest).validates):
                        problems.append(
                            R.CHECKPOINT_SUSPENDS.tag(
                                f"{where}: decode resumed after the last step latched (the last step never resumes "
                                "collection; only a validation-only wake)"
                            )
                        )
                    if facts[Fact.SAVE_PENDING]:
                        problems.append(
                            R.CHECKPOINT_SUSPENDS.tag(f"{where}: the engine wakes before the async save was finalized")
                        )
                    if role is not Role.RESUME and engine is not EngineCondition.AWAKE:
                        problems.append(R.PARK_NOT_DRAIN.tag(f"{where}: decode work with the engine {engine.value}"))
                    if role is not Role.RESUME and requests is RequestCondition.PARKED:
                        problems.append(R.PARK_NOT_DRAIN.tag(f"{where}: a decode step while requests are parked"))
                drained = False
                facts[Fact.HANDOFF_COMPLETE] = False
            if role is Role.RESUME and requests is not RequestCondition.PARKED:
                problems.append(f"{where}: resume with requests {requests.value} (each parked request resumes once)")
            if role in (Role.BUILD, Role.ADOPT):  # adopting an engine up at construction is its one bring-up
                builds += 1
                if role is Role.BUILD and spec.engine_up_at_construction:
                    problems.append(
                        R.BUILD_ONCE.tag(f"{where}: the engine is built although it came up at construction")
                    )
                if builds > 1:
                    problems.append(R.BUILD_ONCE.tag(f"{where}: the engine is built a second time (build once)"))
            elif role is Role.TEARDOWN and not spec.state(t.dest).terminal:
                problems.append(
                    R.BUILD_ONCE.tag(
                        f"{where}: engine torn down on the way to {t.dest.value} (teardown only at Stopped)"
                    )
                )
            elif role is Role.BUMP:
                bumps += 1
            elif role is Role.DRAIN:
                drained = True
            elif role is Role.SAVE and step is not None:
                saves[step] = saves.get(step, 0) + 1
                if spec.validate_before_save and facts[Fact.VALIDATE_THIS_STEP] and not validated:
                    problems.append(f"{where}: the save runs before the step's validation (validate before save)")
            if role in (Role.LATCH, Role.LATCH_STOP):
                for f in act.decides:
                    facts[f] = decision(f, plan, step if step is not None else 0)
                if role is Role.LATCH_STOP and any(facts[f] for f in act.decides):
                    early_stopped = step
                    for f in stop_upgrades(act, facts):
                        facts[f] = True
            for f in act.cleared():
                facts[f] = False
            for f in act.sets:
                facts[f] = drained if role is Role.BARRIER else True
            last_latched = last_latched or facts[Fact.LAST_STEP]
            engine = act.engine or engine
            collector = act.collector or collector
            requests = act.requests or requests
        state = t.dest
        if watch_stop and not stopping:
            target = steps[step] if step is not None and step < len(steps) else steps[0]
            stop_now = stop_now or target.stop_in is state  # the loop stops the run here

    def automatic() -> bool:
        while not stop_now:
            outgoing = [t for t in spec.outgoing(state) if t.automatic]
            auto = [t for t in outgoing if t.enabled(facts)]
            if not auto:
                if outgoing and not spec.state(state).resting:
                    problems.append(
                        f"stuck in {state.value}: no transition enabled (facts: "
                        f"{', '.join(f.value for f, v in facts.items() if v) or 'none'})"
                    )
                    return False
                return True
            run(auto[0])
        return False  # the loop stops here: nothing after runs

    def fire(trigger: str) -> bool:
        t = spec.select(state, trigger, facts)
        if t is None:
            problems.append(f"stuck in {state.value}: trigger {trigger!r} not enabled")
            return False
        run(t)
        return automatic()

    def end_validations() -> bool:
        ok = True
        while ok and spec.state(state).validates and spec.select(state, "end_validation", facts) is not None:
            ok = fire("end_validation")
        return ok

    def stop_here() -> bool:
        """The loop stops the run where it is (as one that raised there does): nothing of the step is done after."""
        nonlocal stopping, stop_now
        stopping, stop_now = True, False
        t = spec.select(state, STOP_TRIGGER, facts)
        if t is None:
            problems.append(R.BUILD_ONCE.tag(f"no way to stop from {state.value}: stop is not enabled there"))
            return False
        done = [spec.action(a) for a in t.actions]
        bad = [a.name for a in done if a.issues in (Collective.TRAIN, Collective.DECODE) or a.role in STEP_WORK]
        if bad:
            problems.append(
                f"stop from {state.value}: {', '.join(bad)} (a stop abandons the step: it trains, saves and wakes "
                "nothing)"
            )
        run(t)
        return automatic()

    ran = 0
    stopped_in: State | None = None
    stop_now = bool(steps) and steps[0].stop_in is state
    ok = not stop_now and fire("start") and end_validations()
    for i in range(len(steps)):
        if not ok or spec.state(state).final:
            break
        ran += 1
        ok = fire("begin_step") and fire("train")
        if ok and bumps != 1:
            problems.append(
                R.WEIGHT_VERSIONS.tag(f"step {i}: weight version bumped {bumps} times (exactly once per step)")
            )
        ok = ok and end_validations()
    if stop_now:
        stopped_in = state
        ran = max(ran - 1, 0)  # the step under way is abandoned: none of its decisions is checked
        ok = stop_here()
    if stopped_in is not None and ok and not spec.state(state).terminal:
        problems.append(f"stop from {stopped_in.value} ends in {state.value}, not a terminal state")
    if ok and stopped_in is None:
        for i in range(ran):
            plan = steps[i]
            stops = has_stop_latch and plan.early_stop and plan.validate
            want = 1 if plan.save or stops else 0
            if saves.get(i, 0) != want:
                problems.append(
                    f"step {i} ({plan.label()}): {saves.get(i, 0)} save(s), the decisions say {want}"
                    + (" (an early stop saves and ends the run)" if stops else "")
                )
            if stops and ran != i + 1:
                problems.append(f"step {i}: the early stop latched, yet the run went on to step {i + 1}")
        if early_stopped is not None and not has_stop_latch:  # pragma: no cover - defensive
            problems.append("an early stop without an early-stop latch")
    if ok and stopped_in is None and not spec.state(state).terminal:
        if not spec.state(state).final:
            problems.append(f"after the last step the machine is in {state.value}, not Done")
        ok = fire(STOP_TRIGGER)
    if ok and not spec.state(state).terminal:
        problems.append(f"the run ends in {state.value}, not a terminal state")
    return Program(ops, engine_before, collector_before, problems, state)


__all__ = ["Op", "Program", "plan_program"]
