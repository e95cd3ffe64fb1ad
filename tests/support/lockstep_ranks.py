"""One rank of a tensor-parallel pair whose engine loops agree through :class:`TorchLockstep` over a real gloo group.

Run as ``python -m tests.support.lockstep_ranks RANK WORLD INIT_METHOD MODE OUT`` (tests/test_lockstep_torch.py
starts two). Both ranks run one SPMD program over a :class:`~colo_fsm.adapters.batching.ContinuousBatcher` on a
recording backend: the same requests submitted at each rank's own pace, the same suspend/resume calls, one
SPMD cancel; with ``feed`` the leader alone also submits requests that the lockstep must carry to the follower
(what the group's one HTTP server does), one of them ended by the leader's own ``on_token``. Every backend call
is written to ``OUT`` as JSON, with the error if the rank failed. ``MODE`` is ``lockstep`` (the real
:class:`TorchLockstep`) or ``own-plan`` (a mutant: the same broadcasts, but every rank plans its own iteration).
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

from colo_fsm.adapters.lockstep import StepPlan, TorchLockstep
from tests.support.properties import RecordingStepBackend


class OwnPlanLockstep(TorchLockstep):
    """The mutant: every rank believes it leads and keeps its own plan (the broadcast still happens)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leader = True

    def agree(self, plan: StepPlan) -> StepPlan:
        super().agree(plan)
        return plan


def main(rank: int, world: int, init_method: str, mode: str, out: str, feed: bool) -> None:
    import torch.distributed as dist

    from colo_fsm.adapters.batching import ContinuousBatcher

    log: list[Any] = []
    rec: dict[str, Any] = {"rank": rank, "log": log, "error": None, "results": {}}
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=20))  # fmt: skip
        program = dist.new_group(backend="gloo")  # the SPMD program's own barrier: not the lockstep's group
        assert isinstance(program, dist.ProcessGroup), program  # every rank is a member
        cls = OwnPlanLockstep if mode == "own-plan" else TorchLockstep
        lock = cls(dist.group.WORLD, src=0, width=64)
        b = ContinuousBatcher(lambda: RecordingStepBackend(log), max_active_requests=3, lockstep=lock,
                              lockstep_wait_s=20.0)  # fmt: skip
        b.start()
        rng = random.Random(rank)  # each rank submits at its own pace
        handles = []
        fed = []
        for cycle in range(3):
            for i in range(3):
                handles.append(b.submit([1] * (1 + (cycle + i) % 4), max_tokens=8))
                time.sleep(rng.random() * 0.004 + 0.003 * rank)
            if feed and rank == 0:  # the leader alone: the lockstep must bring these to the follower
                stop_after_two = {"n": 0}

                def stop_early(*_: Any, box: dict[str, int] = stop_after_two) -> bool | None:
                    box["n"] += 1
                    return False if box["n"] >= 2 else None  # e.g. a stop string the server found

                fed.append(b.submit([2] * 5, max_tokens=8, temperature=0.5, seed=7 + cycle, feed=True))
                fed.append(b.submit([3] * 6, max_tokens=8, on_token=stop_early, feed=True))
            dist.barrier(group=program)
            b.suspend()
            b.resume()
        handles[1].cancel()
        for h in handles:
            h.result(timeout=20)
        rec["results"] = {
            "spmd": [h.result().finish_reason for h in handles],
            "fed": [(len(h.result().token_ids), h.result().finish_reason) for h in fed],
        }
        dist.barrier(group=program)
        b.shutdown()
    except BaseException as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
    with open(out, "w") as f:
        json.dump(rec, f)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # the other rank may be gone already
            pass


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6] == "feed")
