"""The declarative lifecycle: states, actions and transitions as data."""

from colo_fsm.states.presets import NEMO_RL, NEMO_RL_ENGINE_UP, PRESETS, engine_at_construction, resolve_spec
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

__all__ = [
    "ACTIONS",
    "LIFECYCLE",
    "NEMO_RL",
    "NEMO_RL_ENGINE_UP",
    "PRESETS",
    "STATES",
    "TRANSITIONS",
    "ActionSpec",
    "Collective",
    "CollectorCondition",
    "EngineCondition",
    "Fact",
    "LifecycleSpec",
    "RequestCondition",
    "Role",
    "State",
    "StateSpec",
    "TransitionSpec",
    "engine_at_construction",
    "resolve_spec",
]
