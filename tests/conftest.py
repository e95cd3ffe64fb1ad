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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).stem in HEAVY:
            item.add_marker(pytest.mark.heavy)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The local Ray cluster the Ray modules share (each module's ``ray_session`` starts it if it is not up)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
