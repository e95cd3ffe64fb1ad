"""A Ray actor class from a plain body class, with the lifecycle's control calls in their own concurrency group.

A Ray asyncio actor runs at most ``max_concurrency`` calls at once; calls beyond that queue in arrival order.
Control methods declared here in the ``"control"`` group have their own slots and event loop, so a handoff never
queues behind rollout calls (:mod:`colo_fsm.ray.actors` says why, for the worker and the collector).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray

from colo_fsm.errors import ConfigError

CONTROL_GROUP = "control"
"""Name of the concurrency group lifecycle control calls run in."""


def control_method(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    """``base`` (an async method) wrapped to run in the ``"control"`` concurrency group, under ``name``."""

    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await base(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = base.__doc__
    return ray.method(concurrency_group=CONTROL_GROUP)(method)


def actor_class(
    body: type,
    control: Sequence[str],
    name: str,
    *,
    separate_control_group: bool,
    control_concurrency: int,
    max_concurrency: int,
    module: str,
    extra_groups: dict[str, int] | None = None,
) -> Any:
    """``body`` as a Ray actor class named ``name`` (its ``__module__`` is ``module``, where the caller binds it):
    the methods named in ``control`` run in the ``"control"`` concurrency group (``control_concurrency`` slots,
    its own event loop) unless ``separate_control_group`` is False; everything else in the default group
    (``max_concurrency`` slots)."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ConfigError("max_concurrency", max_concurrency, "a positive integer")
    if isinstance(control_concurrency, bool) or not isinstance(control_concurrency, int) or control_concurrency < 1:
        raise ConfigError("control_concurrency", control_concurrency, "a positive integer")
    attrs: dict[str, Any] = {"__module__": module, "__qualname__": name}
    options: dict[str, Any] = {"max_concurrency": max_concurrency, "num_cpus": 0}
    groups = dict(extra_groups or {})
    if separate_control_group:
        for m in control:
            attrs[m] = control_method(m, getattr(body, m))
        groups[CONTROL_GROUP] = control_concurrency
    if groups:
        options["concurrency_groups"] = groups
    return ray.remote(**options)(type(name, (body,), attrs))


__all__ = ["CONTROL_GROUP", "actor_class", "control_method"]
