"""What one program of the lifecycle machine is drawn from: its run configuration (:class:`RunConfig`), the oracle's
record of each step (:class:`StepRecord`), and the faults it may arm (the calls a state can still make, read from
the spec)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from colo_fsm.states.presets import PRESETS
from colo_fsm.states.spec import Fact, LifecycleSpec, State
from colo_fsm.states.walk import last_step_validates
from colo_fsm.testing.watch import FAULT_TARGETS, VALIDATOR_TARGET, fault_targets


@dataclass(frozen=True)
class RunConfig:
    """One drawn run configuration (decisions, resume point, collector sizing). Its repr names only the fields
    that differ from the defaults, so a shrunk program prints it on one line."""

    num_steps: int | None = None
    start_step: int = 0
    start_weight_version: int = 0
    checkpoint_every: int | None = None
    must_save_by_s: float | None = None
    validate_every: int | None = None
    inline_validator: bool = False
    max_trajectory_age_steps: int = 1
    num_prompts_per_step: int = 1
    samples_per_group: int = 1
    actor_max_concurrency: int = 16
    control_headroom: int = 0
    val_at_start: bool = False  # used when the spec decides validate_at_start
    val_at_end: bool = False
    early_stop_at: int | None = None  # steps trained when the early-stop latch says stop (0: at start)
    save_on_early_stop: bool | None = None  # LifecycleConfig's: None saves an early stop iff the run checkpoints

    def __repr__(self) -> str:
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"RunConfig({', '.join(changed)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis' printer: one line
        printer.text(repr(self))


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    """Strategy for :class:`RunConfig`."""
    num_steps = draw(st.one_of(st.none(), st.integers(1, 6)))
    start_step = draw(st.integers(0, (num_steps - 1) if num_steps else 3)) if draw(st.booleans()) else 0
    amc = draw(st.sampled_from([16, 64, 256, 1000]))
    spg = draw(st.integers(1, 16))
    cfg = RunConfig(
        num_steps=num_steps,
        start_step=start_step,
        start_weight_version=draw(st.integers(0, 3)),
        checkpoint_every=draw(st.one_of(st.none(), st.integers(1, 3))),
        must_save_by_s=draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 5.0, 20.0]))),
        validate_every=draw(st.one_of(st.none(), st.integers(1, 3))),
        inline_validator=draw(st.booleans()),
        max_trajectory_age_steps=draw(st.integers(1, 3)),
        num_prompts_per_step=draw(st.integers(1, 128)),
        samples_per_group=spg,
        actor_max_concurrency=amc,
        control_headroom=draw(st.integers(0, min(8, amc - spg))),
        val_at_start=draw(st.booleans()),
        val_at_end=draw(st.booleans()),
        early_stop_at=draw(st.one_of(st.none(), st.integers(0, 5))),
    )
    # derived, not drawn: a draw of its own would move every derandomized program after it
    derived = (True, None, True, False)[(amc + spg + cfg.num_prompts_per_step) % 4]
    return dataclasses.replace(cfg, save_on_early_stop=derived)


@dataclass
class StepRecord:
    """What the machine expects of one step, decided by an oracle at the moment the step latched."""

    step: int
    save: bool
    validate: bool
    last: bool
    event_index: int
    wv_before: int
    done: bool = False
    early_stop: bool = False  # the early-stop latch (after validation) will say stop


def condition_name(value: Any) -> str | None:
    if value is None:
        return None
    return str(value.value if hasattr(value, "value") else value)


def fit_config(cfg: RunConfig, spec: LifecycleSpec, *, user_validation: bool = False) -> RunConfig:
    """Drop the drawn options a spec has no place for (the lifecycle refuses them): validation at start or at
    the end, and an early stop in a spec without one or a run that never validates."""
    decided = {f for a in spec.actions for f in a.decides}
    changes: dict[str, Any] = {}
    if Fact.VALIDATE_AT_START not in decided:
        changes["val_at_start"] = False
    if cfg.val_at_end and not last_step_validates(spec):
        changes["val_at_end"] = False
    cfg = dataclasses.replace(cfg, **changes) if changes else cfg
    validates = user_validation or cfg.validate_every is not None or cfg.val_at_start or cfg.val_at_end
    if Fact.STOP_EARLY not in decided or not validates:
        return dataclasses.replace(cfg, early_stop_at=None, save_on_early_stop=None)
    at, every = cfg.early_stop_at, cfg.validate_every
    if at is not None and every is not None and not (at == 0 and cfg.val_at_start and cfg.start_step == 0):
        # where a validation asks it: the first validating step at or after the drawn one (steps trained)
        at = max(at, cfg.start_step + 1)
        cfg = dataclasses.replace(cfg, early_stop_at=at + (-at) % every)
    return cfg


_CALLABLE: dict[tuple[int, State, bool], tuple[tuple[str, str], ...]] = {}

RARE_TARGETS: tuple[tuple[str, str], ...] = (
    ("trainer", "train_step"),
    ("trainer", "save_checkpoint"),
    ("barrier", "wait"),
    ("engine", "resume"),
    VALIDATOR_TARGET,
)
FAULT_DRAWS: tuple[tuple[str, str], ...] = (*FAULT_TARGETS, *RARE_TARGETS, *RARE_TARGETS)
"""What the ``fault`` event draws from: every target, the ones only some steps call (a save, a validation) or
only once per step weighted up, so each fires in the CI profile's 500 programs."""

