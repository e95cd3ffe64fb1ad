"""Watch a user's adapters: journal every call, track their conditions, inject faults, run async methods.

The property-based lifecycle machine (:mod:`colo_fsm.testing.lifecycle_machine`) wraps the engine, trainer
and collector it is given in these proxies. Each call is written to an :class:`EventLog` together with the
lifecycle state and the engine/collector conditions *at the time of the call*; the audits in this module read
that log independently of the runtime machine's own bookkeeping (:class:`~colo_fsm.guards.handoff.HandoffLedger`),
so a bug in the machine cannot hide itself.

Adapter methods may be ``async def``: a coroutine returned by a method is run to completion on the event loop
the caller owns (see :class:`LoopRunner`), because the lifecycle calls adapters synchronously.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.adapters.protocols import takes_weight_version
from colo_fsm.errors import BarrierTimeout
from colo_fsm.states.spec import LIFECYCLE, Collective, CollectorCondition, EngineCondition, Fact, LifecycleSpec, Role

ADAPTER_CALLS: Mapping[tuple[str, str], str] = LIFECYCLE.adapter_calls()
"""Which action each watched call implements in the shipped lifecycle, read from the actions' declared ``calls``
(another spec: ``spec.adapter_calls()``)."""

VALIDATOR_TARGET = ("validator", "validate")

FAULT_TARGETS: tuple[tuple[str, str], ...] = (*ADAPTER_CALLS, VALIDATOR_TARGET)
"""Every call the lifecycle machine can make fail in the shipped lifecycle (another spec: :func:`fault_targets`)."""


def fault_targets(spec: LifecycleSpec) -> tuple[tuple[str, str], ...]:
    """Every call the lifecycle machine can make fail when it runs ``spec``: its actions' calls and the validator."""
    return (*spec.adapter_calls(), VALIDATOR_TARGET)


class InjectedFault(RuntimeError):
    """The exception an armed fault raises; its message names the call it was injected into."""


@dataclass(frozen=True)
class Event:
    """One watched call. ``phase`` is ``call`` (before), ``ok`` or ``error`` (after)."""

    index: int
    component: str
    method: str
    phase: str
    state: str
    engine: EngineCondition
    collector: CollectorCondition
    detail: Any = None
    real_engine: str | None = None  # what the adapter itself reports (a probe), when it can
    real_collector: str | None = None

    @property
    def name(self) -> str:
        """``component.method``."""
        return f"{self.component}.{self.method}"


@dataclass
class Conditions:
    """The engine and collector conditions as the watched calls left them (the adapters' real conditions)."""

    engine: EngineCondition = EngineCondition.ABSENT
    collector: CollectorCondition = CollectorCondition.PAUSED


