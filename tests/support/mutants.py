"""Mutation proof: each lifecycle bug, applied on purpose, must be caught (each names the rule it breaks).

A :class:`Mutant` is the shipped lifecycle with one bug: a mutated :class:`~colo_fsm.states.spec.LifecycleSpec`
(derived with ``dataclasses.replace``) or one swapped component (the drain, the checkpoint decision, the runtime
machine's guard reader, the in-flight cap). :func:`evaluate` runs it against four killers and records which
catch it:

* ``validator``: :func:`~colo_fsm.states.validate.validate_spec` rejects the spec;
* ``runtime``: the runtime :class:`~colo_fsm.machine.lifecycle.Lifecycle`, built with ``check_spec=False``
  and driven through a directed run (plain, checkpoint by period and by deadline, validation, last step),
  refuses with a lifecycle error of its own;
* ``checker``: the exhaustive multi-rank checker (:mod:`colo_fsm.testing.checker`, N = 2 and 3) finds a
  violation;
* ``hypothesis``: the property-based lifecycle machine (:mod:`colo_fsm.testing.lifecycle_machine`) finds a
  failing program;
* ``properties``: the component properties of :mod:`tests.support.properties` (latch, in-flight cap,
  parallelism check, wall-clock metrics, dual-mode opt-in) find a counterexample;
* ``ranks``: two ranks (threads) running the runtime machine over a fingerprint-exchanging
  :class:`~colo_fsm.guards.barrier.ThreadBarrier` with mode-reporting engines: a healthy program must pass,
  and one rank whose engine leaves the model in decode mode must make every rank raise
  :class:`~colo_fsm.errors.HandoffDivergence` at the barrier.

``scripts/mutation_proof.py`` prints the table and fails if any mutant survives every killer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.errors import HandoffDivergence, LifecycleError
from colo_fsm.guards.barrier import ThreadBarrier
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.guards.fingerprint import HandoffFingerprint
from colo_fsm.guards.parallelism import check_parallelism
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.presets import NEMO_RL
from colo_fsm.states.rules import LifecycleRule
from colo_fsm.states.spec import (
    LIFECYCLE,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    RequestCondition,
    State,
    TransitionSpec,
)
from colo_fsm.states.validate import SpecError, validate_spec
from colo_fsm.testing.checker import check
from colo_fsm.testing.fakes import (
    FakeClock,
    Journal,
    ModalEngine,
    RecordingCollector,
    RecordingTrainer,
    recording_adapters,
)
from colo_fsm.testing.scenarios import StepPlan, scenarios_for

KILLERS = ("validator", "runtime", "checker", "hypothesis", "properties", "ranks")
S = State
R = LifecycleRule


# ---------------------------------------------------------------------------------------------- swapped components
_thread = threading.local()


def set_current_device(index: int) -> None:
    """What ``torch.cuda.set_device`` does for the calling thread (in this simulation)."""
    _thread.device = index


def current_device() -> int:
    """The calling thread's current device: 0 for a thread that never called :func:`set_current_device`."""
    return int(getattr(_thread, "device", 0))


class CallingThreadDrain(DeviceDrain):
    """MUTANT: drains the calling thread's current device (a bare ``torch.cuda.synchronize()``), not LOCAL_RANK's."""

    def target_device(self) -> int:
        return current_device()


class RequeryingLifecycle(Lifecycle):
    """MUTANT: the save guard re-evaluates the raw checkpoint rule instead of reading the latched decision."""

    def _reader(self, fact: Fact) -> Callable[..., bool]:
        if fact is not Fact.SAVE_THIS_STEP:
            return super()._reader(fact)

        def ask_again(*_a: Any, **_k: Any) -> bool:
            rule = getattr(self.checkpoint_decision, "_rule")  # noqa: B009 - the bug is bypassing the latch
            return bool(rule(self.step_index))

        return ask_again


class DigestlessLifecycle(Lifecycle):
    """MUTANT: the handoff fingerprint leaves out the model-mode digest (ranks in different modes agree)."""

    def _fingerprint(self) -> HandoffFingerprint:
        return dataclasses.replace(super()._fingerprint(), mode_digest=0, mode=None)


def resetting_engine(rank: int) -> Any:
    """The shipped behaviour: an engine whose suspend resets the model mode on every rank."""
    return ModalEngine()


def one_rank_resets_mode(rank: int) -> Any:
    """MUTANT: an engine whose suspend resets the model mode on rank 0 only (rank-local reset)."""
    return ModalEngine(reset_on_suspend=rank == 0)


class UnlatchedCheckpointDecision(CheckpointDecision):
    """MUTANT: no latch; every query evaluates the rules again (the one-shot time rule then says False)."""

    def decide(self, step: int) -> bool:
        answer = bool(self._rule(step))
        self.evaluations += 1
        self._step, self._answer = step, answer
        return answer


def _stale_tolerant_buffer() -> type[Any]:
    """MUTANT: a replay buffer whose advance never evicts (stale groups stay and get sampled)."""
    from colo_fsm.collector.buffer import ReplayBuffer

    class StaleTolerantReplayBuffer(ReplayBuffer):
        def _advance_locked(self, weight_version: int) -> int:
            self._weight_version = max(self._weight_version, weight_version)
            return 0

    return StaleTolerantReplayBuffer


def _silently_dropping_buffer() -> type[Any]:
    """MUTANT: a replay buffer that drops stale groups without counting them."""
    from colo_fsm.collector.buffer import ReplayBuffer

    class SilentlyDroppingReplayBuffer(ReplayBuffer):
        def _evict_locked(self, group: Any, age: int) -> None:
            return None

    return SilentlyDroppingReplayBuffer


def _newest_version_buffer() -> type[Any]:
    """MUTANT: a replay buffer that counts a group's age from its newest weight version, not its oldest."""
    from colo_fsm.collector.buffer import ReplayBuffer

    class NewestVersionReplayBuffer(ReplayBuffer):
        def staleness_version(self, group: Any) -> int:
            return int(group.newest_version)

    return NewestVersionReplayBuffer


class AgeOnlyInFlightCap(InFlightCap):
    """MUTANT: the in-flight cap ignores the receiving actor's capacity."""

    @property
    def value(self) -> int:
        return self.configured


