"""Lifecycle presets next to the shipped order: :data:`NEMO_RL`, and :func:`resolve_spec` for the command line.

:data:`NEMO_RL` orders a step the way NeMo-RL's GRPO loop does: validation *before* the save (the step's
validation metrics go into the checkpoint, for top-k retention), validation at start and on the last step, an
early-stop decision latched once after validation that upgrades the step to save-and-stop, and an asynchronous
checkpoint save whose finalize is its own action, done before any wake.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import (
    _HANDOFF,
    _OFFLOAD,
    ACTIONS,
    ADOPT_ENGINE,
    LIFECYCLE,
    STATES,
    STOP_TRIGGER,
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
    with_stops,
)

S, F = State, Fact


def _shipped(trigger: str, source: State) -> TransitionSpec:
    """The shipped lifecycle's transition ``trigger`` out of ``source`` (reused where NeMo-RL's step agrees)."""
    (t,) = (t for t in LIFECYCLE.outgoing(source) if t.trigger == trigger)
    return t


_NEMO_ACTIONS: tuple[ActionSpec, ...] = (
    *(
        dataclasses.replace(
            a,
            sets=(F.SAVE_PENDING,),
            description="Start the distributed checkpoint save (may finish in the background; world-wide collectives).",
        )
        if a.role is Role.SAVE
        else a
        for a in ACTIONS
    ),
    ActionSpec(
        "latch_run_start",
        "Decide once whether the run validates before its first step (val_at_start).",
        role=Role.LATCH,
        decides=(F.VALIDATE_AT_START,),
    ),
    ActionSpec(
        "latch_early_stop",
        "After a validation (at start too), decide once whether to stop early; if so the step is the last and "
        "saves what it trained.",
        role=Role.LATCH_STOP,
        decides=(F.STOP_EARLY,),
        upgrades=(F.SAVE_THIS_STEP, F.LAST_STEP),
    ),
    ActionSpec(
        "finalize_checkpoint",
        "Wait until every collective of the (async) save has completed; the trainer's finalize hook.",
        Collective.CHECKPOINT,
        role=Role.FINALIZE,
        calls=("trainer", "finalize_checkpoint"),
        clears=(F.SAVE_PENDING,),
    ),
)

_NEMO_STATES: tuple[StateSpec, ...] = (
    *STATES[: [s.state for s in STATES].index(S.DONE)],
    StateSpec(
        S.CONCLUDING,
        "Validation done, engine still awake for it: latch early stop, then save, stop, or resume collection.",
        EngineCondition.AWAKE,
        CollectorCondition.PAUSED,
        requests=RequestCondition.RUNNING,
    ),
    *STATES[[s.state for s in STATES].index(S.DONE) :],
)


_NEMO_TRANSITIONS: tuple[TransitionSpec, ...] = (
    TransitionSpec(
        "start",
        S.CREATED,
        S.STARTING,
        ("build_engine", "publish_server_urls", "latch_run_start", *_HANDOFF),
        unless=(F.ENGINE_BUILT,),
        description="Build the engine once; decide whether to validate first.",
    ),
    TransitionSpec(
        "generate",
        S.STARTING,
        S.GENERATING,
        ("resume_collector",),
        when=(F.HANDOFF_COMPLETE,),
        unless=(F.VALIDATE_AT_START,),
        automatic=True,
        description="Every rank has the engine up: start collecting.",
    ),
    TransitionSpec(
        "validate",
        S.STARTING,
        S.VALIDATING,
        (),
        when=(F.HANDOFF_COMPLETE, F.VALIDATE_AT_START),
        automatic=True,
        description="val_at_start: validate before the first step (collector still paused).",
    ),
    _shipped("begin_step", S.GENERATING),
    _shipped("train", S.DRAINING),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.VALIDATING,
        (*_OFFLOAD, "resume_engine"),
        when=(F.STEP_TRAINED, F.VALIDATE_THIS_STEP),
        automatic=True,
        description="Validate before the save: validation-only wake after drain and barrier (also the last step).",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.CHECKPOINTING,
        (*_OFFLOAD, "save_checkpoint"),
        when=(F.STEP_TRAINED, F.SAVE_THIS_STEP),
        unless=(F.VALIDATE_THIS_STEP,),
        automatic=True,
        description="Save before any wake: engine and collector stay suspended.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.DONE,
        _OFFLOAD,
        when=(F.STEP_TRAINED, F.LAST_STEP),
        unless=(F.VALIDATE_THIS_STEP, F.SAVE_THIS_STEP),
        automatic=True,
        description="Last step without a save or validation: never wake the engine.",
    ),
    TransitionSpec(
        "conclude",
        S.TRAINING,
        S.WAKING,
        _OFFLOAD,
        when=(F.STEP_TRAINED,),
        unless=(F.VALIDATE_THIS_STEP, F.SAVE_THIS_STEP, F.LAST_STEP),
        automatic=True,
        description="Handoff to generation: offload, drain own device, barrier.",
    ),
    TransitionSpec(
        "end_validation",
        S.VALIDATING,
        S.CONCLUDING,
        ("latch_early_stop",),
        description="Validation finished (at start or after a step): decide once whether to stop early.",
    ),
    TransitionSpec(
        "conclude",
        S.CONCLUDING,
        S.CHECKPOINTING,
        ("suspend_engine", *_HANDOFF, "save_checkpoint"),
        when=(F.SAVE_THIS_STEP,),
        automatic=True,
        description="Drain, barrier and suspend after the validation wake, before the first checkpoint collective.",
    ),
    TransitionSpec(
        "conclude",
        S.CONCLUDING,
        S.DONE,
        ("suspend_engine", *_HANDOFF),
        when=(F.LAST_STEP,),
        unless=(F.SAVE_THIS_STEP,),
        automatic=True,
        description="val_at_end, or an early stop (at start: before any step): the engine never resumes collection.",
    ),
    TransitionSpec(
        "conclude",
        S.CONCLUDING,
        S.GENERATING,
        ("resume_collector",),
        unless=(F.SAVE_THIS_STEP, F.LAST_STEP),
        automatic=True,
        description="No save, not the last step: the engine is awake already, collection (re)starts.",
    ),
    TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.DONE,
        ("finalize_checkpoint", *_HANDOFF),
        when=(F.LAST_STEP,),
        automatic=True,
        description="Last step (or early stop): the save is finalized; the engine stays down.",
    ),
    TransitionSpec(
        "conclude",
        S.CHECKPOINTING,
        S.WAKING,
        ("finalize_checkpoint", *_HANDOFF),
        unless=(F.LAST_STEP,),
        automatic=True,
        description="Finalize the async save (every checkpoint collective done) before any wake.",
    ),
    TransitionSpec(
        "resume",
        S.WAKING,
        S.GENERATING,
        ("resume_engine", "resume_collector"),
        when=(F.HANDOFF_COMPLETE,),
        unless=(F.SAVE_PENDING,),
        automatic=True,
        description="Resume signal only after drain and barrier, never with a save still pending.",
    ),
)

NEMO_RL = with_stops(
    LifecycleSpec(
        states=_NEMO_STATES,
        actions=_NEMO_ACTIONS,
        transitions=_NEMO_TRANSITIONS,
        validate_before_save=True,
        name="nemo_rl",
    )
)
"""NeMo-RL's step order: validate before the save, val at start and end, early stop, async save + finalize."""


