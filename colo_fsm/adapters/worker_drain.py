"""A drain method for Ray workers that do not have one (NeMo-RL's policy and generation workers), and its fan-out.

The lifecycle drains each rank's own device before every handoff barrier. In a single-controller run the ranks
are Ray workers, so each worker needs a ``drain()`` that synchronizes *its* device, and the driver's ``drain``
calls it on every worker and waits. Add :class:`DrainsOwnDevice` to the worker class (or call
:func:`drain_own_device` from a method you add) and pass :func:`fan_out_drain` of the workers (or of the worker
group) as the lifecycle's ``drain``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from colo_fsm.errors import ConfigError
from colo_fsm.guards.drain import local_rank_from_env


def worker_device(device_count: int, env: Mapping[str, str] | None = None) -> int:
    """The CUDA device index of this worker's own GPU: 0 when Ray narrowed ``CUDA_VISIBLE_DEVICES`` to one device,
    else ``LOCAL_RANK`` (every device visible, the worker's is the one its local rank names)."""
    if device_count <= 0:
        raise ConfigError("device_count", device_count, "a visible CUDA device (this worker drains nothing)")
    if device_count == 1:
        return 0
    local = local_rank_from_env(os.environ if env is None else env)
    if local >= device_count:
        raise ConfigError("LOCAL_RANK", local, f"a device index below the {device_count} visible to this worker")
    return local


def drain_own_device(
    *,
    synchronize: Callable[[int], None] | None = None,
    device_count: Callable[[], int] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """``torch.cuda.synchronize`` on this worker's own device (never the thread's current one); returns the device
    index, or -1 where no CUDA device is visible (a CPU worker has nothing in flight)."""
    torch: Any = None
    if synchronize is None or device_count is None:
        import torch
    count = device_count() if device_count is not None else torch.cuda.device_count()
    if count <= 0:
        return -1
    device = worker_device(count, env)
    if synchronize is not None:
        synchronize(device)
    else:
        torch.cuda.synchronize(torch.device("cuda", device))
    return device


class DrainsOwnDevice:
    """Mixin for a Ray worker class: ``drain()`` synchronizes the worker's own device (see :func:`drain_own_device`).

    For NeMo-RL, add it to the policy worker (and the generation worker when it runs in other processes)::

        class MyPolicyWorker(DrainsOwnDevice, MegatronPolicyWorker): ...
    """

    def drain(self) -> int:
        """Synchronize this worker's own device; returns its index (-1 without CUDA)."""
        return drain_own_device()


def fan_out_drain(
    workers: Any, *, method: str = "drain", get: Callable[[Any], Any] | None = None
) -> Callable[[], list[int]]:
    """The lifecycle's ``drain`` in the driver: call ``method`` on every worker and wait for all of them.

    ``workers`` is a sequence of Ray actor handles, or a worker group with ``run_all_workers_single_data(method)``
    (NeMo-RL's ``RayWorkerGroup``); ``get`` waits for the futures (default ``ray.get``).
    """
    fan = getattr(workers, "run_all_workers_single_data", None)
    if not callable(fan) and (isinstance(workers, str | bytes) or not isinstance(workers, Sequence) or not workers):
        raise ConfigError("workers", workers, "actor handles, or a worker group with run_all_workers_single_data")
    if get is not None and not callable(get):
        raise ConfigError("get", get, "None or a callable waiting for a list of futures")

    def drain() -> list[int]:
        if callable(fan):
            futures = list(fan(method))
        else:
            futures = [getattr(w, method).remote() for w in workers]
        wait = get
        if wait is None:
            import ray

            wait = ray.get
        return [int(x) for x in wait(futures)]

    return drain


__all__ = ["DrainsOwnDevice", "drain_own_device", "fan_out_drain", "worker_device"]