def parallelism_check_tp_pp_only(training: Any, generation: Any) -> Any:
    """MUTANT: compares only TP and PP (and CP); expert parallel sizes are never checked."""
    if isinstance(generation, dict):
        generation = {k: v for k, v in generation.items() if "expert" not in k and k not in ("ep", "etp")}
    return check_parallelism(training, generation)


def parallelism_check_cp_silent(training: Any, generation: Any) -> Any:
    """MUTANT: a differing context_parallel_size is silently ignored (no warning)."""
    if isinstance(generation, dict):
        generation = {k: v for k, v in generation.items() if k not in ("context_parallel_size", "cp")}
    return check_parallelism(training, generation)


def trainable_without_opt_in(config: Any, *, allow_inference_optimized_training: bool) -> None:
    """MUTANT: an inference_optimized model is trained without asking for the opt-in."""


def step_axis_metrics_logger() -> type[Any]:
    """MUTANT: a MetricsLogger whose clock is the number of records logged (throughput against the step)."""
    from colo_fsm.metrics import MetricsLogger

    class StepAxisMetricsLogger(MetricsLogger):
        def __init__(self, run_dir: Any, *, tensorboard: bool = True, clock: Any = None) -> None:
            self._records = 0
            super().__init__(run_dir, tensorboard=tensorboard, clock=self._step_clock)

        def _step_clock(self) -> float:
            self._records += 1
            return float(self._records // 2)  # t0 at construction, one "second" per logged step

    return StepAxisMetricsLogger


def _no_boundary_suspend_batcher() -> type[Any]:
    """MUTANT: suspend suspends the backend at once from the caller's thread; the engine loop keeps stepping."""
    from colo_fsm.adapters.batching import ContinuousBatcher

    class NoBoundarySuspendBatcher(ContinuousBatcher):
        def suspend(self) -> None:
            assert self.backend is not None
            self.timings.append(("suspend", float(self.backend.suspend() or 0.0)))

        def resume(self) -> None:
            assert self.backend is not None
            self.timings.append(("resume", float(self.backend.resume() or 0.0)))

    return NoBoundarySuspendBatcher


def _independent_tp_batcher() -> type[Any]:
    """MUTANT: the engine loop ignores its tensor-parallel lockstep: each TP rank admits and steps on its own."""
    from colo_fsm.adapters.batching import ContinuousBatcher

    class IndependentTpBatcher(ContinuousBatcher):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("lockstep", None)
            super().__init__(*args, **kwargs)

    return IndependentTpBatcher


def _dropping_resume_batcher() -> type[Any]:
    """MUTANT: on resume the parked requests are dropped from the engine (their callers wait forever)."""
    from colo_fsm.adapters.batching import ContinuousBatcher

    class DroppingResumeBatcher(ContinuousBatcher):
        def _execute(self, cmd: Any, backend: Any) -> bool:
            parked = not self._awake
            going = super()._execute(cmd, backend)
            if cmd.kind == "resume" and parked:
                with self._cond:
                    dropped = list(self._active)
                    self._active.clear()
                for rid in dropped:
                    backend.abort(rid)
            return going

    return DroppingResumeBatcher


def _double_resume_batcher() -> type[Any]:
    """MUTANT: on resume every parked request is added to the engine again (it then runs twice)."""
    from colo_fsm.adapters.batching import ContinuousBatcher

    class DoubleResumeBatcher(ContinuousBatcher):
        def _execute(self, cmd: Any, backend: Any) -> bool:
            parked = not self._awake
            going = super()._execute(cmd, backend)
            if cmd.kind == "resume" and parked:
                for req in list(self._active.values()):
                    backend.add(req.backend)
            return going

    return DoubleResumeBatcher


# ---------------------------------------------------------------------------------------------- suite mutants
# Bugs in one component that a test of the default suite kills by an assertion (tests/test_mutants.py applies each
# and runs that test's check): ``component()`` builds the mutant, ``test`` names the test that kills it.


class RestartingDeadlineBarrier:
    """MUTANT (built lazily: imports torch): a fingerprint barrier whose wait for each peer's row gets the whole
    timeout again, instead of what is left of the deadline counted from this rank's arrival."""

    @staticmethod
    def build() -> type[Any]:
        from datetime import timedelta

        from colo_fsm.guards.barrier import _FINGERPRINT_TAG, TorchBarrier

        class Restarting(TorchBarrier):
            def _exchange(self, fingerprint: HandoffFingerprint, deadline: float) -> list[list[int]]:
                ints = fingerprint.to_ints()
                n = len(ints)
                send, recv, host = self._buffers(n)
                host[:] = ints
                pg, peers = self._pg, self._peers
                works = [pg.recv([recv[p * n : (p + 1) * n]], p, _FINGERPRINT_TAG) for p in peers]
                works += [pg.send([send], p, _FINGERPRINT_TAG) for p in peers]
                for work in works:
                    if work.wait(timeout=timedelta(seconds=self.timeout_s)) is False:  # the bug: restarts
                        raise TimeoutError("the exchange did not complete")
                self._last_work = works
                flat = recv.tolist()
                rows = [flat[i * n : (i + 1) * n] for i in range(self.world_size)]
                rows[self.rank] = ints
                return rows

        return Restarting


def _unagreed_stop_agreement() -> type[Any]:
    """MUTANT: the demo's stop agreement keeps each rank's own signal (no all-reduce): a SIGTERM that reached one
    rank stops that rank alone."""
    from colo_fsm.demo.signals import StopAgreement

    class Unagreed(StopAgreement):
        def _world_max(self, value: int) -> int:
            return value

    return Unagreed


def _own_plan_lockstep() -> type[Any]:
    """MUTANT: every tensor-parallel follower keeps the plan it made itself (the broadcast still happens)."""
    from tests.support.lockstep_ranks import OwnPlanLockstep

    return OwnPlanLockstep


def _end_version_collector() -> type[Any]:
    """MUTANT: a rollout whose samples carry no per-token versions is stamped with the version read at its end,
    not with its oldest (its age then counts from the newest weights it saw)."""
    from colo_fsm.collector import AsyncCollector

    class EndVersion(AsyncCollector):
        def _tag(self, group: Any, version: int, end_version: int, ticket: Any, **kwargs: Any) -> Any:
            tagged = super()._tag(group, version, end_version, ticket, **kwargs)
            if any(s.weight_versions for s in group.samples):
                return tagged
            return tagged.with_version(max(version, end_version), ticket.target_step, max(version, end_version))

    return EndVersion


def _false_only_reachable() -> Callable[..., Any]:
    """MUTANT: the spec walk follows only latches decided False, so a step latched save-and-last is never walked."""
    import itertools as _it
    from collections import deque as _deque

    from colo_fsm.states.spec import Role as _Role
    from colo_fsm.states.walk import apply_effects

    def reachable(spec: LifecycleSpec, *, limit: int = 200_000) -> Any:
        start = (spec.initial, frozenset[Fact]())
        seen, todo = {start}, _deque([start])
        while todo:
            state, true = todo.popleft()
            yield state, true
            facts = {f: f in true for f in Fact}
            enabled = [t for t in spec.outgoing(state) if t.enabled(facts)]
            auto = [t for t in enabled if t.automatic]
            for t in auto[:1] if auto else enabled:
                latches = [spec.action(n) for n in t.actions if spec.action(n).role in (_Role.LATCH, _Role.LATCH_STOP)]
                decided = tuple(dict.fromkeys(f for a in latches for f in a.decides))
                for values in _it.islice(_it.product((False, True), repeat=len(decided)), 1):  # the bug: all False
                    nxt = dict(facts)
                    apply_effects(spec, t, nxt, dict(zip(decided, values)))
                    key = (t.dest, frozenset(f for f, v in nxt.items() if v))
                    if key not in seen:
                        seen.add(key)
                        todo.append(key)

    return reachable


@dataclass(frozen=True)
class SuiteMutant:
    """A bug in one component, killed by an assertion of ``test`` (a default-suite test)."""

    name: str
    breaks: LifecycleRule
    description: str
    component: Callable[[], Any]
    test: str


SUITE_MUTANTS: dict[str, SuiteMutant] = {
    m.name: m
    for m in (
        SuiteMutant(
            "barrier-deadline-restarts-per-wait",
            R.ONE_COMMUNICATOR,
            "with three ranks, a fingerprint barrier that restarts its timeout for each peer lets a rank that "
            "arrived after this rank's deadline pass",
            RestartingDeadlineBarrier.build,
            "tests/test_three_ranks.py::test_a_fingerprint_barrier_gives_up_at_its_own_deadline_with_three_ranks",
        ),
        SuiteMutant(
            "sigterm-not-agreed-across-ranks",
            R.DECIDE_ONCE,
            "a SIGTERM that reached one rank of three is not agreed: that rank saves and stops, the others go on",
            _unagreed_stop_agreement,
            "tests/test_three_ranks.py::test_a_sigterm_to_one_rank_is_agreed_by_every_rank",
        ),
        SuiteMutant(
            "lockstep-follower-plans-its-own-step",
            R.ONE_COMMUNICATOR,
            "a tensor-parallel follower keeps its own plan instead of the leader's",
            _own_plan_lockstep,
            "tests/test_three_ranks.py::test_lockstep_followers_take_the_leaders_plan",
        ),
        SuiteMutant(
            "rollout-stamped-with-its-end-version",
            R.WEIGHT_VERSIONS,
            "a rollout without per-token versions is stamped with the weight version read at its end, not its oldest",
            _end_version_collector,
            "tests/test_collector_async.py::test_a_rollout_without_per_token_versions_is_stamped_with_its_oldest",
        ),
        SuiteMutant(
            "find-stuck-walks-only-false-latches",
            R.STEP_ORDER_IS_DATA,
            "the spec walk follows only latches decided False: a spec stuck on a save-and-last step is accepted",
            _false_only_reachable,
            "tests/test_spec_mistakes.py::test_a_spec_stuck_on_a_save_and_last_step_is_refused",
        ),
    )
}
"""Component bugs outside the lifecycle machine, each killed by an assertion of a default-suite test."""


def kill_by_suite_test(name: str) -> str | None:
    """Apply the suite mutant ``name`` and run the check of the default-suite test that kills it: the assertion it
    fails with, or None when the check passed (the mutant survived)."""
    from unittest import mock

    m = SUITE_MUTANTS[name]
    if m.test.startswith("tests/test_three_ranks.py"):
        from tests.support.three_ranks import JUDGES, MUTANT_CASES, run_three_ranks

        case = MUTANT_CASES[name]
        problems = JUDGES[case](run_three_ranks([name])[case])
        return problems[0] if problems else None
    check: Callable[[], None]
    if name == "rollout-stamped-with-its-end-version":
        from tests.test_collector_async import check_version_stamp

        collector_class = m.component()

        def check() -> None:
            check_version_stamp(collector_class)

    else:
        from colo_fsm.states import walk
        from tests.test_spec_mistakes import check_stuck_save_and_last

        def check() -> None:
            with mock.patch.object(walk, "reachable", m.component()):
                check_stuck_save_and_last()

    try:
        check()
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    return None


# ---------------------------------------------------------------------------------------------- spec edits
def edit_transitions(spec: LifecycleSpec, match: Callable[[TransitionSpec], bool], **changes: Any) -> LifecycleSpec:
    """A copy of ``spec`` with ``changes`` applied (``dataclasses.replace``) to every transition ``match`` selects."""
    hit = [t for t in spec.transitions if match(t)]
    if not hit:
        raise ValueError("no transition matched")
    ts = tuple(dataclasses.replace(t, **changes) if match(t) else t for t in spec.transitions)
    return dataclasses.replace(spec, transitions=ts)


def edit_state(spec: LifecycleSpec, state: State, **changes: Any) -> LifecycleSpec:
    """A copy of ``spec`` with one state's declaration changed."""
    ss = tuple(dataclasses.replace(s, **changes) if s.state is state else s for s in spec.states)
    return dataclasses.replace(spec, states=ss)


def _edge(trigger: str, source: State, dest: State) -> Callable[[TransitionSpec], bool]:
    return lambda t: t.trigger == trigger and t.source is source and t.dest is dest


def _actions(spec: LifecycleSpec, trigger: str, source: State, dest: State) -> tuple[str, ...]:
    return next(t.actions for t in spec.transitions if _edge(trigger, source, dest)(t))


def _resume_before_barrier() -> LifecycleSpec:
    spec = edit_transitions(LIFECYCLE, _edge("conclude", S.TRAINING, S.WAKING), actions=("offload_training_buffers",))
    return edit_transitions(
        spec,
        _edge("resume", S.WAKING, S.GENERATING),
        when=(),
        actions=("resume_engine", "drain_device", "barrier", "resume_collector"),
    )


def _wake_before_save_consistent() -> LifecycleSpec:
    spec = edit_transitions(
        LIFECYCLE,
        _edge("conclude", S.TRAINING, S.CHECKPOINTING),
        actions=("offload_training_buffers", "drain_device", "barrier", "resume_engine", "save_checkpoint"),
    )
    spec = edit_state(spec, S.CHECKPOINTING, engine=EngineCondition.AWAKE, requests=RequestCondition.RUNNING)
    for dest in (S.DONE, S.WAKING):
        spec = edit_transitions(
            spec, _edge("conclude", S.CHECKPOINTING, dest), actions=("suspend_engine", "drain_device", "barrier")
        )
    return spec


def _last_step_wakes() -> LifecycleSpec:
    spec = LIFECYCLE
    for source in (S.TRAINING, S.CHECKPOINTING):
        spec = edit_transitions(
            spec,
            _edge("conclude", source, S.DONE),
            actions=(*_actions(spec, "conclude", source, S.DONE), "resume_engine", "resume_collector"),
        )
    spec = edit_state(
        spec,
        S.DONE,
        engine=EngineCondition.AWAKE,
        collector=CollectorCondition.RUNNING,
        requests=RequestCondition.RUNNING,
    )
    return edit_transitions(
        spec,
        _edge("stop", S.DONE, S.STOPPED),
        actions=("pause_collector", "suspend_engine", "drain_device", "barrier", "shutdown_engine"),
    )


def _nemo_wake_before_finalize() -> LifecycleSpec:
    spec = edit_transitions(NEMO_RL, _edge("conclude", S.CHECKPOINTING, S.WAKING), actions=("drain_device", "barrier"))
    return edit_transitions(spec, _edge("resume", S.WAKING, S.GENERATING), unless=())


def _nemo_validation_after_save() -> LifecycleSpec:
    F = Fact
    spec = edit_transitions(
        NEMO_RL,
        _edge("conclude", S.TRAINING, S.VALIDATING),
        when=(F.STEP_TRAINED, F.VALIDATE_THIS_STEP),
        unless=(F.SAVE_THIS_STEP,),
    )
    spec = edit_transitions(
        spec, _edge("conclude", S.TRAINING, S.CHECKPOINTING), when=(F.STEP_TRAINED, F.SAVE_THIS_STEP), unless=()
    )
    spec = edit_transitions(spec, _edge("conclude", S.CHECKPOINTING, S.DONE), unless=(F.VALIDATE_THIS_STEP,))
    spec = edit_transitions(
        spec, _edge("conclude", S.CHECKPOINTING, S.WAKING), unless=(F.LAST_STEP, F.VALIDATE_THIS_STEP)
    )
    after_save = TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.VALIDATING,
        ("finalize_checkpoint", "drain_device", "barrier", "resume_engine"),
        when=(F.VALIDATE_THIS_STEP,),
        automatic=True,
        description="MUTANT: validate after the save",
    )
    spec = dataclasses.replace(spec, transitions=(*spec.transitions, after_save))
    spec = edit_transitions(spec, _edge("conclude", S.CONCLUDING, S.CHECKPOINTING), when=(F.STOP_EARLY,))
    spec = edit_transitions(spec, _edge("conclude", S.CONCLUDING, S.DONE), unless=(F.STOP_EARLY,))
    return edit_transitions(spec, _edge("conclude", S.CONCLUDING, S.GENERATING), unless=(F.STOP_EARLY, F.LAST_STEP))