def engine_at_construction(spec: LifecycleSpec, *, name: str | None = None) -> LifecycleSpec:
    """``spec`` for an adapter whose engine (and HTTP server) come up in its constructor, as NeMo-RL's
    ``MegatronGeneration`` does: the initial state declares the engine awake and ``start`` adopts it (the engine
    must report awake, through ``condition`` or ``engine_state()``; its URLs are published) instead of building it.
    Every tool reads it."""
    init = spec.state(spec.initial)
    if init.engine is EngineCondition.AWAKE:
        return spec
    states = tuple(
        dataclasses.replace(
            s,
            engine=EngineCondition.AWAKE,
            requests=RequestCondition.RUNNING,
            description="The engine (and its server) came up in the adapter's constructor; collection not started.",
        )
        if s.state == spec.initial
        else s
        for s in spec.states
    )
    build = set(spec.with_role(Role.BUILD))
    adopt = ADOPT_ENGINE
    actions = tuple(a for a in spec.actions if a.name not in build)
    if adopt.name not in {a.name for a in actions}:
        actions = (*actions, adopt)
    transitions = tuple(
        dataclasses.replace(
            t,
            actions=tuple(adopt.name if a in build else a for a in t.actions),
            description="Adopt the engine its adapter built (check it is awake), publish its URLs.",
        )
        if any(a in build for a in t.actions)
        else t
        for t in spec.transitions
        if not (t.trigger == STOP_TRIGGER and t.source == spec.initial)  # derived again below: the engine is up there
    )
    return with_stops(
        dataclasses.replace(
            spec, states=states, actions=actions, transitions=transitions, name=name or f"{spec.name}_engine_up"
        )
    )


