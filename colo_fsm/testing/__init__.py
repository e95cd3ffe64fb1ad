"""Test *your* adapters against the colocation lifecycle.

* :mod:`~colo_fsm.testing.fakes`: recording fakes of engine, trainer and collector, a fake clock, request
  source and replay buffer;
* :mod:`~colo_fsm.testing.lifecycle_machine`: a hypothesis stateful machine that drives a lifecycle over your
  adapters and checks every lifecycle fact after every step (:func:`lifecycle_test_case`, :func:`check_lifecycle`);
  it judges what your engine does (:mod:`~colo_fsm.testing.effects`: the tokens of the kit's own requests against
  the lifecycle's own calls), refuses a broken spec before any program (:mod:`~colo_fsm.testing.spec_gate`) and
  reports one failure briefly (:mod:`~colo_fsm.testing.report`);
* :mod:`~colo_fsm.testing.checker`: an exhaustive checker of every interleaving of N ranks
  (``python -m colo_fsm.testing.checker --ranks 2..8``);
* :mod:`~colo_fsm.testing.scenarios`: the step plans (latched save/validate decisions) the checker runs;
* :mod:`~colo_fsm.testing.pytest_plugin`: fixtures (``colo_fsm_adapters``, ``colo_fsm_check_lifecycle``, ...)
  and the ``colo-fsm-ci`` / ``colo-fsm-deep`` hypothesis profiles.

How colo-fsm proves itself (mutants, fault injection, component properties) is not installed: it lives in the
repository's ``tests/support/``.
"""

from typing import Any

from colo_fsm.testing.checker import CheckResult, StepPlan, check, check_all
from colo_fsm.testing.fakes import (
    FakeClock,
    FakeReplayBuffer,
    FakeRequestSource,
    Journal,
    RecordingCollector,
    RecordingDrain,
    RecordingEngine,
    RecordingTrainer,
    recording_adapters,
)
from colo_fsm.testing.profiles import CI_PROFILE, DEEP_PROFILE, DEV_PROFILE, hypothesis_available, lifecycle_settings
from colo_fsm.testing.scenarios import SCENARIOS

# The lifecycle machine needs hypothesis (the ``[testing]`` extra). Without it the fakes, the checker and the
# pytest plugin still import, and asking for a machine name says what to install.
_MACHINE = (
    "Adapters",
    "KitHandle",
    "LifecycleMachine",
    "check_lifecycle",
    "exercise_ranks",
    "lifecycle_machine",
    "lifecycle_test_case",
    "recording_fakes",
    "spec_fakes",
)
if hypothesis_available():
    from colo_fsm.testing.lifecycle_machine import (
        Adapters,
        KitHandle,
        LifecycleMachine,
        check_lifecycle,
        exercise_ranks,
        lifecycle_machine,
        lifecycle_test_case,
        recording_fakes,
        spec_fakes,
    )
else:

    def __getattr__(name: str) -> Any:
        if name in _MACHINE:
            raise ModuleNotFoundError(
                f"colo_fsm.testing.{name} needs hypothesis: pip install 'colo-fsm[testing]'", name="hypothesis"
            )
        raise AttributeError(f"module 'colo_fsm.testing' has no attribute {name!r}")


__all__ = [
    "CI_PROFILE",
    "DEEP_PROFILE",
    "DEV_PROFILE",
    "SCENARIOS",
    "Adapters",
    "CheckResult",
    "FakeClock",
    "FakeReplayBuffer",
    "FakeRequestSource",
    "Journal",
    "KitHandle",
    "LifecycleMachine",
    "RecordingCollector",
    "RecordingDrain",
    "RecordingEngine",
    "RecordingTrainer",
    "StepPlan",
    "check",
    "check_all",
    "check_lifecycle",
    "exercise_ranks",
    "lifecycle_machine",
    "lifecycle_settings",
    "lifecycle_test_case",
    "recording_adapters",
    "recording_fakes",
    "spec_fakes",
]