class EventLog:
    """An append-only, thread-safe list of :class:`Event`: one total order of the lifecycle's calls and what the
    adapters produced. Listeners (:meth:`listen`) see each event as it is appended, under the log's lock."""

    def __init__(
        self,
        state: Callable[[], str],
        conditions: Conditions,
        probe: Callable[[], tuple[str | None, str | None]] | None = None,
    ) -> None:
        self.events: list[Event] = []
        self._state = state
        self.conditions = conditions
        self._probe = probe
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Event], None]] = []
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.names: dict[str, str] = {}  # component -> your adapter's class, for readable lines
        self.call_budget: int | None = None  # the lifecycle's calls allowed before a call is refused (a loop)
        self._calls = 0

    def listen(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener(event)`` for every event appended from now on (under the lock: keep it short)."""
        self._listeners.append(listener)

    def add(self, component: str, method: str, phase: str, detail: Any = None, *, probe: bool = True) -> Event:
        """Record one call phase with the current lifecycle state, conditions and (if any, and ``probe``) the
        probed conditions."""
        real = self._probe() if self._probe is not None and probe else (None, None)
        if component in self.CALLERS and phase == "call":
            self._calls += 1
            if self.call_budget is not None and self._calls > self.call_budget:
                raise AssertionError(
                    f"the lifecycle made more than {self.call_budget} calls in one of its own calls "
                    f"({component}.{method} in {self._state()}): its spec never comes to rest"
                )
        with self._lock:
            ev = Event(
                len(self.events),
                component,
                method,
                phase,
                self._state(),
                self.conditions.engine,
                self.conditions.collector,
                detail,
                real[0],
                real[1],
            )
            self.events.append(ev)
            self._counts[component, method, phase] += 1
            for listener in self._listeners:
                listener(ev)
            return ev

    def __len__(self) -> int:
        return len(self.events)

    CALLERS = frozenset({"engine", "trainer", "collector", "device", "barrier", "validator"})
    """Components whose events are calls the lifecycle made (the others record what the adapters produced)."""

    def calls(self) -> int:
        """How many calls the lifecycle made (not the output of requests the kit sent, which other threads may
        append at any time)."""
        return self._calls

    def count(self, component: str, method: str, phase: str = "ok") -> int:
        """How many calls of ``component.method`` reached ``phase``."""
        return self._counts[component, method, phase]

    def lines(self, start: int = 0) -> list[str]:
        """Readable lines (for failure messages)."""
        names = self.names
        return [
            f"{e.index:4} {e.state:<13} {names.get(e.component, e.component)}.{e.method}:{e.phase}"
            + (f" {e.detail if isinstance(e.detail, str) else repr(e.detail)}" if e.detail is not None else "")
            for e in self.events[start:]
        ]


class FaultSwitch:
    """At most one armed fault: the next matching call raises :class:`InjectedFault` (or sleeps first)."""

    def __init__(self) -> None:
        self.armed: tuple[str, str] | None = None
        self.fired: list[tuple[str, str]] = []
        self.hang_s = 0.0

    def arm(self, component: str, method: str, *, hang_s: float = 0.0) -> None:
        """Make the next call of ``component.method`` fail."""
        self.armed = (component, method)
        self.hang_s = hang_s

    def check(self, component: str, method: str) -> None:
        """Raise if a fault is armed for this call (consuming it)."""
        if self.armed == (component, method):
            self.armed = None
            self.fired.append((component, method))
            if self.hang_s:
                import time

                time.sleep(self.hang_s)
            raise InjectedFault(f"injected fault in {component}.{method}")


class LoopRunner:
    """Runs coroutines returned by async adapters on one event loop that the caller owns.

    From the loop's own thread while the loop is idle, ``run_until_complete``; from another thread while the
    loop runs (e.g. an :class:`~colo_fsm.machine.aio.AsyncLifecycle` worker thread), ``run_coroutine_threadsafe``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.new_event_loop()
        self.owner = threading.get_ident()

    def __call__(self, awaitable: Any) -> Any:
        coro = awaitable if inspect.iscoroutine(awaitable) else _await(awaitable)
        if self.loop.is_running():
            if threading.get_ident() == self.owner:
                coro.close()
                raise RuntimeError("an async adapter was called from inside the machine's running event loop")
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the loop (cancelling what is left on it)."""
        if self.loop.is_closed():
            return
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


async def _await(awaitable: Any) -> Any:
    return await awaitable


class _Watched:
    component = "?"

    def __init__(self, target: Any, log: EventLog, faults: FaultSwitch, runner: LoopRunner | None = None) -> None:
        self.target = target
        self._log = log
        self._faults = faults
        self._runner = runner
        self.adapter_name = type(target).__name__  # your class, named in the kit's failure messages

    def method_name(self, method: str) -> str:
        """``YourClass.method``: how a failure names a call of your adapter (never this proxy)."""
        return f"{self.adapter_name}.{method}"

    def __getattr__(self, name: str) -> Any:  # anything not in the protocol goes straight to the adapter
        if name == "target":
            raise AttributeError(name)
        return getattr(self.target, name)

    def _optional(self, method: str) -> Any:
        """Journal an optional protocol method; call the adapter's own when it has one."""
        if callable(getattr(self.target, method, None)):
            return self._call(method)
        self._log.add(self.component, method, "call")
        self._faults.check(self.component, method)
        self._log.add(self.component, method, "ok")
        return None

    def _call(
        self, method: str, *args: Any, detail: Any = None, inside: Callable[[], None] | None = None, **kwargs: Any
    ) -> Any:
        self._log.add(self.component, method, "call", detail)
        try:
            self._faults.check(self.component, method)
            if inside is not None:
                inside()
            result = getattr(self.target, method)(*args, **kwargs)
            if inspect.isawaitable(result):
                if self._runner is None:
                    raise TypeError(f"{type(self.target).__name__}.{method} is async; pass a LoopRunner")
                result = self._runner(result)
        except BaseException as exc:
            self._log.add(self.component, method, "error", f"{type(exc).__name__}: {exc}")
            raise
        self._log.add(self.component, method, "ok", detail)
        return result


class WatchedEngine(_Watched):
    """Proxy of a :class:`~colo_fsm.adapters.protocols.GenerationEngine`."""

    component = "engine"

    reads_weights_in_place: bool

    def __init__(self, target: Any, log: EventLog, faults: FaultSwitch, runner: LoopRunner | None = None) -> None:
        super().__init__(target, log, faults, runner)
        self.reads_weights_in_place = bool(getattr(target, "reads_weights_in_place", False))
        self.published: list[str] | None = None

    def bring_up(self) -> None:
        self._call("bring_up")
        self._log.conditions.engine = EngineCondition.AWAKE

    def suspend(self) -> None:
        self._call("suspend")
        if self._log.conditions.engine is not EngineCondition.TORN_DOWN:
            self._log.conditions.engine = EngineCondition.SUSPENDED

    def resume(self) -> None:
        self._call("resume")
        self._log.conditions.engine = EngineCondition.AWAKE

    def shutdown(self) -> None:
        self._call("shutdown")
        self._log.conditions.engine = EngineCondition.TORN_DOWN

    def server_base_urls(self) -> list[str]:
        urls = list(self._call("server_base_urls") or ())
        self.published = urls  # what the adapter returned, to compare with what the machine published
        return urls


class WatchedTrainer(_Watched):
    """Proxy of a :class:`~colo_fsm.adapters.protocols.Trainer`."""

    component = "trainer"

    during_train_step: Callable[[], None] | None = None
    """Run inside every training step's window (after its call is journaled, before your ``train_step``): the
    kit's requests arriving while the trainer runs."""

    def train_step(self, batch: Any) -> Any:
        return self._call(
            "train_step", batch, detail=len(batch) if hasattr(batch, "__len__") else None, inside=self.during_train_step
        )

    def offload_buffers(self) -> None:
        self._call("offload_buffers")

    def restore_buffers(self) -> None:
        self._call("restore_buffers")

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        self._call("save_checkpoint", step, weight_version, extra_state, detail=(step, weight_version))

    def __init__(self, target: Any, log: EventLog, faults: FaultSwitch, runner: LoopRunner | None = None) -> None:
        super().__init__(target, log, faults, runner)
        if not callable(getattr(target, "finalize_checkpoint", None)):
            self.finalize_checkpoint = None  # type: ignore[method-assign,assignment]  # as absent as the adapter's

    def finalize_checkpoint(self) -> None:
        """Journaled (the finalize action ran); present only when the adapter has the hook."""
        self._call("finalize_checkpoint")

    def teardown(self) -> None:
        self._optional("teardown")


class WatchedCollector(_Watched):
    """Proxy of a :class:`~colo_fsm.adapters.protocols.Collector`."""

    component = "collector"

    def pause(self) -> None:
        self._call("pause")
        self._log.conditions.collector = CollectorCondition.PAUSED

    def resume(self, weight_version: int | None = None) -> None:
        if weight_version is not None and takes_weight_version(self.target.resume):
            self._call("resume", weight_version=weight_version, detail=weight_version)
        else:
            self._call("resume", detail=weight_version)
        self._log.conditions.collector = CollectorCondition.RUNNING

    def take_back(self, unused: list[Any]) -> Any:
        """Journaled (a stop handed back the unused batch and the prompts in flight); the adapter's own is called
        when it has one."""
        if callable(getattr(self.target, "take_back", None)):
            return self._call("take_back", unused, detail=len(unused))
        return self._optional("take_back")

    def teardown(self) -> None:
        self._optional("teardown")


class WatchedBarrier:
    """Wraps a :class:`~colo_fsm.guards.barrier.Barrier`; an injected fault raises :class:`BarrierTimeout`."""

    def __init__(self, inner: Any, log: EventLog, faults: FaultSwitch, *, rank: int = 0) -> None:
        self.inner = inner
        self._log = log
        self._faults = faults
        self.rank = rank

    def wait(self, *, state: str | None = None, weight_version: int | None = None) -> None:
        self._log.add("barrier", "wait", "call")
        try:
            try:
                self._faults.check("barrier", "wait")
            except InjectedFault as exc:
                raise BarrierTimeout(
                    0.0, state=state, rank=self.rank, weight_version=weight_version, detail=str(exc)
                ) from exc
            self.inner.wait(state=state, weight_version=weight_version)
        except BaseException as exc:
            self._log.add("barrier", "wait", "error", f"{type(exc).__name__}: {exc}")
            raise
        self._log.add("barrier", "wait", "ok")


def watched_synchronize(log: EventLog, faults: FaultSwitch) -> Callable[[int], None]:
    """A ``synchronize(device)`` for :class:`~colo_fsm.guards.drain.DeviceDrain` that records the device."""

    def synchronize(device: int) -> None:
        log.add("device", "synchronize", "call", device)
        try:
            faults.check("device", "synchronize")
        except InjectedFault as exc:
            log.add("device", "synchronize", "error", str(exc))
            raise
        log.add("device", "synchronize", "ok", device)

    return synchronize


# ---------------------------------------------------------------------------------------------- audits
@dataclass
class HandoffAudit:
    """Replays the event log against ``LifecycleRule.ONE_COMMUNICATOR``, independently of the machine's own ledger.

    Work is *issued* by the calls whose spec action declares ``issues`` (build, train, save, resume); it stays
    on this rank's device until a ``device.synchronize`` of ``local_rank``. Violations: a barrier reached with
    work still on the own device; a drain of any other device; a new kind of work started before the previous
    kind was drained and every rank met at a barrier (this covers "drain + barrier before the resume signal").
    """

    spec: LifecycleSpec
    local_rank: int
    dirty: set[Collective] = field(default_factory=set)
    phase: Collective | None = None
    complete: bool = False
    violations: list[str] = field(default_factory=list)
    _pos: int = 0

    pending_save: bool = False

    def __post_init__(self) -> None:
        self._calls = self.spec.adapter_calls()

    def feed(self, events: list[Event]) -> list[str]:
        """Audit the events not seen yet; return the new violations."""
        new: list[str] = []
        for ev in events[self._pos :]:
            self._pos += 1
            if ev.phase != "call":
                if ev.component == "barrier" and ev.phase == "ok":
                    self.complete = not self.dirty
                continue
            action = self._calls.get((ev.component, ev.method))
            if action is None:
                continue
            role = self.spec.action(action).role
            if role is Role.DRAIN:
                if ev.detail != self.local_rank:
                    new.append(
                        f"event {ev.index} ({ev.state}): drained device {ev.detail}, not the device named by "
                        f"LOCAL_RANK={self.local_rank}"
                    )
                else:
                    self.dirty.clear()
                continue
            if role is Role.BARRIER:
                if self.dirty:
                    names = ", ".join(sorted(k.value for k in self.dirty))
                    new.append(
                        f"event {ev.index} ({ev.state}): barrier reached with {names} work still on "
                        f"device {self.local_rank} (drain the own device first)"
                    )
                continue
            act = self.spec.action(action)
            kind = act.issues
            if kind is Collective.DECODE and self.pending_save:
                new.append(
                    f"event {ev.index} ({ev.state}): {ev.name} wakes the engine with the async save not finalized "
                    "(every checkpoint collective completes before any wake)"
                )
            if Fact.SAVE_PENDING in act.writes():
                self.pending_save = True
            if Fact.SAVE_PENDING in act.cleared():
                self.pending_save = False
            if kind is None:
                continue
            if self.phase is not None and self.phase != kind and not self.complete:
                new.append(
                    f"event {ev.index} ({ev.state}): {ev.name} starts {kind.value} work after "
                    f"{self.phase.value} work without drain + barrier in between"
                )
            elif self.dirty - {kind}:
                names = ", ".join(sorted(k.value for k in self.dirty - {kind}))
                new.append(
                    f"event {ev.index} ({ev.state}): {ev.name} starts {kind.value} work while {names} "
                    "work is still on the device"
                )
            self.phase = kind
            self.dirty.add(kind)
            self.complete = False
        self.violations.extend(new)
        return new


def run_coroutine(runner: LoopRunner, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on ``runner``'s loop (helper for rules that drive async code)."""
    return runner(coro)


__all__ = [
    "ADAPTER_CALLS",
    "FAULT_TARGETS",
    "Conditions",
    "Event",
    "EventLog",
    "FaultSwitch",
    "HandoffAudit",
    "InjectedFault",
    "LoopRunner",
    "WatchedBarrier",
    "WatchedCollector",
    "WatchedEngine",
    "WatchedTrainer",
    "fault_targets",
    "watched_synchronize",
]
