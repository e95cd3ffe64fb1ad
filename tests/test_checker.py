"""The exhaustive multi-rank checker: the shipped lifecycle is safe for every interleaving of N ranks, and a broken
protocol yields its shortest counterexample."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest

from colo_fsm.states.spec import LIFECYCLE, State
from colo_fsm.testing import checker
from colo_fsm.testing.checker import SCENARIOS, StepPlan, check, check_all, main, plan_program
from tests.support.mutants import MUTANTS, CallingThreadDrain, checker_main, set_current_device
from tests.support.report import record_stats

BY_NAME = {m.name: m for m in MUTANTS}


def test_ci_ranks_2_to_4_every_scenario():
    results = check_all(range(2, 5))
    assert all(r.ok for r in results), "\n".join(r.report() for r in results if not r.ok)
    stops = {f"stop-in-{s.state.value.lower()}" for s in LIFECYCLE.states if not s.final}  # stop from anywhere
    assert {r.scenario for r in results} == set(SCENARIOS) | stops
    record_stats(
        "checker_ci",
        [
            {
                "ranks": r.ranks,
                "scenario": r.scenario,
                "states": r.states,
                "transitions": r.edges,
                "seconds": round(r.seconds, 3),
            }
            for r in results
        ],
    )
    # bigger worlds have more states; symmetry reduction was used
    by_n = {n: sum(r.states for r in results if r.ranks == n) for n in range(2, 5)}
    assert by_n[2] < by_n[3] < by_n[4] and all(r.symmetry_reduction for r in results)


def test_programs_cover_every_kind_of_step():
    prog = plan_program(LIFECYCLE, SCENARIOS["all-step-kinds"])
    assert prog.problems == [] and prog.final_state.value == "Stopped"
    edges = {(op.transition.source.value, op.transition.dest.value) for op in prog.ops}
    for edge in [
        ("Training", "Waking"),
        ("Training", "Checkpointing"),
        ("Checkpointing", "Waking"),
        ("Training", "Validating"),
        ("Checkpointing", "Validating"),
        ("Training", "Done"),
        ("Waking", "Generating"),
        ("Validating", "Generating"),
        ("Done", "Stopped"),
    ]:
        assert edge in edges, edge
    last_saves = plan_program(LIFECYCLE, SCENARIOS["last-step-saves"])
    assert ("Checkpointing", "Done") in {(o.transition.source.value, o.transition.dest.value) for o in last_saves.ops}
    # the drain before every barrier, one bump per step
    names = [op.action for op in prog.ops]
    assert all(names[i - 1] == "drain_device" for i, n in enumerate(names) if n == "barrier")
    assert names.count("bump_weight_version") == 5


def test_drain_target_comes_from_the_real_drain():
    """The checker asks each rank's drain which device it synchronizes; the mutant answers 'device 0'."""
    res = check(2, drain_factory=lambda r: CallingThreadDrain(r, synchronize=lambda d: None))
    assert not res.ok and "device 1" in res.violation
    # a thread that did call set_device would have been fine: the bug is the implicit current device
    set_current_device(1)
    try:
        assert CallingThreadDrain(1, synchronize=lambda d: None).target_device() == 1
    finally:
        set_current_device(0)


def _brute_force_shortest(m, ranks: int) -> int:
    """Shortest violating trace length without symmetry reduction (an independent BFS over the same model)."""
    kwargs = m.checker_kwargs()
    prog = plan_program(kwargs["spec"], SCENARIOS["all-step-kinds"])
    first = plan_program(kwargs["spec"], kwargs["rank0_steps"]) if "rank0_steps" in kwargs else prog
    search = checker._Search(
        [first] + [prog] * (ranks - 1),
        [kwargs["drain_factory"](r).target_device() for r in range(ranks)],
        symmetric=False,
    )
    init = tuple((0, False, 0) for _ in range(ranks))
    seen = {init: 0}
    queue = deque([init])
    while queue:
        s = queue.popleft()
        succ = search.moves(s)
        if not succ and not search.done(s):
            return seen[s]
        for _r, t, v, _d in succ:
            if v is not None:
                return seen[s] + 1
            if t not in seen:
                seen[t] = seen[s] + 1
                queue.append(t)
    return -1


