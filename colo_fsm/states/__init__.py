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
    RequestCondition,
    Role,
    State,
    StateSpec,
    TransitionSpec,
)
from colo_fsm.states.presets import NEMO_RL, PRESETS, resolve_spec

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
    "NEMO_RL",
    "PRESETS",
    "RequestCondition",
    "Role",
    "State",
    "StateSpec",
    "TransitionSpec",
    "resolve_spec",
]