NEMO_RL_ENGINE_UP = engine_at_construction(NEMO_RL)
""":data:`NEMO_RL` with the engine (and server) up at construction, as NeMo-RL's ``MegatronGeneration`` builds it:
``start`` adopts it instead of building it."""

PRESETS: dict[str, LifecycleSpec] = {
    "lifecycle": LIFECYCLE,
    "default": LIFECYCLE,
    "nemo_rl": NEMO_RL,
    "nemo_rl_engine_up": NEMO_RL_ENGINE_UP,
}
"""Specs known by name on the command line (``--spec NAME``)."""


_SPEC_FORMS = "a preset ({presets}), module:ATTRIBUTE (an importable module) or path/to/file.py:ATTRIBUTE"


def _load_file(path: Path, name: str) -> object:
    """Import the Python file ``path`` as a module of its own (its folder first on sys.path while it runs)."""
    if not path.is_file():
        raise ConfigError("spec", name, f"an existing Python file ({path} does not exist)")
    mod_name = f"colo_fsm_user_spec_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError("spec", name, f"a Python file importlib can load ({path})")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise ConfigError("spec", name, f"a file that imports cleanly ({type(exc).__name__}: {exc})") from exc
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def resolve_spec(name: str | LifecycleSpec) -> LifecycleSpec:
    """A preset by name (``lifecycle``, ``nemo_rl``), a user's spec as ``module:attribute``, or one in a file as
    ``path/to/file.py:attribute`` (an attribute holding a LifecycleSpec, or a callable returning one)."""
    if isinstance(name, LifecycleSpec):
        return name
    forms = _SPEC_FORMS.format(presets=", ".join(PRESETS))
    if not isinstance(name, str) or not name:
        raise ConfigError("spec", name, forms)
    if name in PRESETS:
        return PRESETS[name]
    module, sep, attr = name.rpartition(":")
    if not sep or not module or not attr:
        raise ConfigError("spec", name, forms)
    obj: object
    if module.endswith(".py") or "/" in module or "\\" in module:
        obj = _load_file(Path(module), name)
    else:
        try:
            obj = importlib.import_module(module)
        except ImportError as exc:
            guess = Path(*module.split(".")).with_suffix(".py")
            raise ConfigError(
                "spec",
                name,
                f"an importable module ({type(exc).__name__}: {exc}); a spec in a file of this folder is loaded by "
                f"path: --spec {guess}:{attr} (or put its folder on PYTHONPATH)",
            ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("spec", name, f"an attribute {attr!r} of {module!r}")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, LifecycleSpec):
        obj = obj()
    if not isinstance(obj, LifecycleSpec):
        raise ConfigError("spec", name, "a colo_fsm.states.spec.LifecycleSpec")
    return obj


__all__ = ["NEMO_RL", "NEMO_RL_ENGINE_UP", "PRESETS", "engine_at_construction", "resolve_spec"]
