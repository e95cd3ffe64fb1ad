"""The in-flight cap: bounded by trajectory age and by the capacity of the actor that takes rollout calls."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from colo_fsm.errors import ConfigError
from colo_fsm.log import get_logger

log = get_logger(__name__)

RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY = 1000
"""A Ray asyncio actor runs at most this many calls at once unless told otherwise."""


def _positive(field: str, value: object, *, allow_zero: bool = False) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(field, value, "a non-negative integer" if allow_zero else "a positive integer")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class InFlightCap:
    """How many prompt groups the collector may have in flight.

    ``configured = num_prompts_per_step * max_trajectory_age_steps`` is what the age bound allows. Each
    group fans out ``samples_per_group`` calls to an actor that runs at most ``actor_max_concurrency``
    calls at once, of which ``control_headroom`` stay free for lifecycle control calls, so the actor
    allows ``(actor_max_concurrency - control_headroom) // samples_per_group`` groups. When control calls
    have their own concurrency group, pass ``control_headroom=0``.
    """

    num_prompts_per_step: int
    max_trajectory_age_steps: int
    samples_per_group: int
    actor_max_concurrency: int = RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY
    control_headroom: int = 8

    def __post_init__(self) -> None:
        _positive("num_prompts_per_step", self.num_prompts_per_step)
        _positive("max_trajectory_age_steps", self.max_trajectory_age_steps)
        _positive("samples_per_group", self.samples_per_group)
        _positive("actor_max_concurrency", self.actor_max_concurrency)
        _positive("control_headroom", self.control_headroom, allow_zero=True)
        if self.control_headroom >= self.actor_max_concurrency:
            raise ConfigError(
                "control_headroom",
                self.control_headroom,
                f"fewer than actor_max_concurrency={self.actor_max_concurrency} calls",
            )
        if self.actor_capacity_groups < 1:
            raise ConfigError(
                "samples_per_group",
                self.samples_per_group,
                f"at most actor_max_concurrency - control_headroom = "
                f"{self.actor_max_concurrency - self.control_headroom} so one group fits the actor",
            )

    @property
    def configured(self) -> int:
        """The cap the age bound alone allows."""
        return self.num_prompts_per_step * self.max_trajectory_age_steps

    @property
    def actor_capacity_groups(self) -> int:
        """Prompt groups the receiving actor can run at once, control headroom kept free."""
        return (self.actor_max_concurrency - self.control_headroom) // self.samples_per_group

    @property
    def value(self) -> int:
        """The effective cap: the smaller of the two bounds."""
        return min(self.configured, self.actor_capacity_groups)

    @property
    def lowered(self) -> bool:
        """Whether actor capacity lowered the configured cap."""
        return self.value < self.configured

    def explain(self) -> str:
        """One line with both numbers."""
        return (
            f"in-flight prompt groups capped at {self.value} (configured "
            f"num_prompts_per_step*max_trajectory_age_steps={self.configured}; actor allows "
            f"({self.actor_max_concurrency}-{self.control_headroom})//{self.samples_per_group}="
            f"{self.actor_capacity_groups})"
        )

    def report(self, logger: logging.Logger | logging.LoggerAdapter | None = None) -> int:
        """Log once, with both numbers, when the cap was lowered; return the effective cap."""
        if self.lowered:
            (logger or log).warning("%s: lowered by actor capacity", self.explain())
        return self.value


__all__ = ["RAY_ASYNC_ACTOR_DEFAULT_MAX_CONCURRENCY", "InFlightCap"]
