import os
from pathlib import Path

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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The local Ray cluster the Ray modules share (each module's ``ray_session`` starts it if it is not up)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
