"""Ray mode: rollout workers and the collector as Ray actors, driven by one driver-side lifecycle.

* :func:`init_ray` -- ``ray.init()`` locally by default, or connect to ``address``.
* :data:`RolloutWorker` / :func:`make_worker_class` -- per-rank worker actor owning a gated engine;
  ``generate`` in the default group, control calls (``bring_up``, ``suspend``, ``resume``, ``shutdown``,
  ``drain``, ``health``) in the ``"control"`` concurrency group, so they never queue behind rollouts.
* :data:`CollectorActor` / :func:`make_collector_class` -- the replay buffer and async collector in one actor
  (``pause``/``resume`` in the control group, ``sample`` in the default group).
* :class:`RayEngineProxy`, :class:`RayCollectorProxy`, :class:`RayDrain` -- driver-side objects implementing
  the engine / collector protocols and the drain by fanning out to the actors (the gather is the barrier).
* :class:`RayTextRollout` -- rollout for the collector actor: one ``generate`` call per sample.

Typical wiring::

    init_ray()                                     # or init_ray("auto") on a cluster
    workers = [RolloutWorker.remote(r, factory) for r in range(n)]
    engine = RayEngineProxy(workers)
    holder = {}
    coll = CollectorActor.remote(lambda: RayTextRollout(workers, reward, samples_per_group=4, max_tokens=64),
                                 prompts, num_prompts_per_step=8, max_trajectory_age_steps=1,
                                 cap=InFlightCap(8, 1, samples_per_group=4, control_headroom=0))
    collector = RayCollectorProxy(coll, lambda: holder["lc"].weight_version)
    lc = holder["lc"] = Lifecycle(engine, trainer, collector, drain=RayDrain(workers))
"""

from colo_fsm.ray.actors import (
    COLLECTOR_CONTROL_METHODS,
    CONTROL_GROUP,
    WORKER_CONTROL_METHODS,
    CollectorActor,
    CollectorBody,
    RolloutWorker,
    RolloutWorkerBody,
    make_collector_class,
    make_worker_class,
)
from colo_fsm.ray.driver import RayCollectorProxy, RayDrain, RayEngineProxy, RayTextRollout, init_ray

__all__ = [
    "COLLECTOR_CONTROL_METHODS",
    "CONTROL_GROUP",
    "WORKER_CONTROL_METHODS",
    "CollectorActor",
    "CollectorBody",
    "RayCollectorProxy",
    "RayDrain",
    "RayEngineProxy",
    "RayTextRollout",
    "RolloutWorker",
    "RolloutWorkerBody",
    "init_ray",
    "make_collector_class",
    "make_worker_class",
]