def _nemo_early_stop_without_save() -> LifecycleSpec:
    acts = tuple(
        dataclasses.replace(a, upgrades=(Fact.LAST_STEP,)) if a.name == "latch_early_stop" else a
        for a in NEMO_RL.actions
    )
    return dataclasses.replace(NEMO_RL, actions=acts)


def _nemo_val_at_end_resumes_collection() -> LifecycleSpec:
    spec = edit_transitions(NEMO_RL, _edge("conclude", S.CONCLUDING, S.GENERATING), unless=(Fact.SAVE_THIS_STEP,))
    ts = tuple(t for t in spec.transitions if not _edge("conclude", S.CONCLUDING, S.DONE)(t))
    return dataclasses.replace(spec, transitions=ts)


def _lying_docs_adapters() -> Callable[..., Any]:
    """MUTANT: the docs' toy adapters with a ``suspend()`` that reports suspended and keeps serving."""
    from tests.support.liars import docs_shaped, lying_toy_engine

    return docs_shaped(lying_toy_engine())


def _lying_nemo_adapters() -> Callable[..., Any]:
    """MUTANT: NeMo-RL-shaped adapters whose engine's ``suspend()`` reports suspended and keeps serving."""
    from tests.support.liars import LyingNemoEngine, nemo_shaped

    return nemo_shaped(LyingNemoEngine)


