"""pytest plugin for colo-fsm lifecycle tests (entry point ``colo_fsm``; active wherever colo-fsm is installed).

In your ``conftest.py``, say which adapters to test::

    import pytest

    @pytest.fixture
    def colo_fsm_adapters():
        return lambda: (MyEngine(), MyTrainer(), MyCollector())   # a fresh set per program

and in a test module::

    def test_my_adapters_follow_the_lifecycle(colo_fsm_check_lifecycle):
        colo_fsm_check_lifecycle()          # hundreds of programs, every lifecycle rule checked after every step

Fixtures: ``colo_fsm_adapters`` (override it; default: the recording fakes), ``colo_fsm_settings`` (the active
hypothesis profile), ``colo_fsm_machine`` (the :class:`~colo_fsm.testing.lifecycle_machine.LifecycleMachine`
subclass for your adapters), ``colo_fsm_check_lifecycle`` (run it now), ``colo_fsm_components`` (your batch factory, drain, decisions and
validator, used by both checks), ``colo_fsm_check_ranks`` (N sets of your adapters as thread ranks,
then the exhaustive multi-rank checker of the spec; a checkpoint decision with a time rule gets rank 0's answer
across the thread ranks, the agreement a real run gets from ``broadcast_from_rank0()``), ``colo_fsm_spec`` (the spec; default the shipped
lifecycle). Option ``--colo-fsm-profile`` picks ``colo-fsm-ci`` (default), ``colo-fsm-deep`` or
``colo-fsm-dev`` (also ``COLO_FSM_HYPOTHESIS_PROFILE``).

Without hypothesis (a core-only install) the plugin still loads: the profiles are not registered and the
fixtures that need hypothesis fail with the command that installs it.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from colo_fsm.guards.decision import CheckpointDecision
from colo_fsm.testing.profiles import PROFILE_ENV, PROFILES, hypothesis_available, register_profiles

_NEEDS = "needs hypothesis: pip install 'colo-fsm[testing]'"


def _require_hypothesis(fixture: str) -> None:
    if not hypothesis_available():
        pytest.fail(f"{fixture} {_NEEDS}", pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("colo-fsm")
    group.addoption(
        "--colo-fsm-profile",
        default=None,
        help="hypothesis profile for colo-fsm lifecycle machine tests: colo-fsm-ci (default, 500 "
        "derandomized programs), colo-fsm-deep (5000) or colo-fsm-dev (50); also "
        f"${PROFILE_ENV}",
    )


def pytest_configure(config: pytest.Config) -> None:
    if hypothesis_available():
        register_profiles()
    profile = config.getoption("--colo-fsm-profile", default=None)
    if profile:
        if profile not in PROFILES:
            raise pytest.UsageError(f"--colo-fsm-profile={profile!r}: expected one of {', '.join(PROFILES)}")
        os.environ[PROFILE_ENV] = profile


@pytest.fixture
def colo_fsm_adapters() -> Callable[..., Any]:
    """A factory of ``(engine, trainer, collector)`` or ``Adapters`` (no argument, or the program's ``KitHandle``);
    override it in conftest. Default: the recording fakes, shaped for the spec (see ``spec_fakes``)."""
    _require_hypothesis("colo_fsm_adapters")
    from colo_fsm.testing.lifecycle_machine import spec_fakes

    return spec_fakes


@pytest.fixture
def colo_fsm_settings() -> Any:
    """The hypothesis settings of the active colo-fsm profile."""
    _require_hypothesis("colo_fsm_settings")
    from colo_fsm.testing.profiles import lifecycle_settings

    return lifecycle_settings()


@pytest.fixture
def colo_fsm_machine(colo_fsm_adapters: Callable[[], Any]) -> type[Any]:
    """A :class:`~colo_fsm.testing.lifecycle_machine.LifecycleMachine` subclass driving your adapters."""
    _require_hypothesis("colo_fsm_machine")
    from colo_fsm.testing.lifecycle_machine import lifecycle_machine

    return lifecycle_machine(colo_fsm_adapters)


@pytest.fixture
def colo_fsm_components() -> dict[str, Any]:
    """Your components, used by every kit fixture (override it in conftest): any of ``batch_factory``,
    ``drain_factory``, ``validator``, ``validator_factory``, ``checkpoint_factory``, ``validation_factory``,
    ``early_stop_factory`` (factories take the program's ``KitHandle``). Default: none (the kit's own)."""
    return {}


@pytest.fixture
def colo_fsm_check_lifecycle(
    colo_fsm_adapters: Callable[..., Any],
    colo_fsm_settings: Any,
    colo_fsm_spec: Any,
    colo_fsm_components: dict[str, Any],
) -> Callable[..., None]:
    """Call to run the lifecycle machine on your adapters and components now; keyword arguments override machine
    settings (``async_training=False``, ``inject_faults=False``, ``use_async_lifecycle=True``, ``settings=...``)."""
    _require_hypothesis("colo_fsm_check_lifecycle")
    from colo_fsm.testing.lifecycle_machine import check_lifecycle

    def run(settings: Any = None, **attrs: Any) -> None:
        __tracebackhide__ = True
        attrs.setdefault("spec", colo_fsm_spec)
        for key, value in colo_fsm_components.items():
            attrs.setdefault(key, value)
        check_lifecycle(colo_fsm_adapters, settings=settings or colo_fsm_settings, **attrs)

    return run


@pytest.fixture
def colo_fsm_spec() -> Any:
    """The lifecycle spec your adapters run (override it in conftest, e.g. ``colo_fsm.states.NEMO_RL``)."""
    from colo_fsm.states.spec import LIFECYCLE

    return LIFECYCLE


@pytest.fixture
def colo_fsm_check_ranks(
    colo_fsm_adapters: Callable[..., Any], colo_fsm_spec: Any, colo_fsm_components: dict[str, Any]
) -> Callable[..., Any]:
    """Call with N: N sets of your adapters and components run a short run as thread ranks at one barrier (their
    calls audited), then every interleaving of N ranks of the spec is checked. Returns a ``RanksResult``
    (``.ok``, ``.check``); pass ``adapters=False`` to check only the spec (``adapters_exercised=False``). A
    checkpoint decision with a time rule (``save_and_stop``, ``must_save_by_s``) and no ``agree`` gets rank 0's
    answer across the thread ranks (:func:`thread_agreed`), as ``broadcast_from_rank0()`` gives a real run's."""
    from colo_fsm.testing.lifecycle_machine import exercise_ranks

    def run(ranks: int, *, adapters: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("spec", colo_fsm_spec)
        for key, value in colo_fsm_components.items():
            if key != "barrier_factory":  # thread ranks meet at the kit's own barrier
                kwargs.setdefault(key, value)
        if kwargs.get("checkpoint_factory") is not None:  # the agreement a time rule needs, across the thread ranks
            kwargs["checkpoint_factory"] = thread_agreed(kwargs["checkpoint_factory"], ranks)
        return exercise_ranks(colo_fsm_adapters if adapters else None, ranks, **kwargs)

    return run


class RankZeroAcrossThreads:
    """What :func:`~colo_fsm.guards.decision.broadcast_from_rank0` does for ranks that are threads of one process:
    every rank adopts rank 0's answer (each call is one round of a barrier the ranks share; every rank calls it
    the same number of times, in the same order, as the latch does)."""

    def __init__(self, ranks: int, *, timeout_s: float = 60.0) -> None:
        self._barrier = threading.Barrier(ranks)
        self._timeout_s = timeout_s
        self._value = False

    def for_rank(self, rank: int) -> Callable[[bool], bool]:
        """The ``agree`` function of thread rank ``rank``."""

        def agree(value: bool) -> bool:
            if rank == 0:
                self._value = bool(value)
            self._barrier.wait(self._timeout_s)
            answer = self._value
            self._barrier.wait(self._timeout_s)  # nobody writes the next answer before every rank read this one
            return answer

        return agree


def thread_agreed(factory: Callable[..., Any], ranks: int) -> Callable[[Any], Any]:
    """``factory`` (no argument, or the rank's ``KitHandle``) whose checkpoint decisions with a time rule and no
    ``agree`` get rank 0's answer across ``ranks`` thread ranks, as a real run's broadcast would give them."""
    shared = RankZeroAcrossThreads(ranks)
    takes_handle = any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in inspect.signature(factory).parameters.values()
    )

    def build(handle: Any) -> Any:
        decision = factory(handle) if takes_handle else factory()
        if isinstance(decision, CheckpointDecision) and decision.needs_agreement and not decision.agrees:
            decision.agree_with(shared.for_rank(int(getattr(handle, "rank", 0))))
        return decision

    return build
