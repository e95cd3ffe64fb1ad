"""Replay buffer and asynchronous collector.

Public API (small on purpose)::

    from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TextRollout, TrajectoryGroup

    buffer = ReplayBuffer(num_prompts_per_step=8, max_trajectory_age_steps=1)
    rollout = TextRollout(generator, reward_fn, samples_per_group=4, max_tokens=32)   # or your own fn
    collector = AsyncCollector(rollout, prompts, buffer, weight_version=lambda: lc.weight_version,
                               cap=InFlightCap(8, 1, samples_per_group=4))
    lc = Lifecycle(engine, trainer, collector,
                   checkpoint_extra=lambda: {"replay_buffer": buffer.state_dict()})
    lc.start()                                              # resumes the collector
    while not lc.finished:
        batch = buffer.sample(lc.weight_version, timeout=60)  # exactly 8 groups, none older than 1 version
        lc.step(batch)                                      # pauses the collector for the handoff
    lc.stop(); collector.close()

* :class:`TrajectoryGroup` -- one prompt's samples (:class:`~colo_fsm.adapters.protocols.Completion`),
  rewards, the ``weight_version`` that generated them and the ``target_step`` (a weight version) meant to
  consume them. Bad fields raise ``ConfigError``.
* :class:`ReplayBuffer` -- a FIFO in rollout-start order. ``sample(weight_version, timeout)`` blocks until
  the ``num_prompts_per_step`` groups at the head are finished and returns exactly those; groups older than
  ``max_trajectory_age_steps`` are evicted and counted (``evicted_stale``, ``on_evict``). ``reserve()``
  admits a rollout only if it cannot go stale (used by the collector; ``put(group)`` without a ticket also
  works). ``state_dict()`` / ``load_state_dict()`` are JSON-able; ``stats()`` gives size, pending, average
  age, evicted count.
* :class:`AsyncCollector` -- implements the ``Collector`` protocol (``pause()`` returns at once and rollouts in
  flight stay parked in the engine, ``inflight="park"``, the default; ``inflight="drain"`` waits for them); calls a sync or async rollout ``Prompt -> TrajectoryGroup`` in the background, tags groups with
  the weight versions at generation time (oldest and newest), caps in-flight groups (``InFlightCap``, reported once when
  lowered). :class:`TextRollout` is a ready-made rollout over a ``TextGenerator``. A rollout that finds
  ``collector.should_defer()`` True before its engine work raises :class:`RolloutDeferred`: its prompt is put
  back (front of the queue, saved by ``collector.state_dict()``) instead of making the pause wait for it.
* :mod:`colo_fsm.collector.metrics` -- ``step_metrics`` (buffer size, average age, evicted-as-stale,
  collector counters, time in each lifecycle state per step from the trace) for ``MetricsLogger``.
"""

from colo_fsm.collector.buffer import BufferStats, ReplayBuffer, Ticket, TrajectoryGroup
from colo_fsm.collector.collector import AsyncCollector, Prompt, as_prompts
from colo_fsm.collector.metrics import StateTimer, state_time_metrics, state_times_per_step, step_metrics
from colo_fsm.collector.rollout import RolloutFn, TextRollout
from colo_fsm.collector.stats import CollectorStats
from colo_fsm.errors import RolloutDeferred

__all__ = [
    "AsyncCollector",
    "BufferStats",
    "CollectorStats",
    "Prompt",
    "ReplayBuffer",
    "RolloutDeferred",
    "RolloutFn",
    "StateTimer",
    "TextRollout",
    "Ticket",
    "TrajectoryGroup",
    "as_prompts",
    "state_time_metrics",
    "state_times_per_step",
    "step_metrics",
]
