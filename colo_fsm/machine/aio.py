"""Drive a :class:`~colo_fsm.machine.lifecycle.Lifecycle` from an asyncio loop.

Transitions run one at a time on a dedicated worker thread, so the event loop (serving HTTP requests,
collecting rollouts) stays responsive while a handoff drains and barriers. Cancelling the awaiting task does
not interrupt a transition: it runs to completion (a half-done handoff would be worse), and the
cancellation is delivered to the caller afterwards. This is the opposite of ``transitions.AsyncMachine``,
where a second trigger cancels the callbacks of an in-flight one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from colo_fsm.adapters.protocols import StepResult
from colo_fsm.errors import ConfigError
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleStatus
from colo_fsm.states.spec import State

T = TypeVar("T")


class AsyncLifecycle:
    """Async facade over a :class:`Lifecycle`: ``await alc.step(batch)`` etc., serialized on one thread."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        if not isinstance(lifecycle, Lifecycle):
            raise ConfigError("lifecycle", lifecycle, "a colo_fsm.Lifecycle")
        self.lifecycle = lifecycle
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"colo-fsm-r{lifecycle.rank}")

    @property
    def state(self) -> State:
        """The current state."""
        return self.lifecycle.state

    @property
    def finished(self) -> bool:
        """See :attr:`Lifecycle.finished`."""
        return self.lifecycle.finished

    @property
    def weight_version(self) -> int:
        """The weight version generation reads now."""
        return self.lifecycle.weight_version

    def status(self) -> LifecycleStatus:
        """See :meth:`Lifecycle.status` (a snapshot; safe from the event loop)."""
        return self.lifecycle.status()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])  # let the transition finish; never leave a handoff half done
            raise

    async def fire(self, trigger: str) -> State:
        """Fire one user trigger (and the automatic transitions it enables)."""
        return await self._run(self.lifecycle.fire, trigger)

    async def start(self) -> State:
        """See :meth:`Lifecycle.start`."""
        return await self._run(self.lifecycle.start)

    async def step(self, batch: Any) -> StepResult:
        """See :meth:`Lifecycle.step`."""
        return await self._run(self.lifecycle.step, batch)

    async def begin_step(self) -> State:
        """See :meth:`Lifecycle.begin_step`."""
        return await self._run(self.lifecycle.begin_step)

    async def train(self, batch: Any) -> State:
        """See :meth:`Lifecycle.train`."""
        return await self._run(self.lifecycle.train, batch)

    async def end_validation(self) -> State:
        """See :meth:`Lifecycle.end_validation`."""
        return await self._run(self.lifecycle.end_validation)

    async def stop(self, unused: Sequence[Any] | None = None) -> State:
        """See :meth:`Lifecycle.stop`; also shuts the worker thread down (once Stopped: a failed stop can retry)."""
        try:
            return await self._run(self.lifecycle.stop, unused)
        finally:
            if self.lifecycle.spec.state(self.lifecycle.state).terminal:
                self._executor.shutdown(wait=False)


__all__ = ["AsyncLifecycle"]
