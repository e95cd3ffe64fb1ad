"""The colocated-against-dedicated bench's command line (``bench/colocated_vs_dedicated.py``) and memory-peak's,
which runs its colocated role, on the CPU: every role process the two-process run starts accepts the command it is
given and receives every setting (on a GPU the dedicated role once refused a colocated-only flag, and two runs lost
their ratios), and an option its role does not read is refused, at any value, not ignored."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench import colocated_vs_dedicated as cvd
from bench import memory_peak

VARIATIONS = [  # each stage's flags, and their combinations the bench allows
    [],
    ["--dedicated-first"],
    ["--train-steps", "0"],
    ["--freeze"],
    ["--save-weights", "at-end"],
    ["--freeze", "--save-weights", "at-end"],
    ["--dedicated-first", "--train-steps", "0", "--freeze"],
]
SHARED = ["--scope", "block", "--batches", "2,4", "--steps", "8", "--num-cuda-graphs", "4", "--buffer-gb", "1.5"]
SHARED_DESTS = ("graphs", "scope", "batches", "steps", "num_cuda_graphs", "buffer_gb", "max_requests")


@pytest.mark.parametrize("flags", VARIATIONS, ids=lambda f: " ".join(f) or "default")
@pytest.mark.parametrize("shared", [[], [*SHARED, "--max-requests", "8"]], ids=["defaults", "settings"])
def test_every_role_process_accepts_the_command_the_two_process_run_gives_it(
    flags: list[str], shared: list[str], tmp_path: Path
) -> None:
    args = cvd.parse(["--timeout", "78", *shared, *flags])
    weights = tmp_path / "weights.pt"
    weights.write_bytes(b"")  # the colocated role has written them by the time the dedicated one starts
    for role in ("colocated", "dedicated"):
        argv = cvd.role_argv(args, role, str(tmp_path / "part.json"), str(weights))
        child = cvd.parse(argv)
        assert child.role == role
        assert [getattr(child, d) for d in SHARED_DESTS] == [getattr(args, d) for d in SHARED_DESTS]
        assert child.weights == (None if args.dedicated_first else str(weights))  # loaded only when run second
        if role == "colocated":  # what makes the colocated role differ reaches it
            got = (child.train_steps, child.freeze, child.save_weights)
            assert got == (args.train_steps, args.freeze, args.save_weights)
        else:  # and nothing the dedicated role would not read
            assert not {"--train-steps", "--freeze", "--save-weights"} & set(argv)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--role", "dedicated", "--freeze"], "--freeze with --role dedicated: only --role both or colocated"),
        (["--role", "dedicated", "--train-steps", "2"], "--train-steps 2 with --role dedicated"),  # at its default
        (["--role", "dedicated", "--save-weights", "before-decode"], "--save-weights before-decode with --role"),
        (["--role", "inprocess", "--save-weights", "at-end"], "--save-weights at-end with --role inprocess"),
        (["--role", "colocated", "--timeout", "9"], "--timeout 9.0 with --role colocated: only --role both"),
        (["--role", "inprocess", "--timeout", "240"], "--timeout 240.0 with --role inprocess"),
        (["--rounds", "3"], "--rounds 3 with --role both: only --role inprocess reads it"),
        (["--weights", "w.pt"], "--weights w.pt with --role both: only --role colocated or dedicated"),
        (["--graphs", "off", "--scope", "block"], "--scope block with --graphs off: expected --graphs on"),
        (["--graphs", "off", "--num-cuda-graphs", "16"], "--num-cuda-graphs 16 with --graphs off"),
        (["--train-steps", "-1"], "--train-steps -1: expected 0 or more"),
        (["--steps", "0"], "--steps 0: expected 1 or more"),
        (["--role", "inprocess", "--rounds", "0"], "--rounds 0: expected 1 or more"),
        (["--buffer-gb", "0"], "--buffer-gb 0.0: expected a size in GiB above 0"),
        (["--batches", "1,x"], "--batches '1,x': expected comma-separated batch sizes of 1 or more"),
        (["--batches", "0,16"], "--batches '0,16'"),
        (["--role", "dedicated", "--weights", "/nonexistent/w.pt"], "no such file for the dedicated role to load"),
        (["--save-weights", "at-end", "--dedicated-first"], "the dedicated role runs first and loads no weights"),
        (["--role", "colocated", "--save-weights", "at-end"], "with --role colocated and no --weights"),
    ],
)
def test_an_option_its_role_does_not_read_or_a_bad_value_is_refused_naming_it(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cvd.parse(argv)
    assert exc.value.code == 2 and expected in capsys.readouterr().err


def test_every_option_a_role_reads_is_known_to_the_parser() -> None:
    """``ROLE_OPTIONS`` and ``GRAPH_OPTIONS`` name real options and roles (a renamed option would drop out)."""
    ap = cvd.build_parser()
    dests = {a.dest for a in ap._actions}
    roles = set(next(a for a in ap._actions if a.dest == "role").choices or ())
    assert set(cvd.ROLE_OPTIONS) | set(cvd.GRAPH_OPTIONS) <= dests
    assert set(itertools.chain.from_iterable(cvd.ROLE_OPTIONS.values())) <= roles


@pytest.mark.parametrize(
    ("flags", "same"),
    [
        ([], True),
        (["--dedicated-first"], False),  # the dedicated role decodes the seed's weights, the colocated role trained
        (["--dedicated-first", "--train-steps", "0"], True),
        (["--save-weights", "at-end"], False),  # written two train steps after the colocated decode
        (["--save-weights", "at-end", "--freeze"], True),  # --freeze skips those steps
    ],
)
def test_the_result_says_whether_the_two_roles_decoded_the_same_weights(flags: list[str], same: bool) -> None:
    assert cvd.same_weights(cvd.parse(flags)) is same


def test_every_stage_that_runs_the_bench_gives_it_a_command_it_accepts(tmp_path: Path) -> None:
    """The colocated-vs-dedicated and memory-peak stages have no CPU twin (they measure the GPU), so their command
    lines are checked here, each with every role process it starts."""
    from bench.gpu_stages import STAGES

    weights = tmp_path / "weights.pt"
    weights.write_bytes(b"")
    stages = [s for s in STAGES if s.argv[0] == "bench/colocated_vs_dedicated.py"]
    assert len(stages) == 6
    for stage in stages:
        args = cvd.parse([a.replace("{out}", str(tmp_path)) for a in stage.argv[1:]])
        if args.role == "both":
            for role in ("colocated", "dedicated"):
                cvd.parse(cvd.role_argv(args, role, str(tmp_path / "part.json"), str(weights)))
    (peak,) = [s for s in STAGES if s.argv[0] == "bench/memory_peak.py"]
    role = memory_peak.role_args([a.replace("{out}", str(tmp_path)) for a in peak.argv[1:]])
    assert (role.role, role.graphs, role.buffer_gb, role.train_steps, role.weights) == (
        "colocated",
        "off",
        8.0,
        2,
        None,
    )


def test_memory_peak_refuses_graph_options_with_graphs_off(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        memory_peak.role_args(["--scope", "block"])  # its default is --graphs off
    assert "--scope block with --graphs off: expected --graphs on" in capsys.readouterr().err
    assert memory_peak.role_args(["--graphs", "on", "--scope", "block"]).scope == "block"


def test_host_pace_records_what_the_process_did_during_a_window() -> None:
    """The clues a slow decode window leaves on the host, each made to show once: a collection the window ran, a
    thread it left running, the CPU time it spent."""
    import gc
    import sys
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)

    def window() -> str:
        gc.collect()  # one collection of the oldest generation
        worker.start()
        sum(i * i for i in range(200_000))  # some CPU time of the process's own
        return "tokens"

    gc.disable()  # the one collection the window runs is then the only one
    try:
        out, pace = cvd.host_pace(window)
    finally:
        gc.enable()
        stop.set()
        worker.join()
    assert out == "tokens"
    assert pace["gc_collections"] == [0, 0, 1]
    assert pace["wall_s"] > 0 and pace["cpu_s"] == pace["user_s"] + pace["system_s"] > 0
    assert pace["cpu_over_wall"] == pace["cpu_s"] / pace["wall_s"]
    if sys.platform.startswith("linux"):
        import os

        before, after = pace["threads"]
        assert after == before + 1 and pace["cpus_allowed"] == len(os.sched_getaffinity(0))
        switches = pace["context_switches"]
        assert switches["voluntary"] >= 0 and switches["involuntary"] >= 0 and pace["minor_page_faults"] >= 0


def test_the_summary_gives_the_committed_runs_ratios_and_the_host_pace_where_recorded() -> None:
    """Read back from a committed two-process run (recorded before ``host_pace``): the same ratios it wrote, no
    host column; with a host record, its CPU over wall per role; a role that decoded nothing gives no ratio."""
    import json

    runs = Path(__file__).resolve().parents[1] / "docs" / "gpu-runs"
    data = json.loads((runs / "2026-12-05-h100-colocated-vs-dedicated-two-processes-73940c4.json").read_text())
    rows, ratios = cvd.summary_rows(data["parts"])
    assert {str(b): r for b, r in ratios.items()} == data["ratios"] and [r["batch"] for r in rows] == [1, 16, 64]
    assert all(r["col cpu/wall"] is None for r in rows)

    def role(rate: float, cpu: float) -> dict:
        return {
            "sections": {
                "decode": {"decode": [{"batch": 8, "decode_tokens_per_s": rate}], "host": [{"cpu_over_wall": cpu}]}
            }
        }

    rows, ratios = cvd.summary_rows({"colocated": role(60.0, 1.4), "dedicated": role(100.0, 1.0)})
    assert ratios == {8: 0.6} and (rows[0]["col cpu/wall"], rows[0]["ded cpu/wall"]) == (1.4, 1.0)
    rows, ratios = cvd.summary_rows({"colocated": role(60.0, 1.4), "dedicated": {"missing": True}})
    assert ratios == {} and rows[0]["ratio"] is None and rows[0]["dedicated tok/s"] is None
    short = role(100.0, 1.0)
    short["sections"]["decode"]["decode"].append({"batch": 16, "decode_tokens_per_s": 200.0})  # one host record
    rows, ratios = cvd.summary_rows({"colocated": role(60.0, 1.4), "dedicated": short})
    assert [r["batch"] for r in rows] == [8, 16] and ratios == {8: 0.6} and rows[1]["ded cpu/wall"] is None


def test_host_pace_without_getrusage_records_none_not_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the platform has no ``getrusage``, the CPU time and the counts are None (not zeros a reader could take
    for a measurement); the wall time, the threads and the collections are still there."""
    monkeypatch.setattr(cvd, "_usage", lambda: None)
    out, pace = cvd.host_pace(lambda: 7)
    assert out == 7 and pace["wall_s"] >= 0 and len(pace["gc_collections"]) == 3
    for key in ("cpu_s", "user_s", "system_s", "cpu_over_wall", "context_switches", "minor_page_faults"):
        assert pace[key] is None, (key, pace[key])