# ---------------------------------------------------------------------------------------------- mutants
@dataclass(frozen=True)
class Mutant:
    """The shipped lifecycle with one deliberate bug."""

    name: str
    breaks: LifecycleRule | None  # the lifecycle rule it breaks (None: the unmutated control)
    description: str
    spec: LifecycleSpec = LIFECYCLE
    drain_class: Callable[..., Any] = DeviceDrain
    checkpoint_class: Callable[..., LatchedDecision] = CheckpointDecision
    lifecycle_class: type[Lifecycle] = Lifecycle
    cap_class: Callable[..., InFlightCap] = InFlightCap
    rank0_steps: tuple[StepPlan, ...] | None = None  # checker: rank 0 latched other decisions than its peers
    parallelism_check: Callable[..., Any] | None = None  # component swaps seen by the property killer
    trainable_check: Callable[..., None] | None = None
    metrics_logger: Callable[[], type[Any]] | None = None
    buffer_class: Callable[[], type[Any]] | None = None  # a replay buffer class (built lazily: imports collector)
    batcher_class: Callable[[], type[Any]] | None = None  # an engine loop (ContinuousBatcher) class, built lazily
    engine_factory: Callable[[int], Any] = resetting_engine  # rank -> engine, for the ranks killer
    adapters: Callable[..., Any] | None = None  # the hypothesis killer's adapter factory (default: the fakes)
    expected: frozenset[str] = frozenset()  # killers that must catch it (the proof asserts these)

    def checker_kwargs(self, scenario: str = "all-step-kinds") -> dict[str, Any]:
        """Keyword arguments for :func:`colo_fsm.testing.checker.check` that apply this mutant."""
        drain_class = self.drain_class
        kwargs: dict[str, Any] = {
            "spec": self.spec,
            "drain_factory": lambda r: drain_class(r, synchronize=lambda _d: None),
        }
        if self.rank0_steps is not None:
            kwargs["rank0_steps"] = self.rank0_steps
        return kwargs

    def machine(self) -> type[Any]:
        """A :class:`~colo_fsm.testing.lifecycle_machine.LifecycleMachine` running this mutant."""
        from colo_fsm.testing.lifecycle_machine import lifecycle_machine

        return lifecycle_machine(
            self.adapters,
            name=f"Mutant_{self.name.replace('-', '_')}",
            spec=self.spec,
            check_spec=False,
            lifecycle_class=self.lifecycle_class,
            drain_class=self.drain_class,
            checkpoint_class=self.checkpoint_class,
            cap_class=self.cap_class,
        )


