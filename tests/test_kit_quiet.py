"""The kit is fast and quiet (item 2 of issue 27): a broken spec is refused before any program runs, injected
faults' logs stay out of the output (the failing program's are in its report), a caller's own hypothesis
settings cannot bring back deadlines or health checks, and a failure is one short report naming your code."""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import HealthCheck, Phase, settings

from colo_fsm.errors import LifecycleViolation, SpecCheckFailed, SpecError
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingEngine, RecordingTrainer
from colo_fsm.testing.lifecycle_machine import Adapters, check_lifecycle, recording_fakes, stats_snapshot
from colo_fsm.testing.profiles import DEV_PROFILE, lifecycle_settings
from colo_fsm.testing.report import quiet_settings
from tests.support.mutants import MUTANTS

SPECS = {m.name: m.spec for m in MUTANTS}


def _programs() -> int:
    return stats_snapshot().get("programs", 0)


def test_a_spec_the_checker_rejects_fails_before_any_program_runs():
    before = _programs()
    with pytest.raises(SpecCheckFailed) as info:
        check_lifecycle(recording_fakes, spec=SPECS["nemo-val-at-end-resumes-collection"])
    text = str(info.value)
    assert "[checkpoint-suspends]" in text and "the exhaustive checker, N=2 ranks" in text, text
    assert _programs() == before, "programs ran on a spec the checker refuses"


def test_a_spec_the_static_rules_reject_fails_before_any_program_runs():
    before = _programs()
    with pytest.raises(SpecError) as info:
        check_lifecycle(recording_fakes, spec=SPECS["resume-before-barrier"])
    assert not isinstance(info.value, SpecCheckFailed) and "one-communicator" in str(info.value)
    assert _programs() == before


def test_injected_faults_log_nothing_while_the_programs_pass(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.INFO)  # the lifecycle logs each injected fault's failure at ERROR
    before = stats_snapshot()
    try:
        with caplog.at_level(logging.INFO):
            check_lifecycle(recording_fakes, settings=lifecycle_settings(DEV_PROFILE))
    finally:
        logger.setLevel(level)
    after = stats_snapshot()
    assert after.get("failures_after_fault", 0) > before.get("failures_after_fault", 0)  # faults fired and logged
    # the programs run on this thread (a lifecycle another test left behind may still log from the heartbeat's)
    me = threading.get_ident()
    shown = [r.getMessage() for r in caplog.records if r.name.startswith("colo_fsm") and r.thread == me]
    assert not shown, shown[:3]


class SuspendRaises(RecordingEngine):
    """An engine bug (not an injected fault): its suspend() raises."""

    def suspend(self) -> None:
        raise RuntimeError("suspend broke")


def test_a_failing_programs_report_is_short_and_shows_its_logs_and_where_your_code_raised():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.INFO)

    def broken() -> Adapters:
        j = Journal()
        return Adapters(SuspendRaises(j), RecordingTrainer(j), RecordingCollector(j))

    try:
        with pytest.raises(LifecycleViolation) as info:
            check_lifecycle(broken, settings=lifecycle_settings(DEV_PROFILE), inject_faults=False)
    finally:
        logger.setLevel(level)
    report = str(info.value)
    assert "the lifecycle failed with no fault injected" in report and "RuntimeError: suspend broke" in report
    assert "in suspend" in report and "logs of this program:" in report and "-> Failed" in report, report
    assert "the program (shrunk):" in report and len(report.splitlines()) <= 40, report


def test_the_kit_runs_hypothesis_quietly_whatever_settings_the_caller_passes():
    mine = settings(max_examples=3, deadline=200, print_blob=True, report_multiple_bugs=True, database=None)
    quiet = quiet_settings(mine)
    assert quiet.max_examples == 3  # the caller's own choices stay
    assert quiet.deadline is None and set(quiet.suppress_health_check) == set(HealthCheck)
    assert not quiet.print_blob and not quiet.report_multiple_bugs and Phase.explain not in quiet.phases
