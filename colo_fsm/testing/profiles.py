"""Hypothesis profiles for lifecycle tests.

* ``colo-fsm-ci``: derandomized (the same programs on every run), 500 programs of up to 30 steps each.
* ``colo-fsm-deep``: 5000 random programs of up to 60 steps (``make test-deep``).
* ``colo-fsm-dev``: 50 programs of up to 30 steps, for a quick local loop.

The profiles are registered when this module is imported with hypothesis installed (the ``[testing]`` extra;
without it, importing still works and the functions that need hypothesis say so), but never loaded globally: the lifecycle
machine's test case applies the active one (``COLO_FSM_HYPOTHESIS_PROFILE``, default ``colo-fsm-ci``) to itself
only, so other hypothesis tests in the same session keep their own settings.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from colo_fsm.errors import ConfigError

if TYPE_CHECKING:
    from hypothesis import settings

PROFILE_ENV = "COLO_FSM_HYPOTHESIS_PROFILE"
CI_PROFILE = "colo-fsm-ci"
DEEP_PROFILE = "colo-fsm-deep"
DEV_PROFILE = "colo-fsm-dev"


def hypothesis_available() -> bool:
    """Whether hypothesis is installed (``pip install 'colo-fsm[testing]'``)."""
    return find_spec("hypothesis") is not None


def register_profiles() -> None:
    """Register the colo-fsm profiles with hypothesis (idempotent)."""
    from hypothesis import HealthCheck, Phase, settings

    _COMMON: dict[str, Any] = {
        "deadline": None,
        "suppress_health_check": list(HealthCheck),
        "database": None,
        "print_blob": False,
        "report_multiple_bugs": False,
        "phases": [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    }
    settings.register_profile(CI_PROFILE, max_examples=500, derandomize=True, stateful_step_count=30, **_COMMON)
    settings.register_profile(DEEP_PROFILE, max_examples=5000, derandomize=False, stateful_step_count=60, **_COMMON)
    settings.register_profile(DEV_PROFILE, max_examples=50, derandomize=True, stateful_step_count=30, **_COMMON)


def active_profile() -> str:
    """The profile named by ``COLO_FSM_HYPOTHESIS_PROFILE``, else ``colo-fsm-ci``."""
    return os.environ.get(PROFILE_ENV) or CI_PROFILE


def lifecycle_settings(profile: str | None = None, **overrides: Any) -> settings:
    """Settings for a lifecycle machine run: a colo-fsm profile (default: the active one) plus ``overrides``."""
    from hypothesis import settings

    register_profiles()
    name = profile or active_profile()
    if name not in PROFILES:
        source = "profile" if profile else f"${PROFILE_ENV}"
        raise ConfigError(source, name, f"one of {', '.join(PROFILES)}")
    return settings(settings.get_profile(name), **overrides)


if hypothesis_available():
    register_profiles()
PROFILES = (CI_PROFILE, DEEP_PROFILE, DEV_PROFILE)
"""The colo-fsm hypothesis profiles."""

__all__ = [
    "CI_PROFILE",
    "DEEP_PROFILE",
    "DEV_PROFILE",
    "PROFILES",
    "PROFILE_ENV",
    "active_profile",
    "hypothesis_available",
    "lifecycle_settings",
    "register_profiles",
]