_ALL = frozenset({"validator", "runtime", "checker", "hypothesis"})
_NOT_VALIDATOR = frozenset({"runtime", "checker", "hypothesis"})

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "resume-before-barrier",
        R.ONE_COMMUNICATOR,
        "the wake path resumes the engine first, then drains and meets the barrier",
        spec=_resume_before_barrier(),
        expected=_ALL,  # the validator's path rule: decode after train work with no drain + barrier between
    ),
    Mutant(
        "resume-between-drain-and-barrier",
        R.ONE_COMMUNICATOR,
        "the validation wake signals resume after the drain but before the barrier",
        spec=edit_transitions(
            LIFECYCLE,
            _edge("conclude", S.TRAINING, S.VALIDATING),
            actions=("offload_training_buffers", "drain_device", "resume_engine", "barrier"),
        ),
        expected=_ALL,
    ),
    Mutant(
        "barrier-without-drain",
        R.ONE_COMMUNICATOR,
        "the handoff to training meets the barrier without draining the device first",
        spec=edit_transitions(
            LIFECYCLE,
            _edge("begin_step", S.GENERATING, S.DRAINING),
            actions=("latch_step_decisions", "pause_collector", "suspend_engine", "barrier"),
        ),
        expected=_ALL,
    ),
    Mutant(
        "drain-calling-thread-device",
        R.ONE_COMMUNICATOR,
        "the drain synchronizes the calling thread's current device (device 0 when set_device was never called)",
        drain_class=CallingThreadDrain,
        expected=frozenset({"checker", "hypothesis"}),
    ),
    Mutant(
        "checkpoint-decision-queried-twice",
        R.DECIDE_ONCE,
        "the save guard asks the checkpoint rule again instead of reading the latched decision",
        lifecycle_class=RequeryingLifecycle,
        expected=frozenset({"hypothesis"}),
    ),
    Mutant(
        "checkpoint-decision-not-latched",
        R.DECIDE_ONCE,
        "the checkpoint decision re-evaluates its rules on every query; a second site gets a different answer",
        checkpoint_class=UnlatchedCheckpointDecision,
        expected=frozenset({"hypothesis", "properties"}),
    ),
    Mutant(
        "checkpoint-decision-not-agreed",
        R.DECIDE_ONCE,
        "rank 0 latches a save its peers did not (no agree/broadcast across ranks)",
        rank0_steps=(StepPlan(save=True), StepPlan(), StepPlan(validate=True), StepPlan(True, True), StepPlan()),
        expected=frozenset({"checker"}),
    ),
    Mutant(
        "wake-between-train-and-save",
        R.CHECKPOINT_SUSPENDS,
        "the post-step wake happens before the save that follows the training step",
        spec=edit_transitions(
            LIFECYCLE,
            _edge("conclude", S.TRAINING, S.CHECKPOINTING),
            actions=("offload_training_buffers", "drain_device", "barrier", "resume_engine", "save_checkpoint"),
        ),
        expected=_ALL,
    ),
    Mutant(
        "wake-between-train-and-save-declared",
        R.CHECKPOINT_SUSPENDS,
        "as above, with Checkpointing re-declared 'engine awake' so the conditions agree (the path rule still objects)",
        spec=_wake_before_save_consistent(),
        expected=_ALL,
    ),
    Mutant(
        "teardown-at-validation",
        R.BUILD_ONCE,
        "the engine is torn down and rebuilt at the validation boundary",
        spec=edit_transitions(
            LIFECYCLE,
            _edge("end_validation", S.VALIDATING, S.GENERATING),
            actions=("shutdown_engine", "build_engine", "resume_collector"),
        ),
        expected=_ALL,
    ),
    Mutant(
        "last-step-wakes",
        R.CHECKPOINT_SUSPENDS,
        "the last step resumes engine and collector (Done re-declared awake, so the validator agrees)",
        spec=_last_step_wakes(),
        expected=frozenset({"checker", "hypothesis"}),
    ),
    Mutant(
        "weight-version-bumped-twice",
        R.WEIGHT_VERSIONS,
        "the training transition bumps the weight version twice",
        spec=edit_transitions(
            LIFECYCLE,
            _edge("train", S.DRAINING, S.TRAINING),
            actions=("restore_training_buffers", "train_step", "bump_weight_version", "bump_weight_version"),
        ),
        expected=_NOT_VALIDATOR,
    ),
    Mutant(
        "weight-version-not-bumped",
        R.WEIGHT_VERSIONS,
        "the training transition never bumps the weight version",
        spec=edit_transitions(
            LIFECYCLE, _edge("train", S.DRAINING, S.TRAINING), actions=("restore_training_buffers", "train_step")
        ),
        expected=_ALL,  # the validator's walk finds the step stuck in Training (no conclude is ever enabled)
    ),
    Mutant(
        "buffer-trains-on-stale",
        R.WEIGHT_VERSIONS,
        "the replay buffer never evicts by age, so sample() can return stale groups",
        buffer_class=lambda: _stale_tolerant_buffer(),
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "buffer-drops-stale-silently",
        R.WEIGHT_VERSIONS,
        "the replay buffer evicts stale groups without counting them",
        buffer_class=lambda: _silently_dropping_buffer(),
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "staleness-from-newest-version",
        R.WEIGHT_VERSIONS,
        "the replay buffer counts the age of a group that spans versions (parked through a step) from its newest",
        buffer_class=lambda: _newest_version_buffer(),
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "in-flight-cap-ignores-actor",
        R.BOUNDED_INFLIGHT,
        "the in-flight cap is num_prompts_per_step * max_trajectory_age_steps only",
        cap_class=AgeOnlyInFlightCap,
        expected=frozenset({"hypothesis", "properties"}),
    ),
    Mutant(
        "parallelism-check-ignores-expert-parallel",
        R.PARALLELISM_MATCHES,
        "the generation-side parallelism check compares TP and PP only",
        parallelism_check=parallelism_check_tp_pp_only,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "parallelism-cp-mismatch-silent",
        R.PARALLELISM_MATCHES,
        "a generation-side context_parallel_size that cannot apply is ignored without a warning",
        parallelism_check=parallelism_check_cp_silent,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "throughput-against-step",
        R.WALL_CLOCK_THROUGHPUT,
        "metrics are written against the step count instead of elapsed wall-clock seconds",
        metrics_logger=step_axis_metrics_logger,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "suspend-not-at-step-boundary",
        R.PARK_NOT_DRAIN,
        "suspend suspends the engine at once and the engine loop keeps decoding through the handoff",
        batcher_class=_no_boundary_suspend_batcher,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "tp-ranks-step-independently",
        R.ONE_COMMUNICATOR,
        "each tensor-parallel rank's engine loop admits requests and takes the suspend on its own (peers drift by a "
        "decode step and the next handoff desyncs)",
        batcher_class=_independent_tp_batcher,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "parked-request-dropped-on-resume",
        R.PARK_NOT_DRAIN,
        "the resume forgets the parked requests: they never complete",
        batcher_class=_dropping_resume_batcher,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "parked-request-resumed-twice",
        R.PARK_NOT_DRAIN,
        "the resume adds every parked request to the engine again: its tokens are generated twice",
        batcher_class=_double_resume_batcher,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "inference-optimized-training-without-opt-in",
        R.DUAL_MODE_OPT_IN,
        "a dual-mode (inference_optimized) model is trained without allow_inference_optimized_training",
        trainable_check=trainable_without_opt_in,
        expected=frozenset({"properties"}),
    ),
    Mutant(
        "fingerprint-omits-mode-digest",
        R.UNIFORM_MODEL_MODE,  # the fingerprint has it
        "the handoff barrier's fingerprint leaves out the model-mode digest, so ranks in different modes pass it",
        lifecycle_class=DigestlessLifecycle,
        expected=frozenset({"ranks"}),
    ),
    Mutant(
        "mode-reset-on-one-rank",
        R.UNIFORM_MODEL_MODE,  # reset on every rank
        "the engine's suspend resets the model mode on one rank only; the others keep their decode-time padding",
        engine_factory=one_rank_resets_mode,
        expected=frozenset({"ranks"}),
    ),
    Mutant(
        "nemo-wake-before-finalize",
        R.CHECKPOINT_SUSPENDS,  # every checkpoint collective done before any wake
        "the NeMo-RL preset wakes after an async save without its finalize (the save still runs in the background)",
        spec=_nemo_wake_before_finalize(),
        expected=_ALL,
    ),
    Mutant(
        "nemo-validation-after-save",
        R.STEP_ORDER_IS_DATA,  # the step order is the spec's (NeMo-RL validates before the save)
        "the NeMo-RL preset saves first and validates after, so the step's validation metric misses the checkpoint",
        spec=_nemo_validation_after_save(),
        expected=_NOT_VALIDATOR,
    ),
    Mutant(
        "nemo-early-stop-without-save",
        R.STEP_ORDER_IS_DATA,  # an early stop upgrades its step to save-and-stop
        "the NeMo-RL preset's early stop ends the run without saving",
        spec=_nemo_early_stop_without_save(),
        expected=frozenset({"validator", "checker", "hypothesis"}),
    ),
    Mutant(
        "nemo-val-at-end-resumes-collection",
        R.STEP_ORDER_IS_DATA,  # the last step's validation wake never resumes collection
        "the NeMo-RL preset resumes the collector after validating on the last step",
        spec=_nemo_val_at_end_resumes_collection(),
        expected=frozenset({"checker", "hypothesis"}),
    ),
    Mutant(
        "engine-serves-while-suspended",
        R.ONE_COMMUNICATOR,
        "the docs' toy engine whose suspend() reports suspended and keeps serving requests (during training too)",
        adapters=_lying_docs_adapters(),
        expected=frozenset({"hypothesis"}),  # only what the engine does shows it: the spec and its reports are right
    ),
    Mutant(
        "engine-serves-while-suspended-nemo",
        R.ONE_COMMUNICATOR,
        "a NeMo-RL-shaped engine whose suspend() reports suspended (condition, requests parked) and keeps serving",
        spec=NEMO_RL,
        adapters=_lying_nemo_adapters(),
        expected=frozenset({"hypothesis"}),
    ),
)
"""Every mutant the proof runs."""


