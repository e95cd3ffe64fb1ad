"""Drain this rank's own device before a handoff barrier."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from colo_fsm.errors import ConfigError, DrainError


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


class DeviceDrain:
    """Synchronize the device named by ``LOCAL_RANK``, never the calling thread's current device.

    The calling thread (a Ray caller thread, an engine event-loop thread) may never have called
    ``torch.cuda.set_device``; a bare ``torch.cuda.synchronize()`` would then drain GPU 0 and leave this
    rank's own GPU running. ``synchronize`` is injectable for tests; by default it is
    ``torch.cuda.synchronize`` and the drain is a no-op on a machine without CUDA (CPU collectives are
    synchronous).
    """

    def __init__(
        self,
        local_rank: int | None = None,
        *,
        synchronize: Callable[[int], None] | None = None,
        device_count: Callable[[], int] | None = None,
    ) -> None:
        self.local_rank = local_rank_from_env() if local_rank is None else local_rank
        if isinstance(self.local_rank, bool) or not isinstance(self.local_rank, int) or self.local_rank < 0:
            raise ConfigError("local_rank", local_rank, "a non-negative integer")
        for name, fn in (("synchronize", synchronize), ("device_count", device_count)):
            if fn is not None and not callable(fn):
                raise ConfigError(name, fn, "None or a callable")
        self._synchronize = synchronize
        self._device_count = device_count

    def target_device(self) -> int:
        """The device index this drain synchronizes (always the rank's own)."""
        return self.local_rank

    def __call__(self) -> int:
        """Drain the rank's own device; returns the device index drained, or -1 when there is no CUDA."""
        device = self.target_device()
        if self._synchronize is not None:
            self._synchronize(device)
            return device
        import torch

        if not torch.cuda.is_available():
            return -1
        count = self._device_count() if self._device_count else torch.cuda.device_count()
        if device >= count:
            raise DrainError(f"LOCAL_RANK={device} names a device that does not exist ({count} visible)")
        torch.cuda.synchronize(torch.device("cuda", device))
        return device


__all__ = ["DeviceDrain", "local_rank_from_env"]
