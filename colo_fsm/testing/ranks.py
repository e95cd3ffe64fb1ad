"""N sets of your adapters as thread ranks meeting at one barrier through a short run of the spec (their calls
audited for the handoff rules), then the exhaustive checker over N ranks of the same spec."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colo_fsm.guards.decision import CheckpointDecision, LatchedDecision, ValidationDecision
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import LIFECYCLE, Fact, LifecycleSpec
from colo_fsm.states.walk import last_step_validates
from colo_fsm.testing.components import (
    AdapterFactory,
    KitHandle,
    as_adapters,
    build_components,
    call_factory,
    watched_drain,
)
from colo_fsm.testing.watch import (
    Conditions,
    EventLog,
    FaultSwitch,
    HandoffAudit,
    LoopRunner,
    WatchedBarrier,
    WatchedCollector,
    WatchedEngine,
    WatchedTrainer,
    watched_synchronize,
)


@dataclass
class RanksResult:
    """What :func:`exercise_ranks` did: the adapters of every rank driven through a short run, then the checker."""

    ranks: int
    spec: str
    steps: int
    adapter_calls: int
    checks: list[Any]  # the checker's CheckResults for the same spec and N, one per scenario of the spec
    adapters_exercised: bool = True

    @property
    def check(self) -> Any:
        """The first failing CheckResult (else the first)."""
        return next((c for c in self.checks if not c.ok), self.checks[0])

    @property
    def ok(self) -> bool:
        """True when the checker found nothing (and, if exercised, every rank's adapters ran the short run)."""
        return all(c.ok for c in self.checks)

    def report(self) -> str:
        """The summary plus the checker's report of a failing scenario."""
        return self.summary() + ("" if self.ok else "\n" + self.check.report())

    def summary(self) -> str:
        """One line; it says plainly when only the spec was checked."""
        who = (
            f"{self.ranks} ranks of your adapters ran {self.steps} steps of spec {self.spec} "
            f"({self.adapter_calls} watched calls)"
            if self.adapters_exercised
            else f"spec {self.spec} only: no adapters were exercised"
        )
        verdict = "ok" if self.ok else f"VIOLATION: {self.check.violation}"
        return f"{who}; checker over {len(self.checks)} scenario(s) of N={self.ranks}: {verdict}"


def exercise_ranks(
    factory: AdapterFactory | None,
    ranks: int,
    *,
    spec: LifecycleSpec = LIFECYCLE,
    steps: int = 4,
    timeout_s: float = 60.0,
    batch_factory: Callable[[list[int], int], Any] | None = None,
    drain_factory: Callable[..., Callable[[], object]] | None = None,
    validator: Callable[[int, int], Any] | None = None,
    validator_factory: Callable[..., Callable[[int, int], Any]] | None = None,
    checkpoint_factory: Callable[..., LatchedDecision] | None = None,
    validation_factory: Callable[..., LatchedDecision] | None = None,
    early_stop_factory: Callable[..., LatchedDecision] | None = None,
    **check_kwargs: Any,
) -> RanksResult:
    """Drive ``ranks`` sets of *your* adapters (one factory call per rank) as thread ranks meeting at a barrier
    through a short run of ``spec`` (a save, a validation, the last step), auditing each rank's calls for the
    handoff rules, then prove every interleaving of ``ranks`` ranks of the spec with the exhaustive checker.

    Your components are used as the lifecycle machine uses them: ``batch_factory(trajectories, step)`` builds
    the batch each step trains on (default: the list of trajectory weight versions), ``drain_factory(local_rank[,
    handle])`` the drain (default: the shipped DeviceDrain of device ``rank``), and the decision and validator
    factories take the rank's :class:`KitHandle`. A factory that raises, an adapter that fails, or a handoff
    violation raises AssertionError naming the rank. With ``factory=None`` only the spec is checked, and the
    result says so (``adapters_exercised=False``).
    """
    from colo_fsm.guards.barrier import ThreadBarrier
    from colo_fsm.testing.checker import check_all

    result = check_all([ranks], spec=spec, **check_kwargs)
    if factory is None:
        return RanksResult(ranks, spec.name, 0, 0, result, adapters_exercised=False)
    shared = threading.Barrier(ranks)
    errors: dict[int, BaseException] = {}
    calls = [0] * ranks
    decided = {f for a in spec.actions for f in a.decides}
    val_at_end = last_step_validates(spec)

    def run_rank(rank: int) -> None:
        runner = LoopRunner()
        try:
            handle = KitHandle(spec, rank=rank, local_rank=rank)
            try:
                ad = as_adapters(call_factory(factory, handle))
            except Exception as exc:
                raise AssertionError(f"rank {rank}: the adapter factory raised {type(exc).__name__}: {exc}") from exc
            try:
                user = build_components(
                    handle,
                    checkpoint_factory=checkpoint_factory,
                    validation_factory=validation_factory,
                    early_stop_factory=early_stop_factory,
                    drain_factory=drain_factory,
                    validator_factory=validator_factory,
                )
            except Exception as exc:
                raise AssertionError(f"rank {rank}: a component factory raised {type(exc).__name__}: {exc}") from exc
            conditions = Conditions(engine=spec.state(spec.initial).engine)
            holder: list[Lifecycle] = []
            log = EventLog(lambda: holder[0].state.value if holder else spec.initial.value, conditions)
            faults = FaultSwitch()
            collector = WatchedCollector(ad.collector, log, faults, runner) if ad.collector is not None else None
            drain: Callable[[], object] = (
                watched_drain(user["drain"], rank, log, faults)
                if "drain" in user
                else DeviceDrain(rank, synchronize=watched_synchronize(log, faults))
            )
            early_stop = None
            if Fact.STOP_EARLY in decided:
                early_stop = user.get("early_stop") or LatchedDecision("early_stop", lambda _s: False)
            lc = Lifecycle(
                WatchedEngine(ad.engine, log, faults, runner),
                WatchedTrainer(ad.trainer, log, faults, runner),
                collector,
                config=LifecycleConfig(
                    num_steps=steps,
                    rank=rank,
                    world_size=ranks,
                    val_at_start=Fact.VALIDATE_AT_START in decided,
                    val_at_end=val_at_end,
                ),
                drain=drain,
                barrier=WatchedBarrier(ThreadBarrier(shared, rank, timeout_s=timeout_s), log, faults, rank=rank),
                checkpoint=user.get("checkpoint") or CheckpointDecision(2),
                validation=user.get("validation") or ValidationDecision(2),
                validator=user.get("validator", validator) or (lambda _s, _w: {"accuracy": 1.0}),
                early_stop=early_stop,
                spec=spec,
            )
            holder.append(lc)
            handle.lifecycle = lc
            audit = HandoffAudit(spec, rank)
            lc.start()
            while not lc.finished:
                if ad.rollout is not None:
                    ad.rollout()
                trajectories = [lc.weight_version]
                lc.step(batch_factory(trajectories, lc.step_index) if batch_factory is not None else trajectories)
                if spec.state(lc.state).validates:
                    lc.end_validation()
            lc.stop()
            bad = audit.feed(log.events)
            if bad:
                raise AssertionError(f"rank {rank}: " + "; ".join(bad[:3]))
            calls[rank] = len(log)
            if ad.close is not None:
                ad.close()
        except BaseException as exc:  # reported below, per rank
            errors[rank] = exc
            shared.abort()
        finally:
            runner.close()

    threads = [threading.Thread(target=run_rank, args=(r,), name=f"colo-fsm-rank-{r}") for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 4)
    if errors:
        first = min(errors)
        raise AssertionError(
            f"{len(errors)} of {ranks} ranks failed with your adapters; rank {first}: {errors[first]}"
        ) from errors[first]
    return RanksResult(ranks, spec.name, steps, sum(calls), result)


__all__ = ["RanksResult", "exercise_ranks"]
