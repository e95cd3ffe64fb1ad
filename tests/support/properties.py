"""Property-based checks of colo-fsm's own components, each marked with the lifecycle rule it checks.

Each function runs a small ``hypothesis`` search against one component (ours by default, or yours / a mutant
passed in) and raises ``AssertionError`` with a counterexample, marked with the rule, when the component breaks it
(:func:`~colo_fsm.states.rules.rule_of` gives a function's rule):

* :func:`check_latch_property` (``DECIDE_ONCE``): a checkpoint decision asked twice in a step gives one answer,
  and a "must save by" deadline is never lost;
* :func:`check_in_flight_cap_property` (``BOUNDED_INFLIGHT``): the cap leaves the receiving actor's control
  headroom free;
* :func:`check_parallelism_property` (``PARALLELISM_MATCHES``): TP/PP/EP/ETP mismatches raise naming both
  values, CP warns;
* :func:`check_wall_clock_metrics_property` (``WALL_CLOCK_THROUGHPUT``): throughput is logged against elapsed
  wall-clock time;
* :func:`check_replay_buffer_property` (``WEIGHT_VERSIONS``): no stale group sampled, none silently dropped;
* :func:`check_trainable_property` (``DUAL_MODE_OPT_IN``): training a dual-mode (inference_optimized) model is
  opt-in (needs megatron-core).
* :func:`check_parking_property` (``PARK_NOT_DRAIN``): the engine loop suspends at a decode-step boundary with
  its requests parked, and each parked request resumes exactly once.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colo_fsm.errors import ConfigError, ParallelismMismatch
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.guards.decision import CheckpointDecision
from colo_fsm.guards.parallelism import (
    ACTIVATION_SHARDING_FIELDS,
    WEIGHT_SHARDING_FIELDS,
    ParallelismWarning,
    check_parallelism,
)
from colo_fsm.states.rules import LifecycleRule, checks
from colo_fsm.testing.fakes import FakeClock

R = LifecycleRule


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@checks(R.DECIDE_ONCE)
def check_latch_property(decision_class: Callable[..., Any] = CheckpointDecision, max_examples: int = 200) -> None:
    """Within a step every query agrees; period and the one-shot deadline decide exactly as documented."""

    @_settings(max_examples)
    @given(
        every=st.one_of(st.none(), st.integers(1, 4)),
        deadline=st.sampled_from([0.0, 3.0, 10.0]),
        ticks=st.lists(st.sampled_from([0.0, 1.0, 4.0]), min_size=1, max_size=8),
        queries=st.integers(2, 4),
    )
    def prop(every: int | None, deadline: float, ticks: list[float], queries: int) -> None:
        clock = FakeClock()
        start = clock()
        d = decision_class(every, must_save_by_s=deadline, clock=clock)
        fired = False
        for step, dt in enumerate(ticks):
            clock.advance(dt)
            answers = [d.decide(step) for _ in range(queries)]
            assert len(set(answers)) == 1, f"step {step}: one decision asked {queries} times said {answers}"
            due = clock() >= start + deadline
            expected = (every is not None and (step + 1) % every == 0) or (due and not fired)
            fired = fired or due
            assert answers[0] == expected, f"step {step}: decided save={answers[0]}, the rules say {expected}"

    prop()


@checks(R.BOUNDED_INFLIGHT)
def check_in_flight_cap_property(cap_class: Callable[..., InFlightCap] = InFlightCap, max_examples: int = 300) -> None:
    """``value * samples_per_group <= actor_max_concurrency - control_headroom`` and within the age bound."""

    @_settings(max_examples)
    @given(
        prompts=st.integers(1, 256),
        age=st.integers(1, 4),
        spg=st.integers(1, 64),
        amc=st.sampled_from([8, 64, 256, 1000, 4096]),
        headroom=st.integers(0, 16),
    )
    def prop(prompts: int, age: int, spg: int, amc: int, headroom: int) -> None:
        try:
            cap = cap_class(prompts, age, spg, amc, headroom)
        except ConfigError:
            return
        assert cap.value <= prompts * age, f"{cap.explain()}: above the age bound"
        assert cap.value * spg <= amc - headroom, (
            f"{cap.explain()}: {cap.value} groups x {spg} calls leave no headroom on an actor of {amc}"
        )
        assert cap.value >= 1
        assert cap.lowered == (cap.value < prompts * age)

    prop()


@checks(R.PARALLELISM_MATCHES)
def check_parallelism_property(check: Callable[[Any, Any], Any] = check_parallelism, max_examples: int = 300) -> None:
    """A TP/PP/EP/ETP mismatch raises naming both values; a CP mismatch only warns; equal sizes pass."""
    sizes = st.sampled_from([1, 2, 4, 8])
    fields = (*WEIGHT_SHARDING_FIELDS, *ACTIVATION_SHARDING_FIELDS)

    @_settings(max_examples)
    @given(train=st.fixed_dictionaries({f: sizes for f in fields}), gen=st.dictionaries(st.sampled_from(fields), sizes))
    def prop(train: dict[str, int], gen: dict[str, int]) -> None:
        bad = [f for f in WEIGHT_SHARDING_FIELDS if f in gen and gen[f] != train[f]]
        cp_differs = any(f in gen and gen[f] != train[f] for f in ACTIVATION_SHARDING_FIELDS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check(train, gen)
            except ParallelismMismatch as exc:
                assert bad, f"{train} / {gen}: raised {exc} with no weight-sharding mismatch"
                assert exc.field in bad and str(exc.training) in str(exc) and str(exc.generation) in str(exc)
                return
        assert not bad, f"{train} / {gen}: {bad} differ but nothing was raised"
        warned = any(issubclass(w.category, ParallelismWarning) for w in caught)
        assert warned == cp_differs, f"{train} / {gen}: context_parallel_size differs={cp_differs}, warned={warned}"

    prop()


@checks(R.WALL_CLOCK_THROUGHPUT)
def check_wall_clock_metrics_property(logger_class: Callable[..., Any] | None = None, max_examples: int = 50) -> None:
    """Each record's ``elapsed_s`` is wall-clock time since start (not the step), throughput per second."""
    if logger_class is None:
        from colo_fsm.metrics import MetricsLogger

        logger_class = MetricsLogger

    @_settings(max_examples)
    @given(steps=st.lists(st.tuples(st.sampled_from([0.1, 1.0, 30.0]), st.integers(0, 64)), min_size=1, max_size=6))
    def prop(steps: list[tuple[float, int]]) -> None:
        clock = FakeClock()
        with tempfile.TemporaryDirectory() as tmp:
            m = logger_class(tmp, tensorboard=False, clock=clock)
            try:
                t0, total = clock(), 0
                for i, (dt, n) in enumerate(steps):
                    clock.advance(dt)
                    total += n
                    rec = m.log(i, {"loss": 1.0}, consumed_samples=n)
                    elapsed = clock() - t0
                    assert abs(rec["elapsed_s"] - elapsed) < 1e-3, (
                        f"step {i}: elapsed_s={rec['elapsed_s']}, wall-clock {elapsed}"
                    )
                    assert rec["train/consumed_samples"] == total
                    assert abs(rec["train/samples_per_s"] - total / elapsed) < 1e-6 * max(1.0, total / elapsed)
            finally:
                m.close()

    prop()


