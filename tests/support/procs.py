"""The multiprocessing context of the tests' real gloo rank processes."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

# what every rank process imports first: imported once in the fork server, not once in every rank
PRELOAD = ["torch", "torch.distributed"]


def rank_context() -> ForkServerContext:
    """A ``forkserver`` context whose server has imported torch.

    Each rank is forked from that server, a process that never ran a test (one server per test process, started at
    the first use, single-threaded: tests/conftest.py sets OMP_NUM_THREADS=1 first), instead of being a fresh
    interpreter that imports torch again (about 2.5 s of CPU a rank). As with ``spawn``, the target and its
    arguments travel pickled and the rank imports the target's module itself; each rank builds its own process
    group, after the fork.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
