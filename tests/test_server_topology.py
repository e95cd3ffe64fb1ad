"""Where the servers of a model-parallel run go, and which layouts are refused (fast: no processes).

The multi-process runs over gloo are in tests/test_server_tp.py.
"""

from __future__ import annotations

import pytest

from colo_fsm.errors import ServingTopologyError
from colo_fsm.server.topology import ServingRole, check_serving_layout


def _layout(world: int, tp: int, serve=lambda r: True, feeds=True, pp: int = 1) -> list[ServingRole]:
    return [
        ServingRole(r, serve(r), tuple(range(r - r % tp, r - r % tp + tp)), feeds if r % tp == 0 else False, pp)
        for r in range(world)
    ]


def test_one_server_per_tensor_parallel_group_on_its_first_rank():
    roles = _layout(4, 2)
    check_serving_layout(roles)
    assert [r.runs_server for r in roles] == [True, False, True, False]
    assert all(r.runs_server for r in _layout(3, 1))  # TP = 1: every rank is a replica
    check_serving_layout(_layout(4, 2, serve=lambda r: False))  # nobody serves: nothing to route


def test_a_server_asked_for_on_a_follower_is_refused():
    with pytest.raises(ServingTopologyError, match=r"serve=True.*group \[0, 1\].*first rank"):
        check_serving_layout(_layout(2, 2, serve=lambda r: r == 1))
    with pytest.raises(ServingTopologyError, match=r"group \[2, 3\]"):
        check_serving_layout(_layout(4, 2, serve=lambda r: r != 3))


def test_tp_serving_without_the_lockstep_or_with_pipeline_stages_is_refused():
    with pytest.raises(ServingTopologyError, match="tp_lockstep=False"):
        check_serving_layout(_layout(2, 2, feeds=False))
    with pytest.raises(ServingTopologyError, match="pipeline_model_parallel_size=2"):
        check_serving_layout(_layout(2, 1, pp=2))
    check_serving_layout(_layout(2, 1, feeds=False))  # TP = 1 needs no lockstep
