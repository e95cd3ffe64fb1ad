"""Lifecycle tests of the toy third-party adapters (run: pytest examples/third_party_adapter)."""

import pytest
from hypothesis import Phase
from toy_adapter import ForgetfulToyEngine, make_toy_adapters

from colo_fsm.testing import check_lifecycle, lifecycle_settings, lifecycle_test_case


def test_toy_adapters_follow_the_lifecycle(colo_fsm_check_lifecycle):
    """Hundreds of programs (the active colo-fsm profile); every lifecycle fact after every step."""
    colo_fsm_check_lifecycle()


# the same as a unittest.TestCase, without the fixture (here with the small dev profile)
TestToyAdapters = lifecycle_test_case(make_toy_adapters, profile="colo-fsm-dev")


def test_toy_world_of_four_ranks(colo_fsm_check_ranks):
    """Every interleaving of four ranks through the declared lifecycle."""
    result = colo_fsm_check_ranks(4)
    assert result.ok, result.report()


def test_a_forgetful_engine_is_caught():
    """The machine catches an engine whose suspend() does not pause decode."""
    quick = lifecycle_settings("colo-fsm-dev", report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate])
    with pytest.raises(AssertionError, match="engine reports awake|adapter says awake"):
        check_lifecycle(lambda: make_toy_adapters(ForgetfulToyEngine), settings=quick)