@checks(R.WEIGHT_VERSIONS)
def check_replay_buffer_property(buffer_class: Callable[..., Any] | None = None, max_examples: int = 200) -> None:
    """The staleness half: no group older than ``max_trajectory_age_steps`` is ever sampled, and every group
    put is accounted for as sampled, evicted (counted) or still buffered -- never silently dropped. Groups may
    span weight versions (parked through a step); their age is counted from the oldest version."""
    from colo_fsm.adapters.protocols import Completion
    from colo_fsm.collector.buffer import ReplayBuffer, TrajectoryGroup
    from colo_fsm.errors import WaitTimeout

    cls = buffer_class or ReplayBuffer
    op = st.one_of(
        st.tuples(st.just("put"), st.integers(0, 3), st.integers(0, 2)),  # started `lag` versions ago, `span` long
        st.tuples(st.just("advance"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("sample"), st.just(0), st.just(0)),
    )

    @_settings(max_examples)
    @given(n=st.integers(1, 3), max_age=st.integers(0, 2), ops=st.lists(op, max_size=40))
    def prop(n: int, max_age: int, ops: list[tuple[str, int, int]]) -> None:
        buf = cls(n, max_age)
        version, put, sampled = 0, 0, 0
        for i, (kind, arg, span) in enumerate(ops):
            if kind == "put":
                wv = max(0, version - arg)
                last = min(version, wv + span)  # its last tokens came from a newer version
                sample = Completion("yz", (1, 2), wv, weight_versions=(wv, last))
                g = TrajectoryGroup(f"p{i}", "x", (sample,), (0.0,), weight_version=wv)
                buf.put(g)
                put += 1
            elif kind == "advance":
                version += arg
                buf.advance(version)
            elif len(buf) >= n:  # enough groups buffered, fresh or not: the buffer must pick only fresh ones
                try:
                    batch = buf.sample(version, timeout=0)
                except WaitTimeout:  # stale ones evicted, too few fresh left: nothing taken
                    batch = []
                sampled += len(batch)
                ages = [g.age(version) for g in batch]
                assert all(a <= max_age for a in ages), f"sampled ages {ages} > max_trajectory_age_steps={max_age}"
            evicted = buf.stats().evicted_stale
            assert put == sampled + evicted + len(buf), (
                f"{put} put != {sampled} sampled + {evicted} evicted + {len(buf)} buffered: a group was lost"
            )

    prop()


@checks(R.DUAL_MODE_OPT_IN)
def check_trainable_property(check: Callable[..., None] | None = None) -> None:
    """An ``inference_optimized`` model trains only with ``allow_inference_optimized_training=True``."""
    if check is None:
        from colo_fsm.adapters.megatron.model import check_trainable

        check = check_trainable

    class Cfg:
        def __init__(self, impl: str) -> None:
            self.transformer_impl = impl

    for impl in ("local", "transformer_engine"):
        check(Cfg(impl), allow_inference_optimized_training=False)
    check(Cfg("inference_optimized"), allow_inference_optimized_training=True)
    try:
        check(Cfg("inference_optimized"), allow_inference_optimized_training=False)
    except ConfigError as exc:
        assert exc.field == "allow_inference_optimized_training"
        return
    raise AssertionError("an inference_optimized model was accepted for training without the opt-in")


class ScriptedStepBackend:
    """A deterministic :class:`~colo_fsm.adapters.batching.StepBackend` for the batcher's own properties.

    Request ``r``'s ``i``-th token is ``(r.prompt_ids[0] + i) % 50``, so every completion is known in advance.
    Steps run only as far as :meth:`grant` allows (or freely after :meth:`run_free`), which lets a check put a
    decode step in flight exactly when it calls suspend. It records what a real engine must never see: a step
    while suspended, a suspend or resume while a step runs.
    """

    name = "scripted"

    def __init__(self) -> None:
        import threading

        self.rows: list[list[Any]] = []  # [request, tokens generated]
        self.suspended = False
        self.in_step = False
        self.steps = 0
        self.violations: list[str] = []
        self._gate = threading.Condition()
        self._budget = 0
        self._free = False

    def grant(self, n: int) -> None:
        """Let ``n`` more steps run."""
        with self._gate:
            self._budget += n
            self._gate.notify_all()

    def run_free(self) -> None:
        """Let every further step run without a grant."""
        with self._gate:
            self._free = True
            self._gate.notify_all()

    def wait_steps(self, n: int, done: Callable[[], bool]) -> None:
        """Wait until ``n`` steps ran or ``done()`` says there is nothing left to step."""
        with self._gate:
            for _ in range(10_000):
                if self.steps >= n or done():
                    return
                self._gate.wait(0.001)

    def add(self, request: Any) -> None:
        self.rows.append([request, 0])

    def step(self) -> list[Any]:
        from colo_fsm.adapters.batching import StepOutput

        with self._gate:
            while not self._free and self._budget <= 0:
                self._gate.wait()
            if not self._free:
                self._budget -= 1
        if self.suspended:
            self.violations.append(f"decode step {self.steps} ran while suspended")
        self.in_step = True
        out = []
        for row in self.rows:
            req, i = row
            row[1] = i + 1
            done = "length" if i + 1 >= req.max_tokens else None
            out.append(StepOutput(req.request_id, ((req.prompt_ids[0] + i) % 50,), (-1.0,), done))
        self.rows = [r for r in self.rows if r[1] < r[0].max_tokens]
        self.in_step = False
        with self._gate:
            self.steps += 1
            self._gate.notify_all()
        return out

    def abort(self, request_id: int) -> None:
        self.rows = [r for r in self.rows if r[0].request_id != request_id]

    def suspend(self) -> float:
        if self.in_step:
            self.violations.append("suspend while a decode step was in flight")
        self.suspended = True
        return 0.0

    def resume(self) -> float:
        if self.in_step:
            self.violations.append("resume while a decode step was in flight")
        self.suspended = False
        return 0.0

    def shutdown(self) -> None:
        self.rows = []


@checks(R.PARK_NOT_DRAIN)
def check_parking_property(batcher_class: Callable[..., Any] | None = None, max_examples: int = 15) -> None:
    """Suspend returns with no decode step in flight and none runs until the
    resume; requests admitted before it are parked (not waited for); after the resume each parked request
    continues exactly once, under the new weight version, and completes with exactly its own tokens."""
    import threading
    import time

    from colo_fsm.adapters.batching import ContinuousBatcher

    cls = batcher_class or ContinuousBatcher

    @_settings(max_examples)
    @given(
        lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
        suspend_after=st.integers(0, 6),
        max_active=st.integers(1, 6),
    )
    def prop(lengths: list[int], suspend_after: int, max_active: int) -> None:
        backend = ScriptedStepBackend()
        version = [0]
        b = cls(lambda: backend, weight_version=lambda: version[0], max_active_requests=max_active)
        b.start()
        try:
            handles = [b.submit([10 + i], max_tokens=n) for i, n in enumerate(lengths)]
            backend.grant(suspend_after)
            backend.wait_steps(suspend_after, lambda: all(h.done() for h in handles))
            parked_before = {h.request_id for h in handles if not h.done()}
            suspender = threading.Thread(target=b.suspend)
            suspender.start()
            backend.grant(1)  # the decode step in flight when suspend is called
            suspender.join()
            assert not b.decode_in_flight, "suspend returned with a decode step in flight"
            steps = backend.steps
            backend.run_free()  # "the training step": an engine loop that kept going would step now
            with backend._gate:
                backend._gate.wait(0.02)
            version[0] = 1
            assert backend.steps == steps, f"{backend.steps - steps} decode step(s) ran during the handoff"
            assert not backend.violations, backend.violations
            b.resume()
            for _ in range(30_000):  # until the engine is idle (bounded: a hung loop fails, never hangs the check)
                if b.counts() == (0, 0, 0) and not b.decode_in_flight:
                    break
                time.sleep(0.001)
            else:
                raise AssertionError(f"requests never finished: {b.counts()}")
            lost = [h.request_id for h in handles if not h.future.done()]
            assert not lost, f"parked request(s) {lost} were dropped on resume (never completed)"
            for i, (h, n) in enumerate(zip(handles, lengths)):
                c = h.result(timeout=0)
                want = tuple((10 + i + k) % 50 for k in range(n))
                assert c.token_ids == want and c.finish_reason == "length", (
                    f"request {i}: tokens {c.token_ids}, expected {want} (duplicated or lost tokens)"
                )
                assert list(c.weight_versions) == sorted(c.weight_versions), c.weight_versions
                if h.request_id in parked_before and len(c.token_ids) > suspend_after + 1:
                    assert c.weight_versions[-1] == 1, f"request {i} did not continue under the new version"
            assert b.completed == len(lengths), f"{b.completed} completions for {len(lengths)} requests"
            assert not backend.violations, backend.violations
        finally:
            backend.run_free()
            b.shutdown()

    try:
        prop()
    except BaseExceptionGroup as group:  # a thread race may fail a replay at another assertion: one verdict
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise AssertionError(f"parking property broken: {first}") from group


class ThreadLockstep:
    """A :class:`~colo_fsm.adapters.lockstep.Lockstep` for ranks as threads: rank 0's plan, via the wire form."""

    def __init__(self, shared: Any, slot: list[Any], rank: int, width: int = 64) -> None:
        self.shared, self.slot, self.leader, self.width = shared, slot, rank == 0, width

    def agree(self, plan: Any) -> Any:
        from colo_fsm.adapters.lockstep import StepPlan

        if self.leader:
            self.slot[0] = StepPlan.from_ints(plan.to_ints(self.width))
        self.shared.wait(timeout=30)
        got = self.slot[0]
        self.shared.wait(timeout=30)
        return got


class RecordingStepBackend:
    """A step backend that ends each request after ``len(prompt)`` tokens and records every call in ``log``."""

    name = "recording"

    def __init__(self, log: list[Any]) -> None:
        self.log: list[Any] = log
        self.rows: dict[int, int] = {}

    def add(self, req: Any) -> None:
        self.rows[req.request_id] = len(req.prompt_ids)
        self.log.append(("add", req.request_id))

    def step(self) -> list[Any]:
        import time

        from colo_fsm.adapters.batching import StepOutput

        self.log.append(("step", tuple(sorted(self.rows))))
        out = []
        for rid in list(self.rows):
            self.rows[rid] -= 1
            done = self.rows[rid] == 0
            out.append(StepOutput(rid, (5,), (0.0,), "length" if done else None))
            if done:
                del self.rows[rid]
        time.sleep(0.001)
        return out

    def abort(self, rid: int) -> None:
        self.rows.pop(rid, None)
        self.log.append(("abort", rid))

    def suspend(self) -> float:
        self.log.append(("suspend",))
        return 0.0

    def resume(self) -> float:
        self.log.append(("resume",))
        return 0.0

    def shutdown(self) -> None:
        self.log.append(("shutdown",))


def tp_schedules(batcher_class: Callable[..., Any] | None, *, seed: int, lockstep: bool = True) -> list[list[Any]]:
    """Two TP ranks (threads) run one SPMD program (same requests at different paces, same suspend/resume
    calls, one SPMD cancel); the backend call sequence of each rank."""
    import random
    import threading
    import time

    from colo_fsm.adapters.batching import ContinuousBatcher

    cls = batcher_class or ContinuousBatcher
    shared, slot, go = threading.Barrier(2), [None], threading.Barrier(2)
    logs: list[list[Any]] = [[], []]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            kw: dict[str, Any] = {"lockstep": ThreadLockstep(shared, slot, r)} if lockstep else {}
            b = cls(lambda: RecordingStepBackend(logs[r]), max_active_requests=3, **kw)
            b.start()
            rng = random.Random(seed * 10 + r)  # each rank submits at its own pace
            handles = []
            for cycle in range(4):
                for i in range(3):
                    handles.append(b.submit([1] * (1 + (cycle + i) % 4), max_tokens=8))
                    time.sleep(rng.random() * 0.004 + 0.002 * r)
                go.wait(timeout=30)  # the SPMD program reaches the handoff on both ranks
                b.suspend()
                b.resume()
            handles[1].cancel()
            for h in handles:
                h.result(timeout=30)
            go.wait(timeout=30)
            b.shutdown()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            shared.abort()
            go.abort()

    ts = [threading.Thread(target=rank, args=(r,), daemon=True) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts), "a rank of the TP pair is stuck"
    assert not errors, f"a rank failed: {errors[0]!r}"
    return logs


@checks(R.ONE_COMMUNICATOR)
def check_tp_lockstep_property(batcher_class: Callable[..., Any] | None = None, seeds: Sequence[int] = (1, 2)) -> None:
    """``LifecycleRule.ONE_COMMUNICATOR`` for tensor-parallel engines: with a lockstep, both ranks of a TP pair
    issue the identical backend call sequence (the same steps over the same rows), whatever their pace."""
    for seed in seeds:
        a, b = tp_schedules(batcher_class, seed=seed)
        assert a == b, (
            f"TP ranks decoded different schedules (seed {seed}): {len(a)} vs {len(b)} backend calls, "
            f"first difference at call {next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))}"
        )


__all__ = [
    "RecordingStepBackend",
    "ScriptedStepBackend",
    "ThreadLockstep",
    "check_in_flight_cap_property",
    "check_latch_property",
    "check_parallelism_property",
    "check_parking_property",
    "check_tp_lockstep_property",
    "check_trainable_property",
    "check_wall_clock_metrics_property",
    "tp_schedules",
]
