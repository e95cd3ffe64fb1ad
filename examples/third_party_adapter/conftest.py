"""The whole colo-fsm setup for testing the toy adapters: override one fixture."""

import pytest
from toy_adapter import make_toy_adapters


@pytest.fixture
def colo_fsm_adapters():
    return make_toy_adapters
