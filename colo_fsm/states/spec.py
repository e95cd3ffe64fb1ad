"""The colocation lifecycle, declared once as data.

Everything else reads this module (its words, the states, facts and roles, live in :mod:`colo_fsm.states.vocabulary`): the runtime machine (:mod:`colo_fsm.machine`), the diagram and the docs
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
* Every action declares its **effects**: its :class:`Role` (what the runtime does for it), the adapter call it
  makes (``calls``), the facts it sets, clears or decides, the collective work it issues and the conditions it
  leaves. The runtime applies these declarations itself, and every tool (checker, hypothesis kit, fault
  matrix, server admission, docs tables) reads them, so a user's variant is checked from its own data.
"""

from __future__ import annotations

from colo_fsm.states.schema import (
    STEP_WORK,
    STOP_TRIGGER,
    ActionSpec,
    LifecycleSpec,
    StateSpec,
    TransitionSpec,
    stop_transitions,
    with_stops,
)
from colo_fsm.states.vocabulary import (
    FACT_DESCRIPTIONS,
    USER_TRIGGERS,
    Collective,
    CollectorCondition,
    EngineCondition,
    Fact,
    RequestCondition,
    Role,
    State,
)

E, C, R = EngineCondition, CollectorCondition, RequestCondition
S = State
F = Fact

STATES: tuple[StateSpec, ...] = (
    StateSpec(S.CREATED, "Nothing is up yet.", E.ABSENT, C.PAUSED, resting=True),
    StateSpec(
        S.STARTING,
        "Engine (and server) built once; ranks meet before collection.",
        E.AWAKE,
        C.PAUSED,
        requests=R.RUNNING,
    ),
    StateSpec(
        S.GENERATING,
        "Engine decodes; the collector issues rollouts.",
        E.AWAKE,
        C.RUNNING,
        resting=True,
        requests=R.RUNNING,
        serves_requests=True,
        ends_step=True,
    ),
    StateSpec(
        S.DRAINING,
        "Collector paused, engine suspended (requests parked), own device drained, barrier.",
        E.SUSPENDED,
        C.PAUSED,
        requests=R.PARKED,
    ),
    StateSpec(
        S.TRAINING,
        "One optimizer step on the shared model; weight version bumped once.",
        E.SUSPENDED,
        C.PAUSED,
        requests=R.PARKED,
    ),
    StateSpec(
        S.CHECKPOINTING,
        "Distributed save; engine and collector stay down throughout.",
        E.SUSPENDED,
        C.PAUSED,
        requests=R.PARKED,
    ),
    StateSpec(
        S.VALIDATING,
        "Engine awake for validation only; collector stays paused.",
        E.AWAKE,
        C.PAUSED,
        resting=True,
        requests=R.RUNNING,
        serves_requests=True,
        validates=True,
        ends_step=True,
    ),
    StateSpec(
        S.WAKING,
        "Training buffers offloaded, own device drained, barrier; then resume.",
        E.SUSPENDED,
        C.PAUSED,
        requests=R.PARKED,
    ),
    StateSpec(
        S.DONE,
        "The last step is done; the engine is not woken again.",
        E.SUSPENDED,
        C.PAUSED,
        resting=True,
        final=True,
        requests=R.PARKED,
        ends_step=True,
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
        requests=R.UNKNOWN,
    ),
)

ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec(
        "build_engine",
        "Bring the colocated engine (and its server) up; exactly once per run.",
        Collective.BUILD,
        engine=E.AWAKE,
        role=Role.BUILD,
        calls=("engine", "bring_up"),
        sets=(F.ENGINE_BUILT,),
        requests=R.RUNNING,
    ),
    ActionSpec(
        "publish_server_urls",
        "Publish dp_openai_server_base_urls for external agents.",
        role=Role.PUBLISH,
        calls=("engine", "server_base_urls"),
    ),
    ActionSpec(
        "latch_step_decisions",
        "Decide once whether this step checkpoints, validates, is the last.",
        role=Role.LATCH,
        decides=(F.SAVE_THIS_STEP, F.VALIDATE_THIS_STEP, F.LAST_STEP),
        clears=(F.STEP_TRAINED,),
    ),
    ActionSpec(
        "pause_collector",
        "Stop issuing rollouts (rollouts in flight stay parked in the engine).",
        collector=C.PAUSED,
        role=Role.PAUSE,
        calls=("collector", "pause"),
    ),
    ActionSpec(
        "suspend_engine",
        "Stop at a decode-step boundary and suspend; requests parked (KV kept, offloaded or freed per KV mode).",
        engine=E.SUSPENDED,
        role=Role.SUSPEND,
        calls=("engine", "suspend"),
        requests=R.PARKED,
    ),
    ActionSpec(
        "drain_device",
        "torch.cuda.synchronize on the device named by LOCAL_RANK.",
        role=Role.DRAIN,
        calls=("device", "synchronize"),
    ),
    ActionSpec(
        "barrier",
        "Every rank meets; requires this rank's device drained first.",
        role=Role.BARRIER,
        calls=("barrier", "wait"),
        sets=(F.HANDOFF_COMPLETE,),
    ),
    ActionSpec(
        "restore_training_buffers",
        "Bring gradient buffers / optimizer state back.",
        role=Role.RESTORE,
        calls=("trainer", "restore_buffers"),
    ),
    ActionSpec(
        "train_step",
        "One optimizer step on the shared model.",
        Collective.TRAIN,
        role=Role.TRAIN,
        calls=("trainer", "train_step"),
    ),
    ActionSpec(
        "bump_weight_version",
        "weight_version += 1, exactly once per step.",
        role=Role.BUMP,
        sets=(F.STEP_TRAINED,),
    ),
    ActionSpec(
        "offload_training_buffers",
        "Free training-only memory; generation reads the weights in place.",
        role=Role.OFFLOAD,
        calls=("trainer", "offload_buffers"),
    ),
    ActionSpec(
        "save_checkpoint",
        "Distributed checkpoint save (world-wide collectives).",
        Collective.CHECKPOINT,
        role=Role.SAVE,
        calls=("trainer", "save_checkpoint"),
    ),
    ActionSpec(
        "resume_engine",
        "Signal decode to resume (parked requests continue, each once); only after drain and barrier.",
        Collective.DECODE,
        engine=E.AWAKE,
        role=Role.RESUME,
        calls=("engine", "resume"),
        requests=R.RUNNING,
    ),
    ActionSpec(
        "resume_collector",
        "Start issuing rollouts again, at the current weight version.",
        Collective.DECODE,
        collector=C.RUNNING,
        role=Role.RESUME_COLLECTOR,
        calls=("collector", "resume"),
    ),
    ActionSpec(
        "return_prompts",
        "The collector takes back what the run will not train: the batch the loop drew and did not train (stop("
        "unused=batch)) and the prompts of its rollouts in flight, which the teardown aborts; a restart issues them "
        "again (collector.take_back, optional).",
        role=Role.RETURN_PROMPTS,
        calls=("collector", "take_back"),
    ),
    ActionSpec(
        "shutdown_engine",
        "Tear the engine down (requests left are aborted), then the trainer's and collector's optional teardown.",
        engine=E.TORN_DOWN,
        role=Role.TEARDOWN,
        calls=("engine", "shutdown"),
        requests=R.NONE,
    ),
)

