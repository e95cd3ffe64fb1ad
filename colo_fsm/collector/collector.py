"""The asynchronous collector: keeps generating trajectory groups across steps, paused for every handoff.

It runs an asyncio loop in a background thread. A rollout function turns one :class:`Prompt` into a
:class:`~colo_fsm.collector.buffer.TrajectoryGroup`; it may be a plain function (run in a thread pool) or an
``async def`` (awaited on the loop, e.g. awaiting Ray actor calls). The collector tags every group with the
weight versions it was generated under and the step meant to consume it, and caps the prompt groups in
flight (:class:`~colo_fsm.guards.capacity.InFlightCap`).

Park, don't drain (``LifecycleRule.PARK_NOT_DRAIN``): by default (``inflight="park"``) :meth:`AsyncCollector.pause`
stops issuing new rollouts and returns at once. Rollouts in flight are not waited for: their requests stay
parked in the engine while it is suspended for the step and finish after the resume, under the new weights;
their groups land in the buffer afterwards, tagged with the oldest and newest version their tokens came
from. ``inflight="drain"`` keeps the strictly on-policy behaviour: the pause waits until none is in flight.

A rollout that has not started its engine work when the collector is paused may raise
:class:`~colo_fsm.errors.RolloutDeferred` (check :meth:`AsyncCollector.should_defer`): its prompt goes back to
the front of the collector's queue and is rolled out after the next resume. Returned prompts, and the prompts
of rollouts parked in the engine, are part of :meth:`AsyncCollector.state_dict`.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from colo_fsm.collector.buffer import ReplayBuffer, Ticket, TrajectoryGroup
from colo_fsm.collector.prompts import Prompt, as_prompts
from colo_fsm.collector.rollout import RolloutFn, TextRollout
from colo_fsm.collector.saved_state import STATE_DICT_FORMAT, restored_prompts, snapshot
from colo_fsm.collector.stats import CollectorStats
from colo_fsm.collector.versions import rollout_versions
from colo_fsm.errors import ConfigError, LifecycleError, RolloutDeferred, RolloutFailed, WaitTimeout
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.log import get_logger

log = get_logger(__name__)

INFLIGHT_POLICIES = ("park", "drain", "abort")
"""What :meth:`AsyncCollector.pause` does with rollouts in flight: leave them in the engine (default "park"; with
"abort" the engine ends their requests at the suspend and resubmits them after the resume, so for the collector
it is the same as "park") or wait for them ("drain")."""


def parse_inflight(value: Any) -> str:
    """``value`` (a string or an ``InflightPolicy``; aliases "keep" and "wait") as "park", "drain" or "abort";
    anything else raises ConfigError naming the field and the choices."""
    from colo_fsm.adapters.engine.options import parse_inflight as parse_policy

    return parse_policy(value).value


_DEFER_RETRY_S = 0.05
"""After a rollout deferred while the collector was running, wait this long before starting another."""
_CANCEL_WAIT_S = 5.0
"""How long close() gives the rollouts it cancelled to end before the collector's event loop closes."""


@dataclass
class _Running:
    """One rollout in flight: its prompt (saved by a checkpoint taken while it is parked) and how many pauses it saw."""

    prompt: Prompt
    version: int
    pauses: int = 0
    abandoned: bool = False  # taken back by a stop: its prompt is put back, its result (if any) discarded


