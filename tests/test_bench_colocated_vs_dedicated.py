"""The colocated-against-dedicated bench's command line (``bench/colocated_vs_dedicated.py``), on the CPU: every role
process the two-process run starts accepts the command it is given (on a GPU the dedicated role once refused a
colocated-only flag, and two runs lost their ratio), and an option its role does not read is refused, not ignored."""

from __future__ import annotations

import itertools

import pytest

from bench import colocated_vs_dedicated as cvd

VARIATIONS = [  # each stage's flags, and their combinations the bench allows
    [],
    ["--dedicated-first"],
    ["--train-steps", "0"],
    ["--freeze"],
    ["--save-weights", "at-end"],
    ["--freeze", "--save-weights", "at-end"],
    ["--dedicated-first", "--train-steps", "0", "--freeze"],
]


@pytest.mark.parametrize("flags", VARIATIONS, ids=lambda f: " ".join(f) or "default")
def test_every_role_process_accepts_the_command_the_two_process_run_gives_it(flags: list[str]) -> None:
    args = cvd.parse(["--timeout", "78", *flags])
    for role in ("colocated", "dedicated"):
        child = cvd.parse(cvd.role_argv(args, role, "/tmp/part.json", "/tmp/weights.pt"))
        assert child.role == role and child.weights == "/tmp/weights.pt"
        if role == "colocated":  # what makes the colocated role differ reaches it
            assert (child.train_steps, child.freeze, child.save_weights) == (
                args.train_steps,
                args.freeze,
                args.save_weights,
            )
        else:  # and nothing the dedicated role would not read
            assert not {"--train-steps", "--freeze", "--save-weights"} & set(cvd.role_argv(args, role, "p", "w"))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--role", "dedicated", "--freeze"], "--freeze True with --role dedicated: only --role both or colocated"),
        (["--role", "inprocess", "--save-weights", "at-end"], "--save-weights at-end with --role inprocess"),
        (["--role", "colocated", "--timeout", "9"], "--timeout 9.0 with --role colocated: only --role both"),
        (["--rounds", "5"], "--rounds 5 with --role both: only --role inprocess reads it"),
        (["--weights", "w.pt"], "--weights w.pt with --role both: only --role colocated or dedicated"),
        (["--train-steps", "-1"], "--train-steps: -1; expected 0 or more"),
        (["--save-weights", "at-end", "--dedicated-first"], "the dedicated role runs first and loads no weights"),
        (["--role", "colocated", "--save-weights", "at-end"], "no --weights: expected a file to write them to"),
    ],
)
def test_an_option_its_role_does_not_read_is_refused_naming_it(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cvd.parse(argv)
    assert exc.value.code == 2 and expected in capsys.readouterr().err


def test_every_option_a_role_reads_is_known_to_the_parser() -> None:
    """``ROLE_OPTIONS`` names real options and real roles (a renamed option would otherwise drop out of the check)."""
    ap = cvd.build_parser()
    dests = {a.dest for a in ap._actions}
    roles = set(next(a for a in ap._actions if a.dest == "role").choices or ())
    assert set(cvd.ROLE_OPTIONS) <= dests
    assert set(itertools.chain.from_iterable(cvd.ROLE_OPTIONS.values())) <= roles


def test_every_stage_that_runs_the_bench_gives_it_a_command_it_accepts() -> None:
    """The colocated-vs-dedicated stages have no CPU twin (they measure the GPU), so their command lines are
    checked here, each with every role process it starts."""
    from bench.gpu_stages import STAGES

    stages = [s for s in STAGES if s.argv[0] == "bench/colocated_vs_dedicated.py"]
    assert len(stages) == 6
    for stage in stages:
        args = cvd.parse([a.replace("{out}", "/tmp") for a in stage.argv[1:]])
        if args.role == "both":
            for role in ("colocated", "dedicated"):
                cvd.parse(cvd.role_argv(args, role, "/tmp/part.json", "/tmp/weights.pt"))