FIRST_FAULTS: tuple[tuple[str, str] | None, ...] = (
    *(None,) * 12,
    *(t for t in FAULT_DRAWS if t[1] not in ("bring_up", "server_base_urls")),
    *(VALIDATOR_TARGET,) * 4,
    *(("trainer", "restore_buffers"),) * 2,
    ("device", "synchronize"),
)
"""The fault armed before a program starts (about half have none). It waits for its call from the first step
on, so the rare calls of a step (a save, an inline validation, weighted up most, and the restore of offloaded
buffers, which only runs where a program offloads) fail in 500 programs; the start's
own calls are left out (a failed start ends a program before any step), they fail from ``disturb`` before it."""

DIRECTED_OPTIONS: dict[tuple[str, str], dict[str, Any]] = {
    VALIDATOR_TARGET: {"validate_every": 1},
    ("trainer", "save_checkpoint"): {"checkpoint_every": 1},
    ("trainer", "finalize_checkpoint"): {"checkpoint_every": 1},
}
"""The drawn options a directed run (``LifecycleMachine.first_fault``) overrides so that its call comes every step:
the calls only some steps make."""

FAULT_PATIENCE = 12
"""Lifecycle calls an armed fault may wait for its target before it is disarmed (so it cannot block the others)."""


def callable_targets(spec: LifecycleSpec, state: State, *, inline_validator: bool) -> tuple[tuple[str, str], ...]:
    """The :data:`FAULT_TARGETS` a lifecycle resting in ``state`` may still call, read from ``spec``.

    Every state reachable from ``state`` (guards ignored, the fail edge excluded) contributes the adapter calls of
    the actions its outgoing transitions run; the inline validator counts once Validating is reachable. A target
    outside this set (``engine.bring_up`` after the build, anything but teardown after a failure) can never fire.
    """
    key = (id(spec), state, inline_validator)
    hit = _CALLABLE.get(key)
    if hit is not None:
        return hit
    seen, todo, actions = {state}, [state], set[str]()
    while todo:
        here = todo.pop()
        for t in spec.outgoing(here):
            actions.update(t.actions)
            if t.dest not in seen:
                seen.add(t.dest)
                todo.append(t.dest)
    targets = {a: call for call, a in spec.adapter_calls().items()}
    found = {targets[a] for a in actions if a in targets}
    if inline_validator and any(spec.state(x).validates for x in seen):
        found.add(VALIDATOR_TARGET)
    result = tuple(t for t in fault_targets(spec) if t in found)
    _CALLABLE[key] = result
    return result


ALL_TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(t for spec in PRESETS.values() for t in spec.triggers()))


__all__ = [
    "ALL_TRIGGERS",
    "DIRECTED_OPTIONS",
    "FAULT_DRAWS",
    "FAULT_PATIENCE",
    "FIRST_FAULTS",
    "RunConfig",
    "StepRecord",
    "callable_targets",
    "condition_name",
    "fit_config",
    "run_configs",
]
