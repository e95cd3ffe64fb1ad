"""megatron-core's engine loop as the coordinator engine reaches it: every call onto it and every wait beside it is
bounded by ``CoordinatorConfig.control_timeout_s`` and watches the loop for its end.

megatron-core 0.19.2 runs its engine loop as a task on an event loop of its own thread, and turns an exception in
that loop into ``sys.exit`` on the thread: nothing else would ever answer a request or a control call. So every
wait here asks ``died()`` every ``watch_interval_s`` (the engine looks with :func:`loop_death`, records a death
once and fails its pending requests) and raises the death it returns.

Used by :mod:`colo_fsm.adapters.megatron.coordinator`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from colo_fsm.errors import WaitTimeout

Died = Callable[[], BaseException | None]
"""The engine's check of its loop: the recorded death (an ``EngineLoopDied``) if the loop ended, else None."""


def loop_death(llm: Any, loop: asyncio.AbstractEventLoop | None) -> str | None:
    """How megatron's engine loop ended, in words (None while it runs)."""
    task = llm.engine.engine_loop_task
    if task.done():
        if task.cancelled():
            return "engine loop task cancelled"
        exc = task.exception()
        cause = getattr(exc, "__context__", None) or exc  # megatron turns the loop's exception into SystemExit
        return f"engine loop task ended: {type(cause).__name__}: {cause}" if cause else "engine loop task returned"
    if loop is not None and not loop.is_running():
        return "megatron's background event loop stopped"
    return None


def call_on_loop(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    what: str,
    *,
    timeout_s: float,
    interval_s: float,
    died: Died,
    state: Callable[[], str],
) -> Any:
    """Run ``coro`` on megatron's loop and return its result; raise the loop's death, or :class:`WaitTimeout`
    naming ``what`` and megatron's ``EngineState`` (``state()``) after ``timeout_s``."""
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fut.result(timeout=interval_s)
        except TimeoutError:
            dead = died()
            if dead is not None:
                fut.cancel()
                raise dead from None
            if time.monotonic() > deadline:
                fut.cancel()
                raise WaitTimeout(what, timeout_s, f"EngineState {state()}") from None


def wait_until(
    answered: threading.Condition,
    done: Callable[[], bool],
    what: str,
    *,
    timeout_s: float,
    interval_s: float,
    died: Died,
    state: Callable[[], str],
) -> None:
    """Wait until ``done()`` holds (read under ``answered``, notified at every reply handled); raise the loop's
    death, or :class:`WaitTimeout` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with answered:
            if done() or (answered.wait(interval_s) and done()):
                return
        dead = died()
        if dead is not None:
            raise dead
        if time.monotonic() > deadline:
            raise WaitTimeout(what, timeout_s, f"EngineState {state()}")


async def pin_device(device: Any) -> int | None:
    """On megatron's loop thread: make ``device`` its current CUDA device (the current device is per thread)."""
    from colo_fsm.adapters.megatron.parallel import rank_device_index

    index = rank_device_index(device)
    if index is None:
        return None
    import torch

    torch.cuda.set_device(index)
    return int(torch.cuda.current_device())


__all__ = ["Died", "call_on_loop", "loop_death", "pin_device", "wait_until"]