ADOPT_ENGINE = ActionSpec(
    "adopt_engine",
    "Take over the engine (and server) its adapter built in its constructor: it must report awake; builds nothing.",
    engine=E.AWAKE,
    role=Role.ADOPT,
    sets=(F.ENGINE_BUILT,),
    requests=R.RUNNING,
)
"""The action ``start`` runs instead of the build when the engine is up at construction (a variant's, not the
shipped lifecycle's: see ``presets.engine_at_construction``)."""

_HANDOFF = ("drain_device", "barrier")
_SUSPEND_ALL = ("pause_collector", "suspend_engine", *_HANDOFF)
_OFFLOAD = ("offload_training_buffers", *_HANDOFF)

_STEP_TRANSITIONS: tuple[TransitionSpec, ...] = (
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
        description="Handoff to training: decide once, pause, park requests, drain own device, barrier.",
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
)

LIFECYCLE = with_stops(LifecycleSpec(states=STATES, actions=ACTIONS, transitions=_STEP_TRANSITIONS, name="lifecycle"))
"""The colocation lifecycle colo-fsm ships."""

TRANSITIONS: tuple[TransitionSpec, ...] = LIFECYCLE.transitions
"""Its transitions: the step's, then a ``stop`` from every state (:func:`with_stops`)."""

__all__ = [
    "ACTIONS",
    "ADOPT_ENGINE",
    "FACT_DESCRIPTIONS",
    "LIFECYCLE",
    "STATES",
    "STEP_WORK",
    "STOP_TRIGGER",
    "TRANSITIONS",
    "USER_TRIGGERS",
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
    "stop_transitions",
    "with_stops",
]