# ---------------------------------------------------------------------------------------------- killers
def kill_by_validator(m: Mutant) -> str | None:
    """The static validator's objection, or None."""
    try:
        validate_spec(m.spec)
    except SpecError as exc:
        return str(exc)
    return None


def kill_by_runtime(m: Mutant) -> str | None:
    """Run the mutant's runtime machine (spec validation off) through a directed run; its own error, or None.

    The run: a plain step, a periodic save, a validation, a periodic save with validation, a save by deadline
    (the "must save by" time rule fires), and a saving last step; then stop.
    """
    _j, engine, trainer, collector, _ = recording_adapters()
    clock = FakeClock()
    decided = {f for a in m.spec.actions for f in a.decides}
    nemo = Fact.STOP_EARLY in decided or Fact.VALIDATE_AT_START in decided
    lc = m.lifecycle_class(
        engine,
        trainer,
        collector,
        config=LifecycleConfig(
            num_steps=6,
            rank=0,
            world_size=1,
            val_at_start=Fact.VALIDATE_AT_START in decided,
            val_at_end=nemo,
        ),
        early_stop=LatchedDecision("early_stop", lambda step: False) if Fact.STOP_EARLY in decided else None,
        drain=m.drain_class(3, synchronize=lambda _d: None),
        checkpoint=m.checkpoint_class(2, must_save_by_s=25.0, clock=clock, deadline_stop=False),
        validation=LatchedDecision("validation", lambda step: step in (2, 3)),
        validator=lambda _s, _w: {"accuracy": 1.0},
        spec=m.spec,
        check_spec=False,
    )
    try:
        lc.start()
        i = 0
        while not lc.finished:
            if i == 4:
                clock.advance(30.0)  # the "must save by" deadline passes: step 4 saves by time
            lc.step([i])
            if lc.state is S.VALIDATING:
                lc.end_validation()
            i += 1
        lc.stop()
    except LifecycleError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        lc.close()
    return None


