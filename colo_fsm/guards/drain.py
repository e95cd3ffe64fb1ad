"""Drain this rank's own device before a handoff barrier."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from colo_fsm.errors import ConfigError, DrainError
from colo_fsm.log import get_logger

log = get_logger(__name__)


def local_rank_from_env(env: Mapping[str, str] | None = None) -> int:
    """``LOCAL_RANK`` as an int (0 when unset); a malformed value raises :class:`ConfigError`."""
    raw = (os.environ if env is None else env).get("LOCAL_RANK", "0")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError("LOCAL_RANK", raw, "a non-negative integer") from None
    if value < 0:
        raise ConfigError("LOCAL_RANK", raw, "a non-negative integer")
    return value


def _ray_driver_with_gpus() -> bool:
    """True in a Ray driver (not a worker) of a cluster that has GPUs: the workers hold them, not this process."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        if not ray.is_initialized():
            return False
        from ray._private import worker as ray_worker

        if ray_worker.global_worker.mode != ray_worker.SCRIPT_MODE:
            return False
        return float(ray.cluster_resources().get("GPU", 0)) > 0
    except Exception:  # pragma: no cover - a Ray without these internals: do not guess
        return False


class NoDeviceDrain:
    """The explicit no-op drain of a process that owns no GPU (a CPU-only run); ``reason`` says why.

    Returns -1 from every drain. Pass it on purpose: :class:`DeviceDrain` refuses to be built where it
    would drain nothing.
    """

    local_rank = -1

    def __init__(self, reason: str = "CPU-only run") -> None:
        if not isinstance(reason, str) or not reason:
            raise ConfigError("reason", reason, "a non-empty string saying why this process drains nothing")
        self.reason = reason

    def target_device(self) -> int:
        """No device (-1)."""
        return -1

    def __call__(self) -> int:
        """Nothing to drain: returns -1."""
        return -1


class DeviceDrain:
    """Synchronize the device named by ``LOCAL_RANK``, never the calling thread's current device.

    The calling thread (a Ray caller thread, an engine event-loop thread) may never have called
    ``torch.cuda.set_device``; a bare ``torch.cuda.synchronize()`` would then drain GPU 0 and leave this
    rank's own GPU running. ``synchronize`` is injectable for tests; by default it is
    ``torch.cuda.synchronize`` (torch is imported here, when the drain is built, not in the first drain).

    A drain that would silently do nothing raises :class:`ConfigError` at construction, saying what to pass
    instead: no CUDA device visible (pass :class:`NoDeviceDrain` for a CPU-only run), CUDA devices but no
    ``LOCAL_RANK`` and no ``local_rank`` (pass it), or a Ray driver of a cluster whose workers hold the GPUs
    (pass ``colo_fsm.ray.RayDrain(workers)``: every worker drains its own device).
    """

    def __init__(
        self,
        local_rank: int | None = None,
        *,
        synchronize: Callable[[int], None] | None = None,
        device_count: Callable[[], int] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        for name, fn in (("synchronize", synchronize), ("device_count", device_count)):
            if fn is not None and not callable(fn):
                raise ConfigError(name, fn, "None or a callable")
        if local_rank is not None and (
            isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0
        ):
            raise ConfigError("local_rank", local_rank, "a non-negative integer")
        environ = os.environ if env is None else env
        self._synchronize = synchronize
        self._device_count = device_count
        self._torch: Any = None
        if synchronize is None:
            if _ray_driver_with_gpus():
                raise ConfigError(
                    "drain",
                    "DeviceDrain() in a Ray driver",
                    "drain=RayDrain(workers) (colo_fsm.ray): the cluster's GPUs belong to the workers, and a "
                    "drain on the driver would synchronize none of them",
                )
            import torch

            self._torch = torch
            count = device_count() if device_count is not None else torch.cuda.device_count()
            if count <= 0:
                raise ConfigError(
                    "drain",
                    "DeviceDrain()",
                    "NoDeviceDrain() for a CPU-only run (no CUDA device is visible to this process; a device "
                    "drain here would drain nothing), or RayDrain(workers) when Ray workers hold the GPUs",
                )
            if local_rank is None and "LOCAL_RANK" not in environ:
                raise ConfigError(
                    "LOCAL_RANK",
                    None,
                    f"LOCAL_RANK set (torchrun sets it) or DeviceDrain(local_rank) with this rank's device: "
                    f"{count} CUDA device(s) are visible and draining a guessed one leaves the rank's own running",
                )
        self.local_rank = local_rank_from_env(environ) if local_rank is None else local_rank
        if isinstance(self.local_rank, bool) or not isinstance(self.local_rank, int) or self.local_rank < 0:
            raise ConfigError("local_rank", local_rank, "a non-negative integer")

    def target_device(self) -> int:
        """The device index this drain synchronizes (always the rank's own)."""
        return self.local_rank

    def __call__(self) -> int:
        """Drain the rank's own device; returns the device index drained."""
        device = self.target_device()
        if self._synchronize is not None:
            self._synchronize(device)
            return device
        torch = self._torch
        count = self._device_count() if self._device_count else torch.cuda.device_count()
        if device >= count:
            raise DrainError(f"LOCAL_RANK={device} names a device that does not exist ({count} visible)")
        torch.cuda.synchronize(torch.device("cuda", device))
        return device


def default_drain(local_rank: int | None = None) -> DeviceDrain | NoDeviceDrain:
    """The drain a process gets when it names none: :class:`DeviceDrain` where CUDA is visible, else an
    explicit :class:`NoDeviceDrain` (logged). The misconfigurations :class:`DeviceDrain` refuses still raise."""
    if _ray_driver_with_gpus():
        return DeviceDrain(local_rank)  # raises, naming RayDrain
    import torch

    if torch.cuda.device_count() <= 0:
        log.info("no CUDA device visible: drain is a no-op (NoDeviceDrain)")
        return NoDeviceDrain("no CUDA device visible to this process")
    return DeviceDrain(local_rank)


__all__ = ["DeviceDrain", "NoDeviceDrain", "default_drain", "local_rank_from_env"]
