"""DeviceDrain synchronizes the device named by LOCAL_RANK, never the calling thread's current device."""

import threading

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.guards.drain import DeviceDrain, NoDeviceDrain, default_drain, local_rank_from_env


def test_drain_targets_local_rank_from_any_thread():
    seen: list[int] = []
    drain = DeviceDrain(local_rank=3, synchronize=seen.append)

    # A thread that never called set_device (current device would be 0) still drains device 3.
    t = threading.Thread(target=drain)
    t.start()
    t.join()
    drain()
    assert seen == [3, 3]
    assert drain.target_device() == 3


def test_local_rank_read_from_env(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    seen: list[int] = []
    DeviceDrain(synchronize=seen.append)()
    assert seen == [5]


@pytest.mark.parametrize("raw", ["x", "-1", "1.5"])
def test_bad_local_rank_is_a_config_error(raw):
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        local_rank_from_env({"LOCAL_RANK": raw})


def test_bad_local_rank_argument():
    with pytest.raises(ConfigError, match="local_rank"):
        DeviceDrain(local_rank=-2)


def test_no_cuda_device_refuses_a_device_drain_and_names_the_no_op_drain():
    """A DeviceDrain that could drain nothing is refused at build time (it used to return -1 at every drain)."""
    with pytest.raises(ConfigError, match="NoDeviceDrain") as info:
        DeviceDrain(local_rank=0, device_count=lambda: 0)
    assert info.value.field == "drain"
    assert NoDeviceDrain("CPU-only test")() == -1


def test_cuda_devices_without_local_rank_are_refused():
    with pytest.raises(ConfigError, match="LOCAL_RANK") as info:
        DeviceDrain(device_count=lambda: 2, env={})
    assert info.value.field == "LOCAL_RANK" and "2 CUDA device" in str(info.value)
    assert DeviceDrain(device_count=lambda: 2, env={"LOCAL_RANK": "1"}).target_device() == 1
    assert DeviceDrain(1, device_count=lambda: 2, env={}).target_device() == 1


def test_torch_is_imported_when_the_drain_is_built(monkeypatch):
    """The first drain must not pay for ``import torch`` (it skewed the handoff timeline by seconds)."""
    import builtins

    drain = DeviceDrain(0, device_count=lambda: 1)
    imported: list[str] = []
    real_import = builtins.__import__

    def spy(name, *a, **k):
        imported.append(name)
        return real_import(name, *a, **k)

    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(builtins, "__import__", spy)
    assert drain() == 0
    assert "torch" not in imported


def test_default_drain_is_an_explicit_no_op_without_cuda():
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has CUDA")
    drain = default_drain()
    assert isinstance(drain, NoDeviceDrain) and "no CUDA" in drain.reason and drain() == -1


def test_ray_driver_of_a_gpu_cluster_is_told_to_fan_out():
    """A single controller whose workers hold the GPUs: the driver-side DeviceDrain would drain none of them."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, log_to_driver=False)  # a declared GPU resource
    try:
        with pytest.raises(ConfigError, match="RayDrain"):
            DeviceDrain(0, device_count=lambda: 1)
        with pytest.raises(ConfigError, match="RayDrain"):
            default_drain()
    finally:
        ray.shutdown()


def test_production_path_synchronizes_local_rank_device_from_a_fresh_thread(monkeypatch):
    """The real torch path (not the injectable one): the call must name cuda:LOCAL_RANK explicitly.

    A bare ``torch.cuda.synchronize()`` (the calling thread's current device, cuda:0 on a thread that never
    called set_device) records ``None`` here and fails this test.
    """
    import torch

    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    drain = DeviceDrain(local_rank=3)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(drain()))
    t.start()
    t.join()
    assert result == [3]
    assert calls == [torch.device("cuda", 3)]


def test_production_path_refuses_a_device_that_does_not_exist(monkeypatch):
    import torch

    from colo_fsm.errors import DrainError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    with pytest.raises(DrainError, match="LOCAL_RANK=5"):
        DeviceDrain(local_rank=5)()