def kill_by_checker(m: Mutant, ranks: Sequence[int] = (2, 3)) -> str | None:
    """The first violation the exhaustive checker finds (with the shortest counterexample's length), or None."""
    for n in ranks:
        for scenario in scenarios_for(m.spec):
            kwargs = m.checker_kwargs(scenario)
            if "rank0_steps" in kwargs and scenario != "all-step-kinds":
                continue
            res = check(n, scenario=scenario, **kwargs)
            if not res.ok:
                steps = len([line for line in res.counterexample if line.strip()[:1].isdigit()])
                return f"N={n} {scenario}: {res.violation} (shortest trace: {steps} actions)"
    return None


def kill_by_hypothesis(m: Mutant, max_examples: int = 500, *, directed_first: bool = False) -> str | None:
    """The first failing program the lifecycle machine finds (no shrinking, derandomized), or None.

    ``directed_first``: run the :data:`DIRECTED_PASSES` before the drawn programs instead of after them. The same
    programs run either way (each pass is derandomized, independent of the others) and the killer stops at the
    first failing one, so a mutant is killed in one order exactly when it is in the other; only the evidence may
    come from another pass. A mutant only a directed pass catches is caught without first running every drawn
    program (tests/test_mutants.py)."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.stateful import run_state_machine_as_test

    s = settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        stateful_step_count=30,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    level = logging.getLogger("colo_fsm").level
    logging.getLogger("colo_fsm").setLevel(logging.CRITICAL)
    try:
        machine = m.machine()
        # the drawn programs, then programs whose every step validates (or saves): the paths behind a decision
        # that only some steps take (an early stop after a validation) come in every one of those
        for fixed in (*DIRECTED_PASSES, {}) if directed_first else ({}, *DIRECTED_PASSES):
            passes = settings(s, max_examples=max_examples if not fixed else DIRECTED_EXAMPLES)
            directed = type(machine.__name__, (machine,), {"fixed_options": fixed}) if fixed else machine
            run_state_machine_as_test(directed, settings=passes)
    except Exception as exc:
        text = [line.strip() for line in str(exc).strip().splitlines()[:2]]
        return f"{type(exc).__name__}: {' '.join(text)}"
    finally:
        logging.getLogger("colo_fsm").setLevel(level)
    return None


DIRECTED_PASSES: tuple[dict[str, Any], ...] = ({"validate_every": 1}, {"checkpoint_every": 1})
"""After its drawn programs the hypothesis killer runs these: every step validates, then every step saves."""
DIRECTED_EXAMPLES = 100


def kill_by_properties(m: Mutant) -> str | None:
    """The first component property (:mod:`tests.support.properties`) the mutant's components break, or None."""
    from tests.support import properties as p

    checks: list[tuple[str, Callable[[], None]]] = [
        ("latch", lambda: p.check_latch_property(m.checkpoint_class)),
        ("in-flight cap", lambda: p.check_in_flight_cap_property(m.cap_class)),
        ("parallelism", lambda: p.check_parallelism_property(m.parallelism_check or check_parallelism)),
        (
            "wall-clock metrics",
            lambda: p.check_wall_clock_metrics_property(m.metrics_logger() if m.metrics_logger else None),
        ),
        ("dual-mode opt-in", lambda: p.check_trainable_property(m.trainable_check)),
        ("replay buffer", lambda: p.check_replay_buffer_property(m.buffer_class() if m.buffer_class else None)),
        ("parking", lambda: p.check_parking_property(m.batcher_class() if m.batcher_class else None)),
        ("tp lockstep", lambda: p.check_tp_lockstep_property(m.batcher_class() if m.batcher_class else None)),
    ]
    for name, run in checks:
        try:
            run()
        except AssertionError as exc:
            text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()][:2]
            return f"{name} property: {' '.join(text)}"
    return None


