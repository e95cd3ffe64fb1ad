"""The picture model: what every drawing of a lifecycle says, read off a
:class:`~colo_fsm.states.spec.LifecycleSpec`, whatever draws it.

A transition is labelled ``trigger [guards] / actions``; guards read ``fact`` (must hold) and ``!fact`` (must not
hold) joined by ``&``; automatic transitions (fired by the machine itself) are marked ``(auto)``; a state is of
one kind (:func:`state_kind`), shown in one fill and stroke colour (:data:`KIND_FILL`, :data:`KIND_STROKE`); the
machine-fired failure transition (``spec.fail_trigger``) from every failable state to Failed is drawn once,
compactly. Every renderer of :mod:`colo_fsm.diagram` reads this module, and this module reads only the spec.
"""

from __future__ import annotations

from typing import Literal

from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LifecycleSpec, StateSpec, TransitionSpec

AUTO_MARK = "(auto)"
"""Prefix of the label of an automatic transition."""

FailureStyle = Literal["note", "edges"]

DEFAULT_TITLE = "colo-fsm lifecycle ({name})"
"""The default title of every picture; ``{name}`` stands for the spec's name (``lifecycle``, ``nemo_rl``...)."""


def spec_title(spec: LifecycleSpec, title: str | None = DEFAULT_TITLE) -> str | None:
    """``title`` with ``{name}`` replaced by ``spec.name`` (None or empty: no title)."""
    return title.replace("{name}", spec.name) if title else None


KIND_FILL: dict[str, str] = {"resting": "#e8f5e9", "transient": "#fffde7", "terminal": "#eceff1", "failed": "#ffebee"}
"""The fill colour of a state of each kind (:func:`state_kind`)."""

KIND_STROKE: dict[str, str] = {"resting": "#2e7d32", "transient": "#f9a825", "terminal": "#37474f", "failed": "#c62828"}
"""The outline colour of a state of each kind."""

AUTO_COLOR = "#1565c0"
"""The colour of an automatic transition."""


# ---------------------------------------------------------------------------------------------- labels
def guard_label(t: TransitionSpec) -> str:
    """The guards of ``t`` compactly: ``fact & !other`` (empty when unguarded)."""
    return " & ".join([str(f) for f in t.when] + [f"!{f}" for f in t.unless])


def transition_label(t: TransitionSpec, *, actions: bool = True) -> str:
    """``[(auto) ]trigger[ [guards]][ / action, action]`` on one line."""
    parts = [f"{AUTO_MARK} {t.trigger}" if t.automatic else t.trigger]
    guards = guard_label(t)
    if guards:
        parts.append(f"[{guards}]")
    if actions and t.actions:
        parts.append("/ " + ", ".join(t.actions))
    return " ".join(parts)


def state_conditions(s: StateSpec) -> str:
    """``engine <condition>, collector <condition>`` of one state."""
    return f"engine {s.engine.value}, collector {s.collector.value}"


def state_kind(spec: LifecycleSpec, s: StateSpec) -> str:
    """``failed``, ``terminal``, ``resting`` (waits for a user trigger) or ``transient`` (left automatically)."""
    if s.state == spec.failed:
        return "failed"
    if s.terminal:
        return "terminal"
    return "resting" if s.resting else "transient"


def failure_summary(spec: LifecycleSpec) -> str:
    """One sentence on the failure transition, naming every failable state."""
    names = ", ".join(s.value for s in spec.failable())
    return (
        f"{spec.fail_trigger}: from any of {names} when an action raises. "
        f"{spec.failed.value}: collector paused and engine suspended best effort, no teardown until stop"
    )


def checked_spec(spec: object) -> LifecycleSpec:
    """``spec``, refused with a :class:`ConfigError` unless it is a :class:`LifecycleSpec`."""
    if not isinstance(spec, LifecycleSpec):
        raise ConfigError("spec", spec, "a colo_fsm.states.spec.LifecycleSpec")
    return spec


def checked_failure(failure: object) -> FailureStyle:
    """``failure``, refused with a :class:`ConfigError` unless it is ``"note"`` or ``"edges"``."""
    if failure not in ("note", "edges"):
        raise ConfigError("failure", failure, "'note' or 'edges'")
    return failure


__all__ = [
    "AUTO_COLOR",
    "AUTO_MARK",
    "DEFAULT_TITLE",
    "KIND_FILL",
    "KIND_STROKE",
    "FailureStyle",
    "checked_failure",
    "checked_spec",
    "failure_summary",
    "guard_label",
    "spec_title",
    "state_conditions",
    "state_kind",
    "transition_label",
]
