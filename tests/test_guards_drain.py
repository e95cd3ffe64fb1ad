"""DeviceDrain synchronizes the device named by LOCAL_RANK, never the calling thread's current device."""

import threading

import pytest

from colo_fsm.errors import ConfigError
from colo_fsm.guards.drain import DeviceDrain, local_rank_from_env


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


def test_cpu_only_drain_is_a_noop_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert DeviceDrain(local_rank=0)() == -1


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
