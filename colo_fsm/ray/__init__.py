"""Ray mode: rollout workers and the collector as Ray actors, driven by one driver-side lifecycle.

* :func:`init_ray` -- ``ray.init()`` locally by default, or connect to ``address``.
* :data:`RolloutWorker` / :func:`make_worker_class` -- per-rank colocated worker actor owning the rank's gated
  engine *and* trainer, built by its ``adapters_factory`` (:class:`WorkerAdapters`; :class:`ColocatedFactory`
  puts both on one model object); ``generate`` in the default group, control calls (``bring_up``,
  ``suspend``, ``resume``, ``shutdown``, ``drain``, the training calls ``train_step``, ``offload_buffers``,
  ``restore_buffers``, ``save_checkpoint``, and ``info``, ``health``, ``control_log``) in the ``"control"``
  concurrency group, so they never queue behind rollouts. Over a request-level engine (``MegatronEngine``) a
  worker parks: a rollout hands its requests over behind the gate and awaits its own futures, a suspend keeps
  them in the engine at a decode-step boundary and they finish after the resume (``inflight="drain"`` waits).
* :data:`CollectorActor` / :func:`make_collector_class` -- the replay buffer and async collector in one actor
  (``pause``/``resume`` in the control group, ``sample`` in the default group).
* :class:`RayEngineProxy`, :class:`RayTrainerProxy`, :class:`RayCollectorProxy`, :class:`RayDrain` --
  driver-side objects implementing the engine / trainer / collector protocols and the drain by fanning out
  to the actors (the gather is the barrier). The engine proxy reports the workers' own
  ``reads_weights_in_place``; the trainer proxy shards the batch (:func:`split_batch`, or
  :func:`replicate_batch`) and combines the workers' results (:func:`combine_step_results`: metrics
  averaged, consumed samples summed).
* :class:`RayTextRollout` -- rollout for the collector actor: one ``generate`` call per sample.

Typical wiring::

    init_ray()                                     # or init_ray("auto") on a cluster
    workers = [RolloutWorker.remote(r, ColocatedFactory(build_model, make_engine, make_trainer)) for r in range(n)]
    engine, trainer = RayEngineProxy(workers), RayTrainerProxy(workers)
    holder = {}
    coll = CollectorActor.remote(lambda: RayTextRollout(workers, reward, samples_per_group=4, max_tokens=64),
                                 prompts, num_prompts_per_step=8, max_trajectory_age_steps=1,
                                 cap=InFlightCap(8, 1, samples_per_group=4, control_headroom=0))
    collector = RayCollectorProxy(coll, lambda: holder["lc"].weight_version)
    lc = holder["lc"] = Lifecycle(engine, trainer, collector, drain=RayDrain(workers))
"""

from colo_fsm.ray.actor_class import CONTROL_GROUP
from colo_fsm.ray.actors import (
    WORKER_CONTROL_METHODS,
    WORKER_TRAINER_METHODS,
    ColocatedFactory,
    RolloutWorker,
    RolloutWorkerBody,
    WorkerAdapters,
    WorkerFactory,
    make_worker_class,
)
from colo_fsm.ray.collector_actor import (
    COLLECTOR_CONTROL_METHODS,
    CollectorActor,
    CollectorBody,
    make_collector_class,
)
from colo_fsm.ray.driver import (
    RayCollectorProxy,
    RayDrain,
    RayEngineProxy,
    RayTextRollout,
    RayTrainerProxy,
    combine_step_results,
    init_ray,
    replicate_batch,
    split_batch,
)

__all__ = [
    "COLLECTOR_CONTROL_METHODS",
    "CONTROL_GROUP",
    "WORKER_CONTROL_METHODS",
    "WORKER_TRAINER_METHODS",
    "CollectorActor",
    "CollectorBody",
    "ColocatedFactory",
    "RayCollectorProxy",
    "RayDrain",
    "RayEngineProxy",
    "RayTextRollout",
    "RayTrainerProxy",
    "RolloutWorker",
    "RolloutWorkerBody",
    "WorkerAdapters",
    "WorkerFactory",
    "combine_step_results",
    "init_ray",
    "make_collector_class",
    "make_worker_class",
    "replicate_batch",
    "split_batch",
]