def _run_ranks(m: Mutant, world: int, planted: bool) -> dict[int, BaseException | None]:
    """Each rank (a thread) runs two steps on the mutant's machine; ``planted``: rank 1's engine never resets."""
    shared = threading.Barrier(world)
    outcome: dict[int, BaseException | None] = {}

    def run(rank: int) -> None:
        j = Journal()
        engine = ModalEngine(j, reset_on_suspend=False) if planted and rank == 1 else m.engine_factory(rank)
        lc = m.lifecycle_class(
            engine,
            RecordingTrainer(j),
            RecordingCollector(j),
            config=LifecycleConfig(num_steps=2, rank=rank, world_size=world),
            drain=m.drain_class(rank, synchronize=lambda _d: None),
            barrier=ThreadBarrier(shared, rank, timeout_s=2.0),
            checkpoint=m.checkpoint_class(2),
            spec=m.spec,
            check_spec=False,
        )
        try:
            lc.start()
            while not lc.finished:
                engine.decode_step(padding=rank == world - 1)  # rank-local padding, per decode step
                lc.step([rank])
                if lc.state is S.VALIDATING:
                    lc.end_validation()
            lc.stop()
            outcome[rank] = None
        except Exception as exc:
            outcome[rank] = exc  # a peer waiting for this rank at a later barrier times out (2 s)
        finally:
            lc.close()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    return outcome


def kill_by_ranks(m: Mutant, world: int = 2) -> str | None:
    """Two ranks over a fingerprint barrier: a healthy program must pass; a planted mode divergence must make
    every rank raise HandoffDivergence. The first broken expectation, or None."""
    healthy = _run_ranks(m, world, planted=False)
    failed = {r: e for r, e in healthy.items() if e is not None}
    if failed or len(healthy) < world:
        r, e = next(iter(failed.items())) if failed else (-1, None)
        return f"healthy {world}-rank run failed on rank {r}: {type(e).__name__}: {e}"
    planted = _run_ranks(m, world, planted=True)
    missed = {r: e for r, e in planted.items() if not isinstance(e, HandoffDivergence)}
    if missed or len(planted) < world:
        got = ", ".join(f"rank {r}: {type(e).__name__ if e else 'no error'}" for r, e in sorted(missed.items()))
        return f"rank 1 left in decode mode, yet not every rank raised HandoffDivergence at the barrier ({got})"
    return None


_KILL: dict[str, Callable[[Mutant], str | None]] = {
    "validator": kill_by_validator,
    "runtime": kill_by_runtime,
    "checker": kill_by_checker,
    "hypothesis": kill_by_hypothesis,
    "properties": kill_by_properties,
    "ranks": kill_by_ranks,
}


@dataclass
class MutantResult:
    """Which killers caught one mutant, with their evidence and time."""

    name: str
    breaks: str
    killed_by: dict[str, str] = field(default_factory=dict)
    survived_by: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)

    @property
    def killed(self) -> bool:
        return bool(self.killed_by)

    @property
    def missing(self) -> list[str]:
        """Expected killers that did not catch it."""
        return [k for k in self.expected if k not in self.killed_by]


HYPOTHESIS_EXAMPLES = 600
"""Programs the hypothesis killer may run per mutant (it stops at the first kill). 600 since a program can stop
from any state: the kit's programs stop in Draining too, and the in-flight-cap mutant needs between 300 and 600
of them to be caught (about 10 s more for it; the others are caught sooner)."""


def evaluate(
    m: Mutant,
    killers: Iterable[str] = KILLERS,
    *,
    hypothesis_examples: int = HYPOTHESIS_EXAMPLES,
    directed_first: bool = False,
) -> MutantResult:
    """Run ``killers`` against ``m`` (the hypothesis killer with up to ``hypothesis_examples`` programs, its
    directed passes first with ``directed_first``: :func:`kill_by_hypothesis`)."""
    res = MutantResult(m.name, m.breaks.value if m.breaks else "-", expected=sorted(m.expected))
    for k in killers:
        t0 = time.perf_counter()
        evidence = (
            kill_by_hypothesis(m, hypothesis_examples, directed_first=directed_first)
            if k == "hypothesis"
            else _KILL[k](m)
        )
        res.seconds[k] = round(time.perf_counter() - t0, 3)
        if evidence is None:
            res.survived_by.append(k)
        else:
            res.killed_by[k] = evidence
    return res


def table(results: Sequence[MutantResult]) -> str:
    """A text table: mutant, a mark per killer (x killed, . not, - not run), and the rule it breaks."""
    widths = [max(len(k), 7) for k in KILLERS]
    head = f"{'mutant':<44} " + " ".join(f"{k:>{w}}" for k, w in zip(KILLERS, widths)) + "  breaks"
    lines = [head, "-" * len(head)]
    for r in results:
        marks = []
        for k, width in zip(KILLERS, widths):
            mark = "x" if k in r.killed_by else ("." if k in r.survived_by else "-")
            marks.append(f"{mark:>{width}}")
        lines.append(f"{r.name:<44} {' '.join(marks)}  {r.breaks}")
    return "\n".join(lines)


def checker_main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.support.mutants NAME [--ranks 2..3 --scenario S --json PATH]``: the exhaustive checker
    (:func:`colo_fsm.testing.checker.main`) on one mutant; exit status 1 when it finds the violation."""
    import sys

    from colo_fsm.testing.checker import main as check_main

    args = list(sys.argv[1:] if argv is None else argv)
    by_name = {m.name: m for m in MUTANTS}
    if not args or args[0] not in by_name:
        known = ", ".join(by_name)
        raise SystemExit(f"usage: python -m tests.support.mutants NAME [checker options]; NAME is one of {known}")
    return check_main(args[1:], **by_name[args[0]].checker_kwargs())


__all__ = [
    "HYPOTHESIS_EXAMPLES",
    "KILLERS",
    "MUTANTS",
    "SUITE_MUTANTS",
    "AgeOnlyInFlightCap",
    "CallingThreadDrain",
    "DigestlessLifecycle",
    "Mutant",
    "MutantResult",
    "RequeryingLifecycle",
    "SuiteMutant",
    "UnlatchedCheckpointDecision",
    "checker_main",
    "current_device",
    "edit_state",
    "edit_transitions",
    "evaluate",
    "kill_by_checker",
    "kill_by_hypothesis",
    "kill_by_properties",
    "kill_by_ranks",
    "kill_by_runtime",
    "kill_by_suite_test",
    "kill_by_validator",
    "one_rank_resets_mode",
    "set_current_device",
    "table",
]


if __name__ == "__main__":
    raise SystemExit(checker_main())
