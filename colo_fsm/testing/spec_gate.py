"""The spec gate: the kit validates and model-checks the spec once, before any program runs.

A spec the static rules reject (:func:`~colo_fsm.states.validate.validate_spec`) or in which the exhaustive
checker (:mod:`colo_fsm.testing.checker`, N = 2 and 3 ranks: a fraction of a second) finds a violation cannot
pass any program; hundreds of programs would each fail, and shrinking them would take minutes. The gate refuses
it in seconds, with the checker's own report, and remembers a spec it passed for the rest of the process.
"""

from __future__ import annotations

import threading

from colo_fsm.errors import SpecCheckFailed, SpecError
from colo_fsm.states.spec import LifecycleSpec
from colo_fsm.states.validate import validate_spec
from colo_fsm.testing.checker import check_all

GATE_RANKS = (2, 3)
"""The numbers of ranks the gate model-checks every scenario of the spec with."""

_PASSED: dict[int, LifecycleSpec] = {}
_LOCK = threading.Lock()


def check_spec_once(spec: LifecycleSpec) -> None:
    """Validate ``spec`` and model-check it with :data:`GATE_RANKS` ranks, once per spec object per process.

    Raises :class:`~colo_fsm.errors.SpecError` (a static rule) or :class:`~colo_fsm.errors.SpecCheckFailed` (the
    checker's first violation, with the end of its shortest counterexample).
    """
    __tracebackhide__ = True  # a refused spec is reported by its message, not by the validator's internals
    with _LOCK:
        if _PASSED.get(id(spec)) is spec:
            return
    try:
        validate_spec(spec)
    except SpecError as exc:
        raise exc.with_traceback(None) from None
    for result in check_all(list(GATE_RANKS), spec=spec):
        if not result.ok:
            detail = "\n".join(
                [
                    f"  the exhaustive checker, N={result.ranks} ranks, scenario {result.scenario!r}; its shortest "
                    f"counterexample up to the violation ({len(result.counterexample)} lines; "
                    f"checker.check({result.ranks}, spec=..., scenario={result.scenario!r}).report() shows it whole):",
                    *(f"  {line}" for line in _up_to_the_violation(result.counterexample, str(result.violation))),
                ]
            )
            raise SpecCheckFailed(spec.name, str(result.violation), detail)
    with _LOCK:
        _PASSED[id(spec)] = spec


def _up_to_the_violation(counterexample: list[str], violation: str, before: int = 5) -> list[str]:
    """The last few actions of a counterexample up to the one the violation names, then its explanation."""
    actions = [i for i, line in enumerate(counterexample) if line.strip()[:1].isdigit()]
    named = [i for i in actions if counterexample[i].split(". ", 1)[-1].split(": ", 1)[-1] in violation]
    end = named[-1] if named else (actions[-1] if actions else -1)
    shown = [line for line in counterexample[max(0, end - before) : end + 1] if line.strip()[:1].isdigit()]
    return shown + [line for line in counterexample if not line.strip()[:1].isdigit()]


__all__ = ["GATE_RANKS", "check_spec_once"]