class AsyncCollector:
    """Generates trajectory groups in the background into a :class:`ReplayBuffer`; implements ``Collector``.

    It starts paused; :meth:`resume` (called by the lifecycle when collection starts) starts it.
    :meth:`pause` stops new rollouts and returns at once with ``inflight="park"`` (the default: rollouts in
    flight stay parked in the engine and finish after the step), or only when no rollout of this collector is
    in flight with ``inflight="drain"``. At most ``cap`` prompt groups are in flight, and the buffer's age
    window bounds how far ahead it generates. ``admit`` (optional, cheap,
    non-blocking) is asked before every start, e.g. ``lambda: lc.state is State.GENERATING`` so that no rollout
    starts between a handoff's first step and its ``pause_collector`` action.

    ``hold_while_batch_waits`` (off by default) starts no rollout while the buffer already holds the trainer's
    next batch. With ``inflight="drain"`` it is the difference between a handoff that waits for rollouts started
    just before it, tail included, and one that has nothing to wait for: after a resume the collector and the
    trainer's next handoff race, and without the hold the collector usually goes first. On one H200 one drain
    handoff in three that went the other way by chance lifted drain from 4.65 to 5.64 samples/s
    (docs/gpu-runs/PERFORMANCE.md), and on the CPU a held drain ran level with park or a little ahead of it (bench/HANDOFF.md).

    Deferral: when rollouts share one engine that serves them one at a time, most of the ``cap`` rollouts in
    flight are only waiting for it, and a pause would wait for all of them to generate. A rollout should
    instead check :meth:`should_defer` right before its engine work (under the same lock that serializes it)
    and raise :class:`~colo_fsm.errors.RolloutDeferred` when it is True. The collector then releases the
    rollout's buffer place, puts the prompt back at the front of its queue (in the order prompts were
    drawn), counts it in ``stats().deferred`` (not as a failure) and starts it again after :meth:`resume`.
    Prompts put back are drawn before the prompt iterable and saved by :meth:`state_dict`, so a checkpoint of
    the iterable's position plus this state loses none.

    Checkpoints with rollouts parked: the engine's requests are not checkpointed, so :meth:`state_dict` saves
    the prompts of the rollouts in flight (to be issued again, first, on restore) together with the buffer's
    finished groups, in one snapshot under the collector's lock (a group moves from "in flight" to "in the
    buffer" atomically). A live run just continues its parked rollouts; a run restored from the checkpoint
    re-issues each exactly once. Nothing is lost and nothing is trained on twice.
    """

    def __init__(
        self,
        rollout: RolloutFn,
        prompts: Iterable[Prompt | str | tuple[str, str]],
        buffer: ReplayBuffer,
        weight_version: Callable[[], int],
        *,
        cap: InFlightCap | int | None = None,
        max_consecutive_failures: int = 3,
        pause_timeout_s: float = 600.0,
        max_threads: int = 64,
        admit: Callable[[], bool] | None = None,
        name: str = "collector",
        inflight: Any = "park",
        hold_while_batch_waits: bool = False,
    ) -> None:
        if not callable(rollout):
            raise ConfigError("rollout", rollout, "a callable Prompt -> TrajectoryGroup (sync or async)")
        if not isinstance(buffer, ReplayBuffer):
            raise ConfigError("buffer", buffer, "a ReplayBuffer")
        if admit is not None and not callable(admit):
            raise ConfigError("admit", admit, "a callable () -> bool, or None")
        if not isinstance(hold_while_batch_waits, bool):
            raise ConfigError("hold_while_batch_waits", hold_while_batch_waits, "True or False")
        if not callable(weight_version):
            raise ConfigError("weight_version", weight_version, "a callable returning the current weight version")
        if isinstance(prompts, str | bytes) or not isinstance(prompts, Iterable):
            raise ConfigError("prompts", prompts, "an iterable of Prompt, str or (prompt_id, text)")
        if isinstance(cap, InFlightCap):
            for f in ("num_prompts_per_step", "max_trajectory_age_steps"):
                if getattr(cap, f) != getattr(buffer, f):
                    raise ConfigError(f"cap.{f}", getattr(cap, f), f"the buffer's {f}={getattr(buffer, f)}")
            self.in_flight_cap: InFlightCap | None = cap
            self.cap = cap.report(log)
        elif cap is None:
            self.in_flight_cap = None
            self.cap = buffer.num_prompts_per_step * max(1, buffer.max_trajectory_age_steps)
        elif isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1:
            self.in_flight_cap = None
            self.cap = cap
        else:
            raise ConfigError("cap", cap, "an InFlightCap, a positive integer or None")
        for fname, v in (("max_consecutive_failures", max_consecutive_failures), ("max_threads", max_threads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(fname, v, "a positive integer")
        if isinstance(pause_timeout_s, bool) or not isinstance(pause_timeout_s, int | float) or pause_timeout_s <= 0:
            raise ConfigError("pause_timeout_s", pause_timeout_s, "a positive number of seconds")
        self.inflight = parse_inflight(inflight)
        self.rollout = rollout
        self.buffer = buffer
        self.name = name
        self._weight_version = weight_version
        self._admit = admit
        self.hold_while_batch_waits = hold_while_batch_waits
        self._is_async = inspect.iscoroutinefunction(rollout) or inspect.iscoroutinefunction(type(rollout).__call__)
        self._prompts = as_prompts(prompts)
        self._drawn = 0  # prompts taken from self._prompts (their order numbers)
        self._returned: list[tuple[int, Prompt]] = []  # deferred prompts by order number, started before new ones
        self._defer_retry_at = 0.0  # monotonic time before which nothing starts (after a deferral while running)
        self._deferred = 0
        self._max_failures = max_consecutive_failures
        self._pause_timeout_s = float(pause_timeout_s)
        self._max_threads = max_threads
        self._cond = threading.Condition()
        self._paused = True
        self._closing = False
        self._cancel = False  # set by close() once it waited: the loop cancels the rollouts left and ends
        self._exhausted = False
        self._in_flight = 0
        self._max_in_flight = 0
        self._started = 0
        self._completed = 0
        self._failed = 0
        self._consecutive_failures = 0
        self._version_changed = 0
        self._running: dict[int, _Running] = {}  # rollouts in flight by order number
        self._spanning = 0
        self._pauses = 0
        self._in_flight_at_pause = 0
        self._abandoned = 0
        self.error: RolloutFailed | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ready = threading.Event()

    # ------------------------------------------------------------------ Collector protocol
    def pause(self) -> None:
        """Stop starting rollouts. ``park``: return at once, rollouts in flight stay parked in the engine and
        finish after the step. ``drain``: wait until none is in flight (``WaitTimeout`` after ``pause_timeout_s``).

        Rollouts that check :meth:`should_defer` before their engine work and raise ``RolloutDeferred`` end at
        once; a drain then waits only for those already generating.
        """
        t0 = time.monotonic()
        with self._cond:
            if not self._paused:
                self._pauses += 1
                self._in_flight_at_pause = self._in_flight
                for r in self._running.values():
                    r.pauses += 1
            self._paused = True
            if self.inflight == "drain" and not self._cond.wait_for(
                lambda: self._in_flight == 0, timeout=self._pause_timeout_s
            ):
                raise WaitTimeout(
                    f"{self.name}: in-flight rollouts to finish on pause (inflight='drain')",
                    self._pause_timeout_s,
                    f"{self._in_flight} still in flight",
                )
            parked = self._in_flight
        log.debug(
            "%s paused in %.1f ms (%s, %d rollout(s) parked)",
            self.name,
            (time.monotonic() - t0) * 1e3,
            self.inflight,
            parked,
        )

    def resume(self) -> None:
        """Start (or restart) issuing rollouts; raises :class:`RolloutFailed` if rollouts kept failing."""
        if self.error is not None:
            raise self.error
        with self._cond:
            if self._closing:
                raise ConfigError("collector", self.name, "a collector that was not closed")
            self._paused = False
        self._ensure_thread()
        self._poke()

    def take_back(self, unused: Iterable[TrajectoryGroup] = ()) -> int:
        """What a stop hands back, called by the lifecycle before it tears the engine down: stop issuing, put the
        prompts of ``unused`` (groups drawn for a step that was not trained) and of every rollout in flight back
        at the front of the queue, and discard those rollouts' results (the teardown aborts them: no failure is
        counted or logged). :meth:`state_dict` then saves them all, so a restart issues each again, once.
        Returns how many rollouts in flight were taken back."""
        groups = list(unused)
        prompts = []
        for i, g in enumerate(groups):
            if not isinstance(g, TrajectoryGroup):
                raise ConfigError(
                    f"unused[{i}]", type(g).__name__, "a TrajectoryGroup (what ReplayBuffer.sample gives)"
                )
            prompts.append(Prompt(g.prompt_id, g.prompt, dict(g.metadata)))
        with self._cond:
            self._paused = True
            taken = self._abandon_running_locked()
            first = min([o for o, _ in self._returned] + [self._drawn])  # the batch was drawn before them all
            self._returned[:0] = [(first - len(prompts) + k, p) for k, p in enumerate(prompts)]
        log.info(
            "%s: took back %d prompt(s) in flight and %d of an unused batch, to be issued again after a restart",
            self.name,
            taken,
            len(prompts),
        )
        return taken

    # ------------------------------------------------------------------ queries
    @property
    def paused(self) -> bool:
        """True while the collector does not start new rollouts."""
        return self._paused

    def should_defer(self) -> bool:
        """True when a rollout that has not started its engine work should raise ``RolloutDeferred``.

        That is while the collector is paused (a handoff is under way) or closing. Cheap and lock-free; call it
        right before the engine work, under the lock that serializes that work (if any), so that nothing starts
        generating between the check and the work except a rollout the pause parks or waits for.
        """
        return self._paused or self._closing

    @property
    def in_flight(self) -> int:
        """Prompt groups being rolled out right now."""
        return self._in_flight

    @property
    def parked(self) -> int:
        """Rollouts in flight across at least one pause (parked in the engine during a handoff) not finished yet."""
        with self._cond:
            return sum(1 for r in self._running.values() if r.pauses)

    @property
    def in_flight_prompts(self) -> tuple[Prompt, ...]:
        """Prompts of the rollouts in flight (in the order they were drawn)."""
        with self._cond:
            return tuple(self._running[k].prompt for k in sorted(self._running))

    @property
    def returned_prompts(self) -> tuple[Prompt, ...]:
        """Prompts whose rollouts were deferred and wait to be started again (in the order they were drawn)."""
        with self._cond:
            return tuple(p for _, p in self._returned)

    def stats(self) -> CollectorStats:
        """Counters: started, completed, failed, in flight (and its maximum), the cap."""
        with self._cond:
            return CollectorStats(
                started=self._started,
                completed=self._completed,
                failed=self._failed,
                in_flight=self._in_flight,
                max_in_flight=self._max_in_flight,
                cap=self.cap,
                paused=self._paused,
                exhausted=self._exhausted,
                version_changed_mid_rollout=self._version_changed,
                deferred=self._deferred,
                returned=len(self._returned),
                parked=sum(1 for r in self._running.values() if r.pauses),
                spanning=self._spanning,
                abandoned=self._abandoned,
                pauses=self._pauses,
                in_flight_at_pause=self._in_flight_at_pause,
            )

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot: prompts to issue again on restore, and the buffer's finished groups.

        Saved, in one snapshot under the collector's lock: the prompts put back by deferred rollouts, the
        prompts of the rollouts in flight (parked in the engine during a handoff: engine state is not
        checkpointed, so a restored run issues them again, first, in the order they were drawn), and
        ``replay_buffer`` (:meth:`ReplayBuffer.state_dict`). A rollout that finishes is moved from "in flight"
        to the buffer atomically, so it is in exactly one of the two. Save it next to the prompt iterable's
        position (through the Lifecycle's ``checkpoint_extra``): those prompts were already drawn from the
        iterable. The prompts' metadata must be JSON-able for a JSON checkpoint. Raises
        :class:`LifecycleError` while collecting with rollouts in flight (new draws would race the iterable's
        position); the lifecycle saves paused.
        """
        with self._cond:
            if self._in_flight and not self._paused:
                raise LifecycleError(
                    f"{self.name}: state_dict() while collecting with {self._in_flight} rollout(s) in flight; "
                    "pause the collector first"
                )
            # a rollout a stop took back is among the returned prompts already
            parked = [(o, r.prompt) for o, r in sorted(self._running.items()) if not r.abandoned]
            return snapshot(self._returned, parked, self.buffer.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` snapshot: its prompts (deferred and parked, in the order they were
        drawn) are started first, before the prompt iterable; its ``replay_buffer`` (if any) is loaded into the
        buffer.

        Call it before the first :meth:`resume` (or while paused with nothing in flight); it replaces any
        prompts currently put back.
        """
        restored = restored_prompts(state)
        buffer_state = state.get("replay_buffer")
        with self._cond:
            if not self._paused or self._in_flight:
                raise LifecycleError(f"{self.name}: load_state_dict() while collecting; call it while paused")
            if buffer_state is not None:
                self.buffer.load_state_dict(buffer_state)
            # order numbers just below the next draw's: restored prompts go first, in their saved order
            base = self._drawn - len(restored)
            self._returned = [(base + i, p) for i, p in enumerate(restored)]

    def close(self, timeout: float = 30.0) -> None:
        """Stop for good: no new rollouts, wait for those in flight (up to ``timeout``), stop the thread.

        Rollouts a stop took back (:meth:`take_back`) are not waited for: their results would be discarded. Those
        still in flight after ``timeout``, and the ones taken back, are cancelled and awaited before the
        collector's event loop closes (none is left pending): an async rollout awaiting an engine handle's
        :meth:`~colo_fsm.adapters.engine.results.FutureHandle.wait` aborts its request that way. Their prompts are
        put back (:attr:`returned_prompts`, saved by :meth:`state_dict`), as by a stop; none counts as failed.
        """
        with self._cond:
            self._paused = True
            self._closing = True
            self._cond.wait_for(lambda: all(r.abandoned for r in self._running.values()), timeout=timeout)
            cut = self._abandon_running_locked()
            self._cancel = True
        if cut:
            log.warning(
                "%s: closed with %d rollout(s) still in flight after %.1f s: cancelled, prompt(s) put back",
                self.name,
                cut,
                timeout,
            )
        self._poke()
        if self._thread is not None:
            self._thread.join(max(timeout, 2 * _CANCEL_WAIT_S))
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> AsyncCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _ensure_thread(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            if not self._is_async:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=min(self.cap, self._max_threads), thread_name_prefix=f"{self.name}-rollout"
                )
            self._thread = threading.Thread(target=self._run_loop, name=f"{self.name}-loop", daemon=True)
            self._thread.start()
        self._ready.wait(10.0)

    def _run_loop(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._dispatch())
        finally:
            loop.close()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop closed meanwhile
                pass

    def _try_start(self) -> tuple[Prompt, int, int, Ticket] | None:
        with self._cond:
            if self._paused or self._closing or self.error is not None:
                return None
            if self._exhausted and not self._returned:
                return None
            if self._in_flight >= self.cap or time.monotonic() < self._defer_retry_at:
                return None
            if self._admit is not None and not self._admit():
                return None
            version = int(self._weight_version())
            if self.hold_while_batch_waits and self.buffer.ready(version) >= self.buffer.num_prompts_per_step:
                return None  # the trainer's next batch is already here: a rollout started now would only be drained
            ticket = self.buffer.reserve(version)
            if ticket is None:
                return None
            if self._returned:  # prompts put back by deferred rollouts go first
                order, prompt = self._returned.pop(0)
            else:
                try:
                    prompt = next(self._prompts)
                except StopIteration:
                    self.buffer.release(ticket)
                    self._exhausted = True
                    log.info("%s: prompts exhausted after %d groups", self.name, self._started)
                    return None
                except ConfigError:
                    self.buffer.release(ticket)
                    raise
                order = self._drawn
                self._drawn += 1
            self._in_flight += 1
            self._started += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._running[order] = _Running(prompt, version)
            return prompt, order, version, ticket

    async def _dispatch(self) -> None:
        self._wake = asyncio.Event()
        self._ready.set()
        tasks: set[asyncio.Task[None]] = set()
        while not self._cancel:  # closing: nothing starts (_try_start), the rollouts in flight may still finish
            try:
                started = self._try_start()
            except ConfigError as exc:  # a malformed prompt: stop collecting, surface the error
                self._record_fatal(exc)
                started = None
            if started is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=0.02)
                except TimeoutError:
                    pass
                continue
            task = asyncio.get_running_loop().create_task(self._run_one(*started))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        # closing: close() has marked every rollout still in flight abandoned (its result would be discarded);
        # cancel them and wait for them to end, so that the loop does not close with tasks pending
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)
            if pending:
                log.warning(
                    "%s: %d rollout(s) still running %.0f s after being cancelled at close (a rollout that "
                    "swallows asyncio.CancelledError?)",
                    self.name,
                    len(pending),
                    _CANCEL_WAIT_S,
                )

    async def _run_one(self, prompt: Prompt, order: int, version: int, ticket: Ticket) -> None:
        try:
            if self._is_async:
                group = await self.rollout(prompt)  # type: ignore[misc]
            else:
                loop = asyncio.get_running_loop()
                group = await loop.run_in_executor(self._pool, self.rollout, prompt)
            if not isinstance(group, TrajectoryGroup):
                raise ConfigError("rollout result", type(group).__name__, "a TrajectoryGroup")
            with self._cond:
                paused_at_end = self._paused
            end_version = int(self._weight_version())
            tagged = self._tag(group, version, end_version, ticket, paused_at_end=paused_at_end)
        except RolloutDeferred as exc:
            self._put_back(prompt, order, ticket, exc)
        except BaseException as exc:
            if self._drop_abandoned(order, ticket):
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            self.buffer.release(ticket)
            with self._cond:
                self._failed += 1
                self._consecutive_failures += 1
                n = self._consecutive_failures
                self._finish_locked(order)
            log.error(
                "%s: rollout of %s failed (%d in a row): %s: %s",
                self.name,
                prompt.prompt_id,
                n,
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, asyncio.CancelledError),
            )
            if n >= self._max_failures:
                self._record_fatal(exc, n)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            with self._cond:  # into the buffer and out of "in flight" in one step (see state_dict)
                running = self._running.get(order)
                if running is not None and running.abandoned:  # taken back by a stop: its prompt is put back
                    self._drop_abandoned(order, ticket)
                    return
                if running is not None and running.pauses:
                    self._spanning += 1
                if end_version != version:
                    self._version_changed += 1
                self.buffer.put(tagged, ticket=ticket)
                self._completed += 1
                self._consecutive_failures = 0
                self._finish_locked(order)
            if end_version != version:
                log.log(
                    logging.WARNING if self.inflight == "drain" else logging.DEBUG,
                    "%s: rollout of %s spanned weight versions %d..%d (tokens from %d..%d)%s",
                    self.name,
                    prompt.prompt_id,
                    version,
                    end_version,
                    tagged.weight_version,
                    tagged.newest_version,
                    " although inflight='drain' (was the collector not paused for the step?)"
                    if self.inflight == "drain"
                    else "",
                )
        finally:
            self._poke()

    def _abandon_running_locked(self) -> int:
        """Mark every rollout in flight abandoned (its result discarded) and put its prompt back at the front of
        the queue, in draw order; returns how many were not abandoned yet. Call with ``self._cond`` held."""
        taken = 0
        for order in sorted(self._running):
            running = self._running[order]
            if not running.abandoned:
                running.abandoned = True
                bisect.insort(self._returned, (order, running.prompt), key=lambda item: item[0])
                taken += 1
        return taken

    def _drop_abandoned(self, order: int, ticket: Ticket) -> bool:
        """A rollout a stop took back ended: free its place, count it, keep its result out (its prompt is put
        back already). False when it was not taken back."""
        with self._cond:
            running = self._running.get(order)
            if running is None or not running.abandoned:
                return False
            self._abandoned += 1
            self._finish_locked(order)
            self.buffer.release(ticket)
        return True

    def _finish_locked(self, order: int) -> None:
        self._running.pop(order, None)
        self._in_flight -= 1
        self._cond.notify_all()

    def _tag(
        self, group: TrajectoryGroup, version: int, end_version: int, ticket: Ticket, *, paused_at_end: bool = False
    ) -> TrajectoryGroup:
        """The group tagged with the versions that generated it
        (:func:`~colo_fsm.collector.versions.rollout_versions`) and its ticket's target step."""
        oldest, newest = rollout_versions(group.samples, version, end_version, paused_at_end=paused_at_end)
        return group.with_version(oldest, ticket.target_step, newest)

    def _put_back(self, prompt: Prompt, order: int, ticket: Ticket, exc: RolloutDeferred) -> None:
        """A deferred rollout: give its buffer place back and its prompt back to the front of the queue."""
        self.buffer.release(ticket)
        with self._cond:
            self._deferred += 1
            self._finish_locked(order)
            bisect.insort(self._returned, (order, prompt), key=lambda item: item[0])
            running = not (self._paused or self._closing)
            if running:  # deferred although not paused: don't retry at once (it would spin)
                self._defer_retry_at = time.monotonic() + _DEFER_RETRY_S
        log.debug(
            "%s: rollout of %s deferred (%s)%s; prompt put back",
            self.name,
            prompt.prompt_id,
            exc.reason,
            " while collecting, retrying shortly" if running else "",
        )

    def _record_fatal(self, exc: BaseException, n: int = 1) -> None:
        err = RolloutFailed(n, exc)
        err.__cause__ = exc
        with self._cond:
            if self.error is None:
                self.error = err
        log.error("%s: collection stopped: %s", self.name, err)
        self.buffer.fail(err)


def collect_sync(
    rollout: Callable[[Prompt], TrajectoryGroup], prompts: Sequence[Prompt | str], weight_version: int
) -> list[TrajectoryGroup]:
    """Roll out ``prompts`` once, synchronously, tagged with ``weight_version`` (for validation and tests)."""
    return [rollout(p).with_version(weight_version, weight_version) for p in as_prompts(prompts)]


__all__ = [
    "INFLIGHT_POLICIES",
    "STATE_DICT_FORMAT",
    "AsyncCollector",
    "CollectorStats",
    "Prompt",
    "RolloutFn",
    "TextRollout",
    "as_prompts",
    "collect_sync",
    "parse_inflight",
]
