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


def test_broken_drain_of_current_device_is_caught():
    """The bug the drain exists to prevent: a drain of the thread's current device misses rank 1's GPU."""

    class CurrentDeviceDrain(DeviceDrain):
        def target_device(self) -> int:  # what a bare torch.cuda.synchronize() does on a fresh thread
            return 0

    seen: list[int] = []
    broken = CurrentDeviceDrain(local_rank=1, synchronize=seen.append)
    broken()
    assert seen == [0]
    assert broken.target_device() != broken.local_rank
