"""The colocation lifecycle, declared once as data.

Everything else reads this module: the runtime machine (:mod:`colo_fsm.machine`), the diagram and the docs
table (:mod:`colo_fsm.diagram`), the static spec validator (:mod:`colo_fsm.states.validate`) and the
exhaustive multi-rank checker (:mod:`colo_fsm.testing.checker`).

Vocabulary:

* A **state** says what the engine, the collector and the communicator are doing while the machine is in it.
* A **transition** moves from a source to a destination on a **trigger**. Its **guards** (``when``) and
  negated guards (``unless``) are pure predicates over latched facts; its **actions** are effects run in
  order, in the destination state, right after the state changes. An action that raises moves the machine
  to Failed.
* An **automatic** transition is fired by the machine itself as soon as its source state is entered and its
  guards hold; user triggers are fired by the training loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum


class State(StrEnum):
    """Lifecycle states. Values are the names shown in traces and diagrams."""

    CREATED = "Created"
    STARTING = "Starting"
    GENERATING = "Generating"
    DRAINING = "Draining"
    TRAINING = "Training"
    CHECKPOINTING = "Checkpointing"
    VALIDATING = "Validating"
    WAKING = "Waking"
    DONE = "Done"
    STOPPED = "Stopped"
    FAILED = "Failed"


class EngineCondition(StrEnum):
    """What the colocated engine is doing."""

    ABSENT = "absent"  # not built yet
    AWAKE = "awake"  # may decode
    SUSPENDED = "suspended"  # no decode; KV kept, offloaded or freed per KV mode
    TORN_DOWN = "torn_down"
    UNKNOWN = "unknown"  # after a failure: whatever the failing action left


class CollectorCondition(StrEnum):
    """Whether the collector issues rollouts."""

    PAUSED = "paused"
    RUNNING = "running"
    UNKNOWN = "unknown"


class Collective(StrEnum):
    """Kinds of collective work a rank's device may have in flight on the shared communicator."""

    BUILD = "build"
    DECODE = "decode"
    TRAIN = "train"
    CHECKPOINT = "checkpoint"


class Fact(StrEnum):
    """Latched facts that guards read. Guards never compute; they read these."""

    ENGINE_BUILT = "engine_built"
    HANDOFF_COMPLETE = "handoff_complete"  # own device drained, then every rank met the barrier
    SAVE_THIS_STEP = "save_this_step"  # latched checkpoint decision of the current step
    VALIDATE_THIS_STEP = "validate_this_step"  # latched validation decision of the current step
    LAST_STEP = "last_step"  # the current step is the run's last
    STEP_TRAINED = "step_trained"  # this step's optimizer step ran and the weight version was bumped once


@dataclass(frozen=True)
class StateSpec:
    """One state and the conditions every adapter must be in while the machine is there."""

    state: State
    description: str
    engine: EngineCondition
    collector: CollectorCondition
    resting: bool = False  # the machine waits here for a user trigger
    terminal: bool = False
    final: bool = False  # the run is over here: no further training step can start


@dataclass(frozen=True)
class ActionSpec:
    """An effect the machine can run. ``issues`` names collective work the action puts on the device."""

    name: str
    description: str
    issues: Collective | None = None
    engine: EngineCondition | None = None  # engine condition after the action
    collector: CollectorCondition | None = None  # collector condition after the action


@dataclass(frozen=True)
class TransitionSpec:
    """One edge of the lifecycle."""

    trigger: str
    source: State
    dest: State
    actions: tuple[str, ...] = ()
    when: tuple[Fact, ...] = ()
    unless: tuple[Fact, ...] = ()
    automatic: bool = False
    description: str = ""

    def enabled(self, facts: dict[Fact, bool] | dict[str, bool]) -> bool:
        """Whether this transition's guards hold for ``facts`` (missing facts read False)."""
        return all(facts.get(f, False) for f in self.when) and not any(facts.get(f, False) for f in self.unless)

    def guard_text(self) -> str:
        """Guards as a short expression, e.g. ``save_this_step and not last_step``."""
        parts = [str(f) for f in self.when] + [f"not {f}" for f in self.unless]
        return " and ".join(parts)


