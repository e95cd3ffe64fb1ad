import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

# Test modules `make check` leaves out (marked `heavy`): each starts processes (a demo, torch.distributed ranks, a
# venv, Ray), builds megatron-core models or runs hundreds of hypothesis programs, and together they are most of the
# default suite's time. `make test` (and CI) runs them; a new test module is in the quick loop until it is listed here.
HEAVY = frozenset(
    {
        "test_bench_inflight",
        "test_checkpoint_interrupted",
        "test_core_install",
        "test_demo",
        "test_demo_extras",
        "test_demo_serve",
        "test_demo_signals",
        "test_docs_blocks",
        "test_engine_batching",
        "test_faults",
        "test_guards_barrier",
        "test_guards_drain",
        "test_guards_fingerprint",
        "test_lifecycle_property",
        "test_lockstep_torch",
        "test_megatron_bridge",
        "test_megatron_ddp_hooks",
        "test_mutants",
        "test_nemo_rl",
        "test_nemo_rl_engine_up",
        "test_ray_control",
        "test_ray_megatron",
        "test_ray_park",
        "test_server_chaos",
        "test_server_lifecycle",
        "test_server_nemo_gym",
        "test_server_tp",
        "test_soak",
        "test_testing_example",
        "test_testing_properties",
        "test_testing_real_collector",
        "test_timeline",
    }
)


# Modules that start the local Ray cluster: under pytest-xdist they run on one worker, which starts it once.
RAY = frozenset({"test_guards_drain", "test_ray_control", "test_ray_megatron", "test_ray_park"})
# Long modules whose tests share no module fixture: their tests are spread over the workers one by one.
SPREAD = frozenset({"test_docs_blocks", "test_faults", "test_mutants"})


# The longest single tests (a page's loops five times under a CPU hog; 2-5 min for docs/embedding.md on a busy
# 2-core machine): scheduled first. xdist hands out the groups with the most tests first, so these one-test groups
# came last, and one worker ran docs/embedding.md's alone at the end while the other was idle. After them, in this
# order, the other groups of one long test (5-20 s each), which came last too: the suite then ends on short ones
# (the other pages, the thread-rank faults, the mutants), and the two workers finish within seconds of each other.
# An entry names a group (a module's stem, or a SPREAD test's node id) or, without its parameters, a test's
# parametrized groups.
FIRST = (
    "tests/test_docs_blocks.py::test_page_loops_run_five_times_under_load",
    "tests/test_docs_blocks.py::test_page_blocks_run[docs/embedding.md]",
    "tests/test_faults.py::test_real_gloo_rank_dies_or_never_arrives_at_torch_barrier",
    "test_server_chaos",
    "test_megatron_bridge",
    "test_server_nemo_gym",
    "test_lockstep_torch",
)


def first_rank(scope: str) -> int | None:
    """The place of group ``scope`` in FIRST (None: scheduled in xdist's own order, after them)."""
    return next((i for i, f in enumerate(FIRST) if scope == f or scope.startswith(f + "[")), None)


def xdist_group(stem: str, nodeid: str) -> str:
    """The pytest-xdist group of a test of module ``stem``: "ray", the test itself in a SPREAD module, else its
    module."""
    return "ray" if stem in RAY else nodeid if stem in SPREAD else stem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        stem = Path(str(item.fspath)).stem
        if stem in HEAVY:
            item.add_marker(pytest.mark.heavy)
        # `make test` runs two workers with --dist loadgroup: a module stays on one worker (its module fixtures are
        # built once), and the Ray modules share one worker (and one cluster)
        item.add_marker(pytest.mark.xdist_group(xdist_group(stem, item.nodeid)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` by the groups above. pytest-xdist 3.8 reads the xdist_group marks on the worker and
    appends the group to ``item._nodeid``, which pytest 9.2 no longer has (a node keeps its id in ``_id``): the
    suffix never reached the scheduler and every test was scheduled on its own, a module's fixtures built on both
    workers and a Ray cluster started on each. The scheduler here groups the node ids itself
    (tests/test_make_check.py::test_loadgroup_keeps_a_module_on_one_worker)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroupScheduling(LoadGroupScheduling):
        def _assign_work_unit(self, node: Any) -> None:
            # the scopes of FIRST go out before the rest, in FIRST's order (xdist orders the others by their
            # number of tests)
            ranked = sorted((r, i, s) for i, s in enumerate(self.workqueue) if (r := first_rank(s)) is not None)
            for _, _, scope in reversed(ranked):
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            if scope != nodeid:  # a group xdist did append to the node id
                return scope
            return xdist_group(Path(nodeid.split("::", 1)[0]).stem, nodeid)

    return ModuleGroupScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The local Ray cluster the Ray modules share (each module's ``ray_session`` starts it if it is not up)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