@pytest.mark.parametrize(
    "name",
    [
        "resume-before-barrier",
        "drain-calling-thread-device",
        "barrier-without-drain",
        "wake-between-train-and-save-declared",
        "checkpoint-decision-not-agreed",
    ],
)
def test_counterexample_is_shortest(name):
    m = BY_NAME[name]
    res = check(3, **m.checker_kwargs())
    assert not res.ok
    steps = [line for line in res.counterexample if line.strip()[:1].isdigit()]
    if steps:  # interleaving violations: BFS length equals the independent search without symmetry reduction
        assert len(steps) == _brute_force_shortest(m, 3), res.report()
        assert "VIOLATION" in res.counterexample[-1]


def test_resume_before_barrier_counterexample_reads_well(capsys):
    m = BY_NAME["resume-between-drain-and-barrier"]
    res = check(2, **m.checker_kwargs())
    text = res.report()
    assert "shortest counterexample" in text and "resume_engine" in text and "in flight:" in text


def test_cli_ok_and_violation(capsys, tmp_path):
    assert main(["--ranks", "2..3", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "N=3 all-step-kinds" in out and "violation" in out
    assert (tmp_path / "r.json").exists()
    assert checker_main(["drain-calling-thread-device", "--ranks", "2", "--scenario", "all-step-kinds"]) == 1
    assert "VIOLATION" in capsys.readouterr().out


def test_rank0_decision_split_deadlocks_or_interleaves():
    res = check(
        2, rank0_steps=(StepPlan(save=True), StepPlan(), StepPlan(), StepPlan(), StepPlan()), steps=(StepPlan(),) * 5
    )
    assert not res.ok and any(w in res.violation for w in ("deadlock", "in flight", "different barriers"))


def test_a_stop_not_agreed_across_ranks_is_caught():
    """Stop from anywhere is a world decision: a rank that stops mid-step alone either leaves its peers waiting at
    their next barrier (a deadlock) or meets them at a barrier of another transition (a fingerprint barrier
    refuses the pairing)."""
    base = SCENARIOS["all-step-kinds"]
    for i, state in ((0, State.DRAINING), (1, State.GENERATING), (1, State.TRAINING)):
        rank0 = tuple(dataclasses.replace(p, stop_in=state) if k == i else p for k, p in enumerate(base))
        res = check(2, rank0_steps=rank0, steps=base)
        assert not res.ok, state
        assert "deadlock" in res.violation or "met at different barriers" in res.violation, res.violation


def test_stop_from_anywhere_needs_drain_and_meeting_where_work_is_in_flight():
    """A stop that tears down without draining its own device, or while a peer still decodes, is a violation."""

    def stop_from(state: State, actions: tuple[str, ...]):
        ts = tuple(
            dataclasses.replace(t, actions=actions) if t.trigger == "stop" and t.source is state else t
            for t in LIFECYCLE.transitions
        )
        return dataclasses.replace(LIFECYCLE, transitions=ts)

    early = stop_from(State.GENERATING, ("pause_collector", "suspend_engine", "drain_device", "shutdown_engine"))
    res = check(2, spec=early, scenario="stop-in-generating")
    assert not res.ok and "still have decode work in flight" in res.violation, res.violation
    undrained = stop_from(State.TRAINING, ("shutdown_engine",))
    res = check(2, spec=undrained, scenario="stop-in-training")
    assert not res.ok and "train work still in flight on its own device" in res.violation, res.violation


@pytest.mark.parametrize("name", [None, *BY_NAME])
def test_symmetry_reduction_keeps_the_verdict(name):
    kwargs = BY_NAME[name].checker_kwargs() if name else {}
    reduced, full = check(3, **kwargs), check(3, symmetry=False, **kwargs)
    digits = str.maketrans("", "", "0123456789")  # which interchangeable rank shows it may differ
    assert reduced.ok == full.ok and (reduced.violation or "").translate(digits) == (full.violation or "").translate(
        digits
    )
    assert reduced.states <= full.states
    if name is None:
        assert reduced.states < full.states


def test_single_rank_and_bad_arguments():
    assert check(1).ok
    with pytest.raises(ValueError):
        check(0)


@pytest.mark.slow
def test_deep_ranks_up_to_8():
    results = check_all(range(2, 9))
    assert all(r.ok for r in results)
    record_stats(
        "checker_deep",
        [
            {
                "ranks": r.ranks,
                "scenario": r.scenario,
                "states": r.states,
                "transitions": r.edges,
                "seconds": round(r.seconds, 3),
            }
            for r in results
        ],
    )