@dataclass(frozen=True)
class LifecycleSpec:
    """A complete lifecycle: states, actions and transitions. Use :data:`LIFECYCLE`, or derive variants."""

    states: tuple[StateSpec, ...]
    actions: tuple[ActionSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    initial: State = State.CREATED
    failed: State = State.FAILED
    fail_trigger: str = "fail"  # fired by the machine itself when an action raises, from any failable state
    _by_state: dict[State, StateSpec] = field(init=False, repr=False, compare=False)
    _by_action: dict[str, ActionSpec] = field(init=False, repr=False, compare=False)
    _outgoing: dict[State, tuple[TransitionSpec, ...]] = field(init=False, repr=False, compare=False)
    _triggers: dict[State, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_state", {s.state: s for s in self.states})
        object.__setattr__(self, "_by_action", {a.name: a for a in self.actions})
        outgoing = {s: tuple(t for t in self.transitions if t.source == s) for s in State}
        object.__setattr__(self, "_outgoing", outgoing)
        object.__setattr__(
            self, "_triggers", {s: tuple(dict.fromkeys(t.trigger for t in ts)) for s, ts in outgoing.items()}
        )

    def state(self, state: State | str) -> StateSpec:
        """The spec of one state."""
        return self._by_state[State(state)]

    def action(self, name: str) -> ActionSpec:
        """The spec of one action."""
        return self._by_action[name]

    def outgoing(self, state: State | str) -> tuple[TransitionSpec, ...]:
        """Transitions leaving ``state``, in declaration order."""
        return self._outgoing[State(state)]

    def triggers(self, state: State | str | None = None) -> tuple[str, ...]:
        """Trigger names (of one state, or of the whole machine), each once, in declaration order."""
        if state is not None:
            return self._triggers[State(state)]
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def user_triggers(self) -> tuple[str, ...]:
        """Triggers the training loop fires (every non-automatic one)."""
        return tuple(dict.fromkeys(t.trigger for t in self.transitions if not t.automatic))

    def select(self, state: State | str, trigger: str, facts: dict[Fact, bool]) -> TransitionSpec | None:
        """The transition ``trigger`` takes from ``state`` under ``facts``, or None if no guard holds."""
        for t in self.outgoing(state):
            if t.trigger == trigger and t.enabled(facts):
                return t
        return None

    def failable(self) -> tuple[State, ...]:
        """States an action failure can leave: every state but the terminal ones and Failed itself."""
        return tuple(s.state for s in self.states if not s.terminal and s.state != self.failed)

    def __iter__(self) -> Iterator[TransitionSpec]:
        return iter(self.transitions)


E, C = EngineCondition, CollectorCondition
S = State

STATES: tuple[StateSpec, ...] = (
    StateSpec(S.CREATED, "Nothing is up yet.", E.ABSENT, C.PAUSED, resting=True),
    StateSpec(S.STARTING, "Engine (and server) built once; ranks meet before collection.", E.AWAKE, C.PAUSED),
    StateSpec(S.GENERATING, "Engine decodes; the collector issues rollouts.", E.AWAKE, C.RUNNING, resting=True),
    StateSpec(S.DRAINING, "Collector paused, engine suspended, own device drained, barrier.", E.SUSPENDED, C.PAUSED),
    StateSpec(S.TRAINING, "One optimizer step on the shared model; weight version bumped once.", E.SUSPENDED, C.PAUSED),
    StateSpec(S.CHECKPOINTING, "Distributed save; engine and collector stay down throughout.", E.SUSPENDED, C.PAUSED),
    StateSpec(
        S.VALIDATING, "Engine awake for validation only; collector stays paused.", E.AWAKE, C.PAUSED, resting=True
    ),
    StateSpec(S.WAKING, "Training buffers offloaded, own device drained, barrier; then resume.", E.SUSPENDED, C.PAUSED),
    StateSpec(
        S.DONE, "The last step is done; the engine is not woken again.", E.SUSPENDED, C.PAUSED, resting=True, final=True
    ),
    StateSpec(
        S.STOPPED,
        "Engine torn down. The only place teardown happens.",
        E.TORN_DOWN,
        C.PAUSED,
        resting=True,
        terminal=True,
        final=True,
    ),
    StateSpec(
        S.FAILED,
        "An action raised; cause, state, rank and weight version recorded.",
        E.UNKNOWN,
        C.UNKNOWN,
        resting=True,
        final=True,
    ),
)

ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec(
        "build_engine",
        "Bring the colocated engine (and its server) up; exactly once per run.",
        Collective.BUILD,
        engine=E.AWAKE,
    ),
    ActionSpec("publish_server_urls", "Publish dp_openai_server_base_urls for external agents."),
    ActionSpec("latch_step_decisions", "Decide once whether this step checkpoints, validates, is the last."),
    ActionSpec("pause_collector", "Stop issuing rollouts.", collector=C.PAUSED),
    ActionSpec("suspend_engine", "Suspend decode (KV kept, offloaded or freed per KV mode).", engine=E.SUSPENDED),
    ActionSpec("drain_device", "torch.cuda.synchronize on the device named by LOCAL_RANK."),
    ActionSpec("barrier", "Every rank meets; requires this rank's device drained first."),
    ActionSpec("restore_training_buffers", "Bring gradient buffers / optimizer state back."),
    ActionSpec("train_step", "One optimizer step on the shared model.", Collective.TRAIN),
    ActionSpec("bump_weight_version", "weight_version += 1, exactly once per step."),
    ActionSpec("offload_training_buffers", "Free training-only memory; generation reads the weights in place."),
    ActionSpec("save_checkpoint", "Distributed checkpoint save (world-wide collectives).", Collective.CHECKPOINT),
    ActionSpec(
        "resume_engine", "Signal decode to resume; only after drain and barrier.", Collective.DECODE, engine=E.AWAKE
    ),
    ActionSpec("resume_collector", "Start issuing rollouts again.", Collective.DECODE, collector=C.RUNNING),
    ActionSpec("shutdown_engine", "Tear the engine down; only on the way to Stopped.", engine=E.TORN_DOWN),
)

F = Fact
_HANDOFF = ("drain_device", "barrier")
_SUSPEND_ALL = ("pause_collector", "suspend_engine", *_HANDOFF)
_OFFLOAD = ("offload_training_buffers", *_HANDOFF)

TRANSITIONS: tuple[TransitionSpec, ...] = (
    TransitionSpec(
        "start",
        S.CREATED,
        S.STARTING,
        ("build_engine", "publish_server_urls", *_HANDOFF),
        unless=(F.ENGINE_BUILT,),
        description="Build the engine once, before collection starts.",
    ),
    TransitionSpec(
        "generate",
        S.STARTING,
        S.GENERATING,
        ("resume_collector",),
        when=(F.HANDOFF_COMPLETE,),
        automatic=True,
        description="Every rank has the engine up: start collecting.",
    ),
    TransitionSpec(
        "begin_step",
        S.GENERATING,
        S.DRAINING,
        ("latch_step_decisions", *_SUSPEND_ALL),
        description="Handoff to training: decide once, pause, suspend, drain own device, barrier.",
    ),
    TransitionSpec(
        "train",
        S.DRAINING,
        S.TRAINING,
        ("restore_training_buffers", "train_step", "bump_weight_version"),
        when=(F.HANDOFF_COMPLETE,),
        description="One step on the shared model; weight version + 1.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.CHECKPOINTING,
        (*_OFFLOAD, "save_checkpoint"),
        when=(F.STEP_TRAINED, F.SAVE_THIS_STEP),
        automatic=True,
        description="Save before any wake: engine and collector stay suspended.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.DONE,
        _OFFLOAD,
        when=(F.STEP_TRAINED, F.LAST_STEP),
        unless=(F.SAVE_THIS_STEP,),
        automatic=True,
        description="Last step without a save: never wake the engine.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.VALIDATING,
        (*_OFFLOAD, "resume_engine"),
        when=(F.STEP_TRAINED, F.VALIDATE_THIS_STEP),
        unless=(F.SAVE_THIS_STEP, F.LAST_STEP),
        automatic=True,
        description="Validation-only wake: engine resumes after drain and barrier, collector stays paused.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.WAKING,
        _OFFLOAD,
        when=(F.STEP_TRAINED,),
        unless=(F.SAVE_THIS_STEP, F.VALIDATE_THIS_STEP, F.LAST_STEP),
        automatic=True,
        description="Handoff to generation: offload, drain own device, barrier.",
    ),
    TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.DONE,
        _HANDOFF,
        when=(F.LAST_STEP,),
        automatic=True,
        description="Last step: every checkpoint collective done; the engine stays down.",
    ),
    TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.VALIDATING,
        (*_HANDOFF, "resume_engine"),
        when=(F.VALIDATE_THIS_STEP,),
        unless=(F.LAST_STEP,),
        automatic=True,
        description="Validate after the save, once every checkpoint collective has completed.",
    ),
    TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.WAKING,
        _HANDOFF,
        unless=(F.VALIDATE_THIS_STEP, F.LAST_STEP),
        automatic=True,
        description="Save done on every rank: hand back to generation.",
    ),
    TransitionSpec(
        "resume",
        S.WAKING,
        S.GENERATING,
        ("resume_engine", "resume_collector"),
        when=(F.HANDOFF_COMPLETE,),
        automatic=True,
        description="Resume signal only after drain and barrier.",
    ),
    TransitionSpec(
        "end_validation",
        S.VALIDATING,
        S.GENERATING,
        ("resume_collector",),
        description="Validation finished: the engine stays resident, collection resumes.",
    ),
    TransitionSpec("stop", S.GENERATING, S.STOPPED, (*_SUSPEND_ALL, "shutdown_engine"), description="Stop the run."),
    TransitionSpec("stop", S.VALIDATING, S.STOPPED, (*_SUSPEND_ALL, "shutdown_engine"), description="Stop the run."),
    TransitionSpec("stop", S.DONE, S.STOPPED, ("shutdown_engine",), description="Tear down after the last step."),
    TransitionSpec(
        "stop",
        S.CREATED,
        S.STOPPED,
        ("shutdown_engine",),
        description="Stop before anything was built (nothing to tear down).",
    ),
    TransitionSpec(
        "stop",
        S.FAILED,
        S.STOPPED,
        ("shutdown_engine",),
        description="Local teardown after a failure (no barrier: a peer may be dead).",
    ),
)

LIFECYCLE = LifecycleSpec(states=STATES, actions=ACTIONS, transitions=TRANSITIONS)
"""The colocation lifecycle colo-fsm ships."""

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
