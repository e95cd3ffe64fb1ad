"""How the kit reports: quiet while programs run, and one short bug report for the failing one.

* :class:`ProgramLogs`: the ``colo_fsm`` log records of one program (the faults the kit injects make the lifecycle
  log errors) are kept, not printed; the failing program's last lines are shown with its report.
* :func:`event_lines`: the lifecycle's calls and the engine's output around a violation, a few lines.
* :func:`quiet_settings`: the settings the kit runs hypothesis with, whatever a caller passed: no health checks,
  no deadline, no explanation phase, no reproduction blob, one bug reported.
* :func:`run_machine`: the spec gate, then the programs; a failure becomes one
  :class:`~colo_fsm.errors.LifecycleViolation` whose message is the rule, what your adapter did, and the shrunk
  program (a few dozen lines, not the kit's own traceback).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings
from hypothesis.errors import FlakyFailure
from hypothesis.stateful import run_state_machine_as_test

import colo_fsm
from colo_fsm.errors import LifecycleViolation
from colo_fsm.testing.spec_gate import check_spec_once
from colo_fsm.testing.watch import EventLog

CHECK_STEP = "lifecycle_rules"
"""The name of the machine's one invariant (every rule's check after every step); left out of the report."""

LOG_LINES = 6
"""Log lines of the failing program shown with its report."""


def event_lines(log: EventLog, start: int, end: int | None = None, *, limit: int = 10) -> list[str]:
    """The log's lines from event ``start`` to ``end`` (inclusive; default the last), at most ``limit``: the
    first and the last ones, with how many were left out between."""
    last = len(log) - 1 if end is None else min(end, len(log) - 1)
    lines = log.lines(max(0, start))[: max(0, last - max(0, start) + 1)]
    if len(lines) <= limit:
        return lines
    head = limit // 2
    tail = limit - head - 1
    return [*lines[:head], f"     ... {len(lines) - head - tail} events ...", *lines[-tail:]]


def recent_lines(log: EventLog, n: int = 8) -> list[str]:
    """The last ``n`` events."""
    return log.lines(max(0, len(log) - n))


def where_raised(exc: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame that raised ``exc`` (following its causes), or None."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


class ProgramLogs(logging.Handler):
    """Keeps the ``colo_fsm`` log records of one program (not propagated while it runs); :meth:`close` restores
    the logger and returns the last :data:`LOG_LINES` lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []
        self._logger = logging.getLogger(colo_fsm.__name__)
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().splitlines()[0] if record.getMessage() else ""
        self.records.append(f"{record.levelname} {record.name}: {text[:200]}")

    def close(self) -> None:
        """Stop capturing (idempotent)."""
        if self in self._logger.handlers:
            self._logger.removeHandler(self)
            self._logger.propagate = self._propagate
        super().close()

    def tail(self) -> list[str]:
        """The last lines (with how many came before them)."""
        if len(self.records) <= LOG_LINES:
            return list(self.records)
        return [f"({len(self.records) - LOG_LINES} earlier lines)", *self.records[-LOG_LINES:]]


def quiet_settings(base: Settings) -> Settings:
    """``base`` with what the kit always needs: no health checks, no deadline, one bug, no explanation phase (its
    lines are the kit's own), no reproduction blob (the profiles are derandomized or say their seed)."""
    return Settings(
        base,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        phases=[p for p in base.phases if p is not Phase.explain],
    )


def program_lines(notes: list[str]) -> list[str]:
    """The shrunk program from hypothesis' notes, without the lines of the per-step check."""
    skip = (f"state.{CHECK_STEP}()", "Failing test case:", "Falsifying", "Explanation:", "You can reproduce")
    return [n for n in notes if not n.strip().startswith(skip)]


def bug_report(exc: BaseException) -> str:
    """One report: the violation (the rule, your adapter, what it did, the calls around it), then the program."""
    text = str(exc).rstrip()
    notes = [str(n) for n in getattr(exc, "__notes__", ())]
    program = program_lines(notes)
    return text + "\nthe program (shrunk):\n" + "\n".join(f"  {line}" for line in program)


def run_machine(machine: type[Any], settings: Settings) -> None:
    """Run ``machine``'s programs: the spec gate first (when the machine checks its spec), then hypothesis with
    :func:`quiet_settings`; a failing program raises :class:`~colo_fsm.errors.LifecycleViolation`."""
    __tracebackhide__ = True
    if getattr(machine, "check_spec", True):
        check_spec_once(machine.spec)
    try:
        run_state_machine_as_test(machine, settings=quiet_settings(settings))
    except AssertionError as exc:
        raise LifecycleViolation(bug_report(exc), exc) from None
    except FlakyFailure as group:  # seen once, not again on replay: a race in your adapters, or a loaded machine
        seen = next((e for e in group.exceptions if isinstance(e, AssertionError)), None)
        if seen is None:
            raise
        seen.add_note("(the program failed once and passed when replayed: the violation is real, its timing is not)")
        for note in getattr(group, "__notes__", ()):
            seen.add_note(note)
        raise LifecycleViolation(bug_report(seen), group) from None


__all__ = [
    "CHECK_STEP",
    "LOG_LINES",
    "ProgramLogs",
    "bug_report",
    "event_lines",
    "program_lines",
    "quiet_settings",
    "recent_lines",
    "run_machine",
    "where_raised",
]
