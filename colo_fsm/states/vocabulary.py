"""The lifecycle's vocabulary: its states, the conditions adapters are in, the facts it latches, the roles of actions.

:mod:`colo_fsm.states.spec` declares the lifecycle in these words (and re-exports them).
"""

from __future__ import annotations

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
    CONCLUDING = "Concluding"  # after a validation-only wake: the early-stop latch, then save / stop / resume
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


class RequestCondition(StrEnum):
    """What the engine does with the requests it holds (rollouts, validation, HTTP)."""

    NONE = "none"  # no engine to hold requests (not built yet, or torn down: what was left is aborted)
    RUNNING = "running"  # the engine steps its active requests
    PARKED = "parked"  # kept in the engine at a decode-step boundary, no decode step runs; resumed once
    UNKNOWN = "unknown"  # after a failure


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
    VALIDATE_AT_START = "validate_at_start"  # the run validates once before the first step (latched at start)
    STOP_EARLY = "stop_early"  # latched once after a step's validation: the step becomes save-and-stop
    SAVE_PENDING = "save_pending"  # an (async) checkpoint save started and is not finalized yet


USER_TRIGGERS: tuple[str, ...] = ("start", "begin_step", "train", "end_validation", "stop")
"""The triggers the training loop fires (:class:`~colo_fsm.machine.lifecycle.Lifecycle` methods, the checker and
the testing kit); every other transition is automatic, fired by the machine itself."""

FACT_DESCRIPTIONS: dict[Fact, str] = {
    Fact.ENGINE_BUILT: "Build once: start is refused once it is set, and a second build raises EngineRebuild.",
    Fact.HANDOFF_COMPLETE: (
        "One communicator: true only after this rank drained its own device (the one LOCAL_RANK names) and every "
        "rank met the barrier, with no collective work issued since; train, generate and resume require it."
    ),
    Fact.SAVE_THIS_STEP: (
        "Decide once: whether this step checkpoints, evaluated once at begin_step; every later site reads the "
        "latched answer (a must-save-by deadline that fires once cannot be lost by a second query)."
    ),
    Fact.VALIDATE_THIS_STEP: "The same latch for validation (val_at_end makes the last step validate).",
    Fact.LAST_STEP: (
        "The run's last step (num_steps, or a deadline save that ends the run); it routes the end of the step to "
        "Done, so collection never resumes."
    ),
    Fact.STEP_TRAINED: "Weight versions: the optimizer step ran and the version was bumped exactly once.",
    Fact.VALIDATE_AT_START: "val_at_start: the run validates once before its first step.",
    Fact.STOP_EARLY: "Latched once after a step's validation; it upgrades the step to save-and-stop.",
    Fact.SAVE_PENDING: "An async save started and is not finalized: no wake and no end of the run until it is.",
}
"""Why each fact exists (the docs table reads it)."""


class Role(StrEnum):
    """What the runtime does for an action; the action's name is free, its role is not."""

    BUILD = "build"  # bring the engine up (once)
    ADOPT = "adopt"  # take over an engine (and server) that came up in its adapter's constructor: build nothing
    PUBLISH = "publish"  # publish the server base URLs
    LATCH = "latch"  # decide the facts in ``decides`` once (the step's decisions, validation at start)
    LATCH_STOP = "latch_stop"  # the early-stop decision, after validation; True upgrades the step (``upgrades``)
    PAUSE = "pause"  # collector stops issuing rollouts
    SUSPEND = "suspend"  # engine parks its requests at a decode-step boundary
    DRAIN = "drain"  # synchronize this rank's own device
    BARRIER = "barrier"  # every rank meets (sets handoff_complete when the own device was drained)
    RESTORE = "restore"  # training buffers back
    TRAIN = "train"  # one optimizer step
    BUMP = "bump"  # weight version + 1, once per step
    OFFLOAD = "offload"  # training buffers freed
    SAVE = "save"  # checkpoint save (may finish in the background)
    FINALIZE = "finalize"  # wait until every collective of the save has completed
    RESUME = "resume"  # engine resumes its parked requests
    RESUME_COLLECTOR = "resume_collector"  # collector issues rollouts again (given the weight version)
    RETURN_PROMPTS = "return_prompts"  # the collector takes back what will not be trained, for a restart to re-issue
    TEARDOWN = "teardown"  # engine shut down, then the trainer's and collector's optional teardown
