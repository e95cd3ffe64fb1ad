"""The declarative lifecycle: states, actions and transitions as data."""

from colo_fsm.states.spec import (
    ACTIONS,
    LIFECYCLE,
    STATES,
    TRANSITIONS,
    ActionSpec,
    Collective,
    CollectorCondition,
    EngineCondition,
    Fact,
    LifecycleSpec,
    State,
    StateSpec,
    TransitionSpec,
)

__all__ = [
    "ACTIONS",
    "LIFECYCLE",
    "STATES",
    "TRANSITIONS",
    "ActionSpec",
    "Collective",
    "CollectorCondition",
    "EngineCondition",
    "Fact",
    "LifecycleSpec",
    "State",
    "StateSpec",
    "TransitionSpec",
]
