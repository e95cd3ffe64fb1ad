"""The engine's own state machine, checked against the lifecycle's at every action.

Some engines run a state machine of their own (megatron-core's coordinator mode: ``EngineState`` RUNNING,
PAUSED, SUSPENDED, ...). Such an engine reports it (:class:`ReportsEngineState`: ``engine_state()`` returning an
:class:`EngineStateReport`): its native state name, and which :class:`~colo_fsm.states.spec.EngineCondition`
that native state is. The lifecycle then reads the report before and after every action, records the native
state in each trace record, and refuses to go on when the two machines disagree
(:class:`~colo_fsm.errors.EngineStateMismatch`, naming both states): a training step never starts while the
engine is not suspended, and a suspend that returned with the engine still running is caught at once.
Engines that report nothing are not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import EngineStateMismatch
from colo_fsm.states.spec import EngineCondition

CHECKED_CONDITIONS = frozenset({EngineCondition.AWAKE, EngineCondition.SUSPENDED, EngineCondition.TORN_DOWN})
"""Lifecycle conditions an engine report is checked against (Absent and Unknown say nothing to check)."""


@dataclass(frozen=True)
class EngineStateReport:
    """An engine's own state: its native name (e.g. ``"SUSPENDED"``), what it means to the lifecycle (None: in
    between two conditions, a step of the engine's own machine), and the native states of each condition
    (shown in a mismatch error)."""

    native: str
    condition: EngineCondition | None
    engine: str = "engine"
    matching: dict[EngineCondition, tuple[str, ...]] | None = None

    def natives_for(self, condition: EngineCondition) -> tuple[str, ...]:
        """The native states the engine counts as ``condition`` (empty when it did not say)."""
        return tuple((self.matching or {}).get(condition, ()))


@runtime_checkable
class ReportsEngineState(Protocol):
    """An engine that reports its own state machine (optional part of ``GenerationEngine``)."""

    def engine_state(self) -> EngineStateReport | None:
        """The engine's native state now (None: nothing to report, e.g. not built yet)."""


def engine_state_of(engine: Any) -> EngineStateReport | None:
    """``engine.engine_state()`` when the engine reports one, else None."""
    fn = getattr(engine, "engine_state", None)
    if not callable(fn):
        return None
    report = fn()
    if report is not None and not isinstance(report, EngineStateReport):
        raise TypeError(
            f"{type(engine).__name__}.engine_state() returned {type(report).__name__}, not an EngineStateReport"
        )
    return report


def check_engine_state(
    report: EngineStateReport | None,
    expected: EngineCondition,
    *,
    when: str,
    state: str | None = None,
    rank: int | None = None,
    weight_version: int | None = None,
) -> None:
    """Raise :class:`~colo_fsm.errors.EngineStateMismatch` when the engine's own state is not ``expected``.

    ``when`` says where the check ran (e.g. "before train_step"); ``state`` is the lifecycle state. Nothing
    is checked for an engine that reports nothing, or while the lifecycle expects Absent or Unknown.
    """
    if report is None or expected not in CHECKED_CONDITIONS or report.condition is expected:
        return
    raise EngineStateMismatch(
        lifecycle_state=state or "?",
        expected=expected.value,
        engine=report.engine,
        engine_state=report.native,
        engine_condition=report.condition.value if report.condition is not None else "between two conditions",
        accepted=report.natives_for(expected),
        when=when,
        rank=rank,
        weight_version=weight_version,
    )


__all__ = [
    "CHECKED_CONDITIONS",
    "EngineStateReport",
    "ReportsEngineState",
    "check_engine_state",
    "engine_state_of",
]
