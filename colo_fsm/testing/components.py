"""What the kit builds a program from: your adapters (with the probes and hooks derived from them), the handle your
factories get, and your components (drain, decisions, validator), each built by the factory you pass."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.guards.engine_state import engine_state_of
from colo_fsm.machine.lifecycle import Lifecycle
from colo_fsm.states.spec import EngineCondition, LifecycleSpec
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer
from colo_fsm.testing.watch import EventLog, FaultSwitch


@dataclass
class Adapters:
    """What an adapter factory returns: the three adapters, plus optional probes of their real conditions.

    ``engine_probe`` returns the engine's own idea of its condition (``"awake"``, ``"suspended"``, ...,
    or an :class:`EngineCondition`), ``collector_probe`` ``"running"``/``"paused"``. Without probes the machine
    checks the conditions its proxies track from the calls that returned. ``close`` runs after each program.
    """

    engine: Any
    trainer: Any
    collector: Any | None = None
    engine_probe: Callable[[], Any] | None = None
    collector_probe: Callable[[], Any] | None = None
    close: Callable[[], None] | None = None
    rollout: Callable[[], Any] | None = None  # start one rollout on your collector (it issues nothing when paused)
    decode: Callable[[], Any] | None = None  # let your engine run one decode step of its own loop
    decode_probe: Callable[[], int] | None = None  # decode steps your engine has run so far
    request_probe: Callable[[], Any] | None = None  # your engine's request_counts() (queued, running, parked)


AdapterFactory = Callable[..., Any]
"""A callable returning :class:`Adapters` or an ``(engine, trainer, collector)`` tuple. It takes no argument,
or one: the :class:`KitHandle` of the program, whose ``lifecycle`` is set once the machine has built it."""


@dataclass
class KitHandle:
    """What the kit hands your factories (adapters, checkpoint, validation, early stop, drain, validator): the
    spec it runs, the rank and local rank, and the lifecycle it builds for the program (set right after it is
    built, before anything runs: a rule or validator reads it when it is called, e.g. ``last_validation``)."""

    spec: LifecycleSpec
    lifecycle: Lifecycle | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    local_rank: int = 0

    @property
    def last_validation(self) -> Any:
        """The lifecycle's latest validation metrics (None before the first validation)."""
        return self.lifecycle.last_validation if self.lifecycle is not None else None

    @property
    def step(self) -> int:
        """The lifecycle's step index (steps trained so far, from ``start_step``)."""
        return self.lifecycle.step_index if self.lifecycle is not None else 0


def recording_fakes(*, engine_up: bool = False) -> Adapters:
    """The recording fakes of :mod:`colo_fsm.testing.fakes`, with probes reading their own conditions
    (``engine_up``: the engine is built in its constructor, for a spec that adopts it)."""
    j = Journal()
    engine = RecordingEngine(j, urls=["http://127.0.0.1:8000/v1"], up=engine_up)
    collector = RecordingCollector(j, engine=engine)
    return Adapters(engine, RecordingTrainer(j), collector)


def spec_fakes(handle: KitHandle | None = None) -> Adapters:
    """:func:`recording_fakes` shaped for the handle's spec (the engine up at construction when it adopts one)."""
    return recording_fakes(engine_up=handle is not None and handle.spec.engine_up_at_construction)


def required_positional(factory: Callable[..., Any]) -> int:
    """Positional parameters the kit fills: the required ones, and one named ``handle`` even with a default."""
    try:
        return len(
            [
                p
                for p in inspect.signature(factory).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and (p.default is p.empty or p.name == "handle")
            ]
        )
    except (TypeError, ValueError):
        return 0


def call_factory(factory: Callable[..., Any], *args: Any) -> Any:
    """Call ``factory`` with as many of ``args`` as it takes required positional parameters (the handle last for
    a drain factory: ``drain_factory(local_rank)`` or ``drain_factory(local_rank, handle)``)."""
    return factory(*args[: required_positional(factory)])


def build_components(
    handle: KitHandle,
    *,
    checkpoint_factory: Callable[..., Any] | None = None,
    validation_factory: Callable[..., Any] | None = None,
    early_stop_factory: Callable[..., Any] | None = None,
    drain_factory: Callable[..., Any] | None = None,
    validator_factory: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Your components for one program, each factory called with the program's :class:`KitHandle` (when it takes
    an argument; ``drain_factory`` with the local rank, then the handle): only the ones you gave."""
    out: dict[str, Any] = {}
    for key, factory in (
        ("checkpoint", checkpoint_factory),
        ("validation", validation_factory),
        ("early_stop", early_stop_factory),
        ("validator", validator_factory),
    ):
        if factory is not None:
            out[key] = call_factory(factory, handle)
    if drain_factory is not None:
        out["drain"] = call_factory(drain_factory, handle.local_rank, handle)
    return out


def as_adapters(obj: Any) -> Adapters:
    """Normalize a factory's result; derive probes from the adapters' own attributes when present.

    The engine's report of its condition (``engine_state()`` or ``condition``, see
    :func:`~colo_fsm.guards.engine_state.engine_state_of`) and ``running`` (collector) become condition probes; a collector's ``start_rollout``
    the rollout hook; an engine's ``decode_step``, ``decode_steps`` and ``request_counts`` the decode hook and
    the decode and request probes.
    """
    ad = obj if isinstance(obj, Adapters) else Adapters(*obj)
    engine_ = ad.engine
    if ad.rollout is None and ad.collector is not None and callable(getattr(ad.collector, "start_rollout", None)):
        ad.rollout = ad.collector.start_rollout
    if ad.decode is None and callable(getattr(engine_, "decode_step", None)):
        ad.decode = engine_.decode_step
    if ad.decode_probe is None and isinstance(getattr(engine_, "decode_steps", None), int):
        ad.decode_probe = lambda: int(engine_.decode_steps)
    if ad.request_probe is None and callable(getattr(engine_, "request_counts", None)):
        ad.request_probe = engine_.request_counts
    if ad.engine_probe is None and engine_state_of(ad.engine) is not None:  # the engine's own report, either form
        engine = ad.engine

        def engine_probe() -> EngineCondition | None:
            report = engine_state_of(engine)
            return report.condition if report is not None else None

        ad.engine_probe = engine_probe
    if (
        ad.collector is not None
        and ad.collector_probe is None
        and isinstance(getattr(ad.collector, "running", None), bool)
    ):
        collector = ad.collector
        ad.collector_probe = lambda: "running" if collector.running else "paused"
    return ad


def watched_drain(
    inner: Callable[[], object], local_rank: int, log: EventLog, faults: FaultSwitch
) -> Callable[[], object]:
    """Your drain, journaled as a ``device.synchronize`` of the device it names (``target_device()``, else
    ``local_rank``)."""
    target = getattr(inner, "target_device", None)

    def drain() -> object:
        device = int(target()) if callable(target) else local_rank
        log.add("device", "synchronize", "call", device)
        try:
            faults.check("device", "synchronize")
            out = inner()
        except BaseException as exc:
            log.add("device", "synchronize", "error", f"{type(exc).__name__}: {exc}")
            raise
        log.add("device", "synchronize", "ok", device)
        return out

    return drain


__all__ = [
    "AdapterFactory",
    "Adapters",
    "KitHandle",
    "as_adapters",
    "build_components",
    "call_factory",
    "recording_fakes",
    "required_positional",
    "spec_fakes",
    "watched_drain",
]
