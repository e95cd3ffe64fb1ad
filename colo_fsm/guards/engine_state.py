"""What the engine says about its own condition, checked against what the lifecycle state declares.

One protocol, one check, one error. An engine reports its condition in one of two forms, read in one place
(:func:`engine_state_of`):

* the rich form, for engines that run a state machine of their own (megatron-core's coordinator mode:
  ``EngineState`` RUNNING, PAUSED, SUSPENDED, ...): ``engine_state()`` returning an :class:`EngineStateReport`
  (:class:`ReportsEngineState`), the native state name and which
  :class:`~colo_fsm.states.spec.EngineCondition` it is;
* the simple form: a ``condition`` attribute holding an :class:`~colo_fsm.states.spec.EngineCondition` or its
  value (``"awake"``, ``"suspended"``, ...), as an adapter whose engine is up at construction (NeMo-RL's
  ``MegatronGeneration``) reports it; it becomes the same report (native name = the condition).

When an engine has both, ``engine_state()`` wins. The lifecycle checks the report (:func:`check_engine_state`)
at ``start`` before anything runs (an engine up at construction on a spec that builds it, or the reverse),
and before and after every action (which covers every handoff: a training step never starts while the engine
is not suspended, and a suspend that returned with the engine still running is caught at once); it records
the native state in each trace record. A disagreement raises :class:`~colo_fsm.errors.EngineStateMismatch`,
naming both sides. Engines that report nothing are not checked.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from colo_fsm.errors import ConfigError, EngineStateMismatch
from colo_fsm.states.spec import EngineCondition

CHECKED_CONDITIONS = frozenset(
    {EngineCondition.ABSENT, EngineCondition.AWAKE, EngineCondition.SUSPENDED, EngineCondition.TORN_DOWN}
)
"""Lifecycle conditions an engine report is checked against (Unknown, after a failed teardown, says nothing)."""

ALSO_ACCEPTED: dict[EngineCondition, frozenset[EngineCondition]] = {
    EngineCondition.TORN_DOWN: frozenset({EngineCondition.ABSENT}),
}
"""Reported conditions that also satisfy an expected one: a run stopped before it built its engine declares
it torn down, and the engine, never built, still reports absent."""


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
    """An engine that reports its own state (optional part of ``GenerationEngine``; the rich form)."""

    def engine_state(self) -> EngineStateReport | None:
        """The engine's native state now (None: nothing to report, e.g. not built yet)."""


def engine_state_of(engine: Any) -> EngineStateReport | None:
    """The engine's report of its condition: ``engine.engine_state()``, else its ``condition`` attribute as a
    report, else None (it reports nothing). A report of the wrong kind is a :class:`ConfigError`."""
    fn = getattr(engine, "engine_state", None)
    if fn is not None and callable(fn):
        report = fn()
        if report is not None and not isinstance(report, EngineStateReport):
            raise ConfigError(
                f"{type(engine).__name__}.engine_state()", type(report).__name__, "an EngineStateReport or None"
            )
        return report
    value = getattr(engine, "condition", None)
    if value is None:  # the lifecycle asks before and after every action: an engine that reports nothing is quick
        return None
    if isinstance(value, str):  # an EngineCondition is a str too
        return _condition_report(value, type(engine).__name__)
    return None  # a proxy's method or any other object is not a report


@functools.lru_cache(maxsize=128, typed=True)
def _condition_report(value: str, engine: str) -> EngineStateReport:
    """The report of a ``condition`` attribute (an :class:`EngineCondition` or its value), built once per value and
    engine class (a report is frozen, so the lifecycle's checks before and after every action share it)."""
    if isinstance(value, EngineCondition):
        return EngineStateReport(value.value, value, engine)
    try:
        cond = EngineCondition(value)
    except ValueError:
        raise ConfigError(
            f"{engine}.condition", value, f"one of {', '.join(c.value for c in EngineCondition)}"
        ) from None
    return EngineStateReport(value, cond, engine)


def check_engine_state(
    report: EngineStateReport | None,
    expected: EngineCondition,
    *,
    when: str,
    state: str | None = None,
    rank: int | None = None,
    weight_version: int | None = None,
    hint: str = "",
) -> None:
    """Raise :class:`~colo_fsm.errors.EngineStateMismatch` when the engine's reported condition is not
    ``expected``.

    ``when`` says where the check ran (e.g. "before train_step", "at start"); ``state`` is the lifecycle state;
    ``hint`` (optional) says how to fix it. Nothing is checked for an engine that reports nothing, or while the
    lifecycle expects Unknown.
    """
    if report is None or expected not in CHECKED_CONDITIONS or report.condition is expected:
        return
    if report.condition in ALSO_ACCEPTED.get(expected, ()):
        return
    raise EngineStateMismatch(
        lifecycle_state=state or "?",
        expected=expected.value,
        engine=report.engine,
        engine_state=report.native,
        engine_condition=report.condition.value if report.condition is not None else "between two conditions",
        accepted=report.natives_for(expected),
        when=when,
        hint=hint,
        rank=rank,
        weight_version=weight_version,
    )


def start_hint(reported: EngineStateReport, *, spec_name: str, up_at_construction: bool) -> str:
    """How to fix a mismatch at ``start``: an engine up at construction on a spec that builds it, or the reverse
    (empty for any other mismatch)."""
    if reported.condition is EngineCondition.AWAKE and not up_at_construction:
        return (
            f"its adapter brought it up in its constructor, while spec {spec_name} builds it in start; run "
            "engine_at_construction(spec) (e.g. the NEMO_RL_ENGINE_UP preset), which adopts it"
        )
    if up_at_construction:
        return (
            f"spec {spec_name} adopts an engine its adapter built in its constructor; bring the engine up in the "
            "adapter's constructor, or run a spec whose start builds it"
        )
    return ""


__all__ = [
    "ALSO_ACCEPTED",
    "CHECKED_CONDITIONS",
    "EngineStateReport",
    "ReportsEngineState",
    "check_engine_state",
    "engine_state_of",
    "start_hint",
]
