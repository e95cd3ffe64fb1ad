"""The stages of ``python -m bench.gpu`` (``bench/gpu.py``, the runner): every piece of colo-fsm's GPU evidence,
each with what it measures, its command, its time limit, the GPUs it needs and its CPU twin.

A stage is named for what it measures. A handoff stage runs ``bench/inflight_handoff.py`` on the reasoning
workload at one point (cut, ``max_age``, model, engine loop); its JSON name says that point. A stage longer than one
10-minute remote call is ``long``: the runner starts it only detached.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from bench._graph_baseline import LOOP_BATCHES

HANDOFF = ("bench/inflight_handoff.py", "--workload", "reasoning")
SMOKE_HANDOFF = ("--smoke", "--model", "small", "--max-len", "48")  # later options win: the CPU shape
# a coordinator stage's CPU twin: megatron's coordinator needs a GPU, so the twin runs the rest of the path on the
# direct engine (a later --engine wins)
SMOKE_COORDINATOR = (*SMOKE_HANDOFF, "--engine", "direct")
SMOKE_SIZING = ("--graph-sizing", "default")  # the CPU captures no CUDA graph: megatron's default, left unset


@dataclass(frozen=True)
class Stage:
    """One piece of GPU evidence: the command (``{out}`` is the stage's output folder), its budget, its needs."""

    name: str
    what: str
    argv: tuple[str, ...]
    timeout_s: int
    gpus: int = 1
    smoke: tuple[str, ...] | None = None  # extra arguments that make the same code path run on the CPU in seconds
    default: bool = True  # run when no --stages are named (multi-GPU stages run only where the GPUs are)
    long: bool = False  # needs more than one 10-minute remote call: run it with --detach, then --wait

    def command(self, out: Path, *, smoke: bool = False, python: str = sys.executable) -> list[str]:
        """The argv to run with ``python``, with ``{out}`` filled in (and the smoke arguments appended for
        ``smoke``)."""
        argv = [a.replace("{out}", str(out)) for a in self.argv]
        if argv[0].endswith(".py") or argv[0] in ("-m", "-c"):
            argv = [python, *argv]
        return argv + list(self.smoke or ()) if smoke else argv


def _handoff(
    cut: int,
    modes: str,
    *extra: str,
    model: str = "gpt200m",
    age: int = 2,
    order: str = "start",
    steps: int = 3,
    engine: str = "direct",
    sizing: str | None = None,
) -> tuple[str, ...]:
    """The handoff bench's argv at one point (cut, modes, model, age, order, engine loop: ``--engine`` unless
    direct, megatron's CUDA-graph sizing: ``--graph-sizing`` unless its default), ``extra`` after it, and a JSON
    name that says the point (drain's race too, where ``extra`` forces it)."""
    tail = ("" if order == "start" else f"_{order}-order") + ("" if engine == "direct" else f"_{engine}")
    tail += "" if sizing is None else f"_{sizing}-graphs"
    if "--drain-race" in extra:  # a forced race is a run of its own: never the same file as the free one
        tail += f"_{extra[extra.index('--drain-race') + 1]}"
    name = f"inflight_handoff_reasoning_{model}_cut{cut}_age{age}_{modes.replace(',', '-')}{tail}.json"
    return (
        *HANDOFF,
        "--buffer-order",
        order,
        "--model",
        model,
        "--max-len",
        str(cut),
        "--max-age",
        str(age),
        "--modes",
        modes,
        "--steps",
        str(steps),
        *(() if engine == "direct" else ("--engine", engine)),
        *(() if sizing is None else ("--graph-sizing", sizing)),
        *extra,
        "--out",
        f"{{out}}/{name}",
    )


def _detached(
    name: str, what: str, argv: tuple[str, ...], timeout_s: int, smoke: tuple[str, ...] = SMOKE_HANDOFF
) -> Stage:
    """A handoff stage longer than one 10-minute remote call: run only when named, with --detach, then --wait."""
    return Stage(name, what, argv, timeout_s, smoke=smoke, default=False, long=True)


def _coordinator_long(name: str, what: str, argv: tuple[str, ...], timeout_s: int = 1200) -> Stage:
    """A handoff stage on megatron-core's coordinator loop longer than one remote call (--detach, then --wait); its
    smoke twin runs the direct loop on the CPU, with megatron's default graph sizing where the stage sets one (no
    graph is captured there)."""
    sized = "--graph-sizing" in argv
    return _detached(name, what, argv, timeout_s, smoke=SMOKE_COORDINATOR + (SMOKE_SIZING if sized else ()))


def _coordinator_pair(name: str, what: str, argv: tuple[str, ...]) -> Stage:
    """A two-mode handoff stage on megatron-core's coordinator loop that fits one remote call: run only when named."""
    return Stage(name, what, argv, 600, smoke=SMOKE_COORDINATOR, default=False)


STAGES: tuple[Stage, ...] = (
    Stage(
        "tests",
        "pytest -m gpu: the dynamic engine (suspend/resume, park and abort in every KV mode), the trainer (DDP hooks, "
        "schedule loss, optimizer and distributed-optimizer checkpoints), megatron's coordinator loop (park, abort, "
        "MoE, the OpenAI server over it)",
        (
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--timeout",
            "150",
            "tests/test_megatron_engine.py",
            "tests/test_megatron_trainer_gpu.py",
            "tests/test_megatron_model.py",
            "tests/test_megatron_coordinator_gpu.py",
            "--junitxml",
            "{out}/pytest_gpu.xml",
        ),
        360,
        smoke=("--collect-only",),
    ),
    _detached(
        "reasoning-8k",
        "reasoning shape, cut 8,192: park, drain, sync and abort on one engine built once (each after its warm-up), "
        "and the pure graph decode; ~16 min: --detach",
        _handoff(8192, "park,drain,sync,abort"),
        1500,
    ),
    Stage(
        "reasoning-8k-park-abort",
        "reasoning shape, cut 8,192: park against the peers' abort-and-resubmit, side by side on one engine",
        _handoff(8192, "park,abort", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    Stage(
        "reasoning-8k-park-drain",
        "reasoning shape, cut 8,192: park and drain side by side (each after its warm-up), and the pure graph decode",
        _handoff(8192, "park,drain"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-8k-drain-hold",
        "reasoning shape, cut 8,192: park, drain and drain-hold (drain whose collector starts nothing while the next "
        "batch is ready, so the trainer's handoff wins its race with the collector; bench/handoff_model.py predicts "
        "park/drain-hold 1.11-1.17); ~14 min: --detach",
        _handoff(8192, "park,drain,drain-hold", "--no-graph-baseline"),
        1200,
    ),
    Stage(
        "reasoning-8k-park-drain-hold",
        "reasoning shape, cut 8,192: park and drain-hold only (drain's own runs are the earlier ones), side by side "
        "on one engine; the short form of reasoning-8k-drain-hold",
        _handoff(8192, "park,drain-hold", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
        default=False,
    ),
    _coordinator_long(
        "reasoning-8k-coordinator",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop (the faster path for park: 1.11x the direct "
        "one at aaf3a49): the pure graph decode, then park, drain, sync and abort on one engine, the headline's modes "
        "and park's decode against the graph decode in one process, on the path users run; ~15 min (the four modes "
        "took 759 s at 4366d6d): --detach",
        _handoff(8192, "park,drain,sync,abort", engine="coordinator"),
        1500,
    ),
    _coordinator_long(
        "reasoning-8k-coordinator-collector-first",
        "reasoning-8k-coordinator with drain's race forced (--drain-race collector-first: each drain handoff waits "
        "until the collector has admitted what it may, so every one waits for its tail): park, drain, sync and abort "
        "on one engine of the path users run, each drain handoff a real drain; ~14-16 min: --detach",
        _handoff(8192, "park,drain,sync,abort", "--drain-race", "collector-first", engine="coordinator"),
        1500,
    ),
    _coordinator_pair(
        "reasoning-8k-coordinator-park-drain",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop: park and drain in one process, so park / "
        "drain on the faster path has a second one-process figure (the first, 1.316 at 4366d6d, had a handoff that "
        "drained nothing; this run's JSON says how many groups each handoff found); ~9 min (531 s at 76259d0)",
        _handoff(8192, "park,drain", "--no-graph-baseline", engine="coordinator"),
    ),
    _coordinator_pair(
        "reasoning-8k-coordinator-park-drain-collector-first",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop: park and drain in one process with drain's "
        "race forced (--drain-race collector-first: each drain handoff waits until the collector has admitted what "
        "it may), so every drain handoff waits for its tail, where both one-process park / drain runs on this path "
        "had one that drained nothing; ~9 min",
        _handoff(8192, "park,drain", "--no-graph-baseline", "--drain-race", "collector-first", engine="coordinator"),
    ),
    _coordinator_pair(
        "reasoning-8k-coordinator-park-drain-hold",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop: park and drain-hold in one process (drain "
        "whose collector starts nothing while the next batch is ready; on the direct path park / drain-hold was "
        "1.10-1.14x); ~7-9 min (508 s at e07ddf5, 432 s at cfe14fd)",
        _handoff(8192, "park,drain-hold", "--no-graph-baseline", engine="coordinator"),
    ),
    _coordinator_long(
        "reasoning-8k-coordinator-park-sync",
        "reasoning shape, cut 8,192, on megatron-core's coordinator loop: park and sync with sync on park's prompts "
        "(the 2.0x sync target's pair on the faster path; 1.626 at 4366d6d and 1.691 at dec9bed drew sync from the "
        "stream's first prompt); ~6-8 min (441 s and 395 s at b1d9af0 on two machines: 1.588 and 1.453, each the "
        "ratio of the two modes' engine decode rates within 0.013): --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", engine="coordinator"),
        900,
    ),
    _coordinator_long(
        "reasoning-32k-coordinator",
        "reasoning shape, cut 32,768, on megatron-core's coordinator loop: park, drain and sync (the long tail on "
        "the faster path; its runs at 6f6dd0a and 70c3315 each lost their machine during drain, park whole; the stage "
        "below ran park and drain whole); ~15-17 min: "
        "--detach",
        _handoff(32768, "park,drain,sync", "--no-graph-baseline", engine="coordinator"),
        2400,
    ),
    _coordinator_long(
        "reasoning-32k-coordinator-park-drain",
        "reasoning shape, cut 32,768, on megatron-core's coordinator loop: park and drain only (the 2.0x drain "
        "target's pair; sync's figure is the long one), so it fits one session's device time after the wheels' "
        "install; ~11 min (609 s at 70c3315, whose drain had one handoff that drained nothing): --detach",
        _handoff(32768, "park,drain", "--no-graph-baseline", engine="coordinator"),
    ),
    _coordinator_long(
        "reasoning-32k-coordinator-park-drain-collector-first",
        "reasoning shape, cut 32,768, on megatron-core's coordinator loop: park and drain with drain's race forced "
        "(--drain-race collector-first), so every drain handoff waits for its tail, as every one did on the direct "
        "path at this cut (at 70c3315 one of three drained nothing); ~12-14 min (827 s at e07ddf5, 747 s at 0441af7): "
        "--detach",
        _handoff(32768, "park,drain", "--no-graph-baseline", "--drain-race", "collector-first", engine="coordinator"),
    ),
    _coordinator_long(
        "reasoning-8k-coordinator-park-sync-linear-graphs",
        "reasoning-8k-coordinator-park-sync with megatron's graphs sized linearly (--graph-sizing linear: 16 "
        "decode-only graphs at 256 requests, every 16 requests, not the powers of two, so a decode step pads by at "
        "most 15 requests; the graphs of steps with a prefill change too, 48 graphs in all against 62): what padding "
        "costs each mode on the faster path; the step profile counts each mode's decode steps per captured graph; "
        "~6-8 min, estimated from the stage it varies: --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", engine="coordinator", sizing="linear"),
        900,
    ),
    _coordinator_long(
        "reasoning-32k-coordinator-park-sync-linear-graphs",
        "reasoning-32k-coordinator-park-sync with megatron's graphs sized linearly (--graph-sizing linear, as in "
        "the 8k stage), where park's 65-68 requests a decode step ran the 128 graph of the default sizing (the 80 "
        "graph here); the step profile counts each mode's decode steps per captured graph; ~9 min (521 s at 2b672ff "
        "on an H100: park's padding 9.7% of its graphs' slots, 20.7% on the default sizing): --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", engine="coordinator", sizing="linear"),
    ),
    _coordinator_long(
        "reasoning-32k-coordinator-park-sync",
        "reasoning shape, cut 32,768, on megatron-core's coordinator loop: park and sync only (the 2.5x sync "
        "target's pair on the faster path, where the three-mode stage has lost its machine during drain each time); "
        "~9-10 min (590 s at 0441af7, 509 s at 0c47749, 608 s at 2990879 and 604 s at fb85515, whose syncs drew "
        "from park's prompts, and 591 s at 480d331 on an H100, where park / sync was 1.688; at cfe14fd its machine "
        "was taken during sync's third step): --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", engine="coordinator"),
    ),
    Stage(
        "reasoning-8k-drain-sync",
        "reasoning shape, cut 8,192: drain and sync again (a second run of each beside an earlier park, for their "
        "spread), and the pure graph decode at the workload's contexts",
        _handoff(8192, "drain,sync"),
        600,
        smoke=SMOKE_HANDOFF,
        default=False,
    ),
    Stage(
        "reasoning-8k-park-sync",
        "reasoning shape, cut 8,192: park and sync side by side (generate the whole batch, tail included, then "
        "train); ~7-8 min (440 s at 7d7d980, 469 s at ca6c37b)",
        _handoff(8192, "park,sync", "--no-graph-baseline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-32k",
        "reasoning shape, cut 32,768: park, drain and sync (where drain's tail grows); ~16 min: --detach",
        _handoff(32768, "park,drain,sync", "--no-graph-baseline"),
        2400,
    ),
    _detached(
        "reasoning-32k-park-sync",
        "reasoning shape, cut 32,768: park and sync only (drain's figure is the long one); ~10 min: --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline"),
        1200,
    ),
    Stage(
        "reasoning-8k-deadline",
        "park (buffer in deadline order: no head-of-line blocking) and sync at cut 8,192",
        _handoff(8192, "park,sync", "--no-graph-baseline", order="deadline"),
        600,
        smoke=SMOKE_HANDOFF,
    ),
    _detached(
        "reasoning-32k-deadline",
        "park (buffer in deadline order) and sync at cut 32,768, where a long rollout at the head holds a step; "
        "~9 min: --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", order="deadline"),
        1200,
    ),
    _detached(
        "reasoning-8k-age1",
        "park and drain at --max-age 1 (one step of staleness allowed); ~8 min (488 s at 6f74238), too close to one "
        "remote call with the wheels' install: --detach",
        _handoff(8192, "park,drain", "--no-graph-baseline", age=1),
        900,
    ),
    _detached(
        "reasoning-8k-age4",
        "park and drain at --max-age 4: 4 warm-up steps, 6 measured (bench/handoff_model.py: after one, park's "
        "3-step window makes 42% fewer samples than it trains; 4 + 6 is steady for each of 4 seeds); ~18 min (1,053 s at 0bdc5f1): --detach",
        _handoff(8192, "park,drain", "--no-graph-baseline", "--warmup", "4", age=4, steps=6),
        1500,
    ),
    _detached(
        "reasoning-8k-age1-park-sync",
        "park and sync at --max-age 1 (bench/handoff_model.py: park / sync 1.36; 1.283 at ca6c37b); ~8 min (484 s at "
        "ca6c37b): --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", age=1),
        900,
    ),
    _detached(
        "reasoning-8k-age4-park-sync",
        "park and sync at --max-age 4, 4 warm-up steps and 6 measured as reasoning-8k-age4 (bench/handoff_model.py: "
        "park / sync 1.89 in that window, sync drawn from park's prompts; 1.641 at 2990879); ~12 min (723 s at "
        "2990879): --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", "--warmup", "4", age=4, steps=6),
        1500,
    ),
    _detached(
        "reasoning-32k-age4",
        "park and sync at cut 32,768 with --max-age 4: a wider admission window (at 0c47749 it lowered park / sync "
        "to 1.382: park's window holds the workload's one 32,768-token draw); 4 warm-up steps, 6 measured "
        "(bench/handoff_model.py: steady for 3 of 4 seeds, the bench's among them); ~18-19 min (1,080 s at 0c47749, "
        "whose sync drew from the first prompt; drawn as now, its window holds the 32,768-token draw too): --detach",
        _handoff(32768, "park,sync", "--no-graph-baseline", "--warmup", "4", age=4, steps=6),
        1500,
    ),
    _detached(
        "reasoning-32k-graph-contexts",
        "reasoning shape, cut 32,768: megatron's pure graph decode from 4,096, 8,192 and 16,000 tokens of context "
        "at the batches that fit the KV buffer, beside the baseline's 832 and the workload's mean 1,715, then park "
        "and sync (sync on park's prompts): what a decode step costs where a long rollout decodes, which "
        "bench/handoff_model.py prices at the mean context (22% short per engine step at 32,768 with max_age 4); "
        "a context that fails is recorded and the bench exits 1; ~10 min (599 s at fb85515, park / sync 1.625, "
        "every context run; 603 s at ca6c37b, whose graph decode stopped at 4,096 tokens, batch 128, on a request "
        "budget fixed since): --detach",
        _handoff(32768, "park,sync", "--graph-contexts", "4096,8192,16000"),
        1200,
        smoke=(*SMOKE_HANDOFF, "--graph-contexts", ""),
    ),
    Stage(
        "reasoning-graph-contexts",
        "reasoning shape, cut 32,768: megatron's pure graph decode alone, no mode, from 832 tokens (the baseline's), "
        "1,715 (the workload's mean), 4,096, 8,192 and 16,000 at the batches that fit the KV buffer: a machine's "
        "rows for bench/handoff_model.py's long-context price (at fb85515 and b1d9af0 the step was linear in its "
        "context from 832 tokens up, at ca6c37b not below the mean); ~2 min (91 s at b1d9af0)",
        (
            *HANDOFF,
            "--model",
            "gpt200m",
            "--max-len",
            "32768",
            "--graph-only",
            "--graph-contexts",
            "4096,8192,16000",
            "--out",
            "{out}/graph_decode_reasoning_gpt200m_cut32768.json",
        ),
        300,
        smoke=(*SMOKE_HANDOFF, "--graph-contexts", ""),
        default=False,
    ),
    Stage(
        "reasoning-8k-graph-loop-costs",
        "reasoning shape, cut 8,192: megatron's pure graph decode alone, no mode, then made like a loop's decode "
        "steps one way at a time from the workload's mean context (1,417 tokens): batches between the captured "
        "graphs' sizes (25, 40, 65, 120; the default sizing's graphs at 256 requests are the powers of two), log-probs on, tokens "
        "sampled at temperature 1.0 rather than greedily, each request at its own context drawn as the workload's "
        "decoded tokens are, and all four; then the batches again on a second engine whose decode graphs megatron "
        "sizes linearly (every 16 requests). On the direct loop "
        "the graph alone took 0.61-0.87 of a mode's decode step in the loop (bench/park_ceiling.py): this tells "
        "which difference costs what, at fixed batches (which graph each of a loop's steps ran is in the step "
        "profile of runs that count steps per captured graph, from 3385c87); a row that fails is recorded and the bench exits 1; "
        "59 s at 3385c87",
        (
            *HANDOFF,
            "--model",
            "gpt200m",
            "--max-len",
            "8192",
            "--graph-only",
            "--graph-loop-costs",
            ",".join(map(str, LOOP_BATCHES)),
            "--out",
            "{out}/graph_decode_reasoning_gpt200m_cut8192.json",
        ),
        420,
        smoke=(*SMOKE_HANDOFF, "--graph-loop-costs", ""),
        default=False,
    ),
    _detached(
        "reasoning-8k-gpt1b",
        "the ~1B GPT: park and sync at cut 8,192; ~9 min (533 s at 6f74238), too close to one remote call with the "
        "wheels' install: --detach",
        _handoff(8192, "park,sync", "--no-graph-baseline", model="gpt1b"),
        1200,
    ),
    _detached(
        "reasoning-8k-gpt1b-park-abort",
        "the ~1B GPT: park and abort at cut 8,192, where a token of re-prefill costs more than on the 202M model "
        "(whose park and abort were level, 0.95-1.14x in four processes); ~9-11 min (546 s at 4a18c96, 640 s with "
        "its exit at 7d7d980): give it 660 s or more, --detach",
        _handoff(8192, "park,abort", "--no-graph-baseline", model="gpt1b"),
        1200,
    ),
    Stage(
        "engine-paths",
        "park on colo-fsm's direct engine against megatron-core's own engine loop (coordinator mode), reasoning shape",
        (
            "bench/engine_paths.py",
            "--workload",
            "reasoning",
            "--modes",
            "park",
            "--steps",
            "3",
            "--no-graph-baseline",
            "--out",
            "{out}/engine_paths_reasoning_cut8192.json",
        ),
        600,
        smoke=(*SMOKE_HANDOFF, "--engines", "direct"),
    ),
    Stage(
        "engine-loop",
        "the direct engine loop's own host cost per decode step at 64 and 256 active requests (no model)",
        ("bench/engine_loop.py", "--out", "{out}/engine_loop.json"),
        60,
        smoke=("--quick",),
    ),
    Stage(
        "graphs",
        "CUDA-graph decode against eager on one trainable model; greedy equality before and after training",
        ("bench/cuda_graph_decode.py", "--out", "{out}/cuda_graph_decode.json"),
        300,
        smoke=("--device", "cpu", "--quick"),
    ),
    Stage(
        "park-probe",
        "requests parked across suspend -> train -> resume through the adapter, in every KV mode",
        ("bench/park_probe.py", "--out", "{out}/park_probe.json"),
        180,
        smoke=("--device", "cpu"),
    ),
    Stage(
        "colocated-vs-dedicated",
        "decode on the colocated trainable model against a dedicated inference-only copy of its weights, in one "
        "process in alternating rounds, on colo-fsm's default graph scope (block): the figure docs/colocation.md "
        "quotes (0.99-1.04x on an H200, 2026-12-01)",
        (
            "bench/colocated_vs_dedicated.py",
            "--role",
            "inprocess",
            "--scope",
            "block",
            "--out",
            "{out}/colocated_vs_dedicated_inprocess_block.json",
        ),
        180,
    ),
    Stage(
        "colocated-vs-dedicated-two-processes",
        "the same in two processes one after the other, on megatron's per-layer graphs (scope layer): 0.57-0.68x "
        "on two machines while the colocated role wrote its weights at its end, 0.87-0.98x at 73940c4 (an H100), "
        "which writes them before its decode; its 64-step windows are short and a whole process can run slow "
        "(windows 1.45-1.75x as long)",
        ("bench/colocated_vs_dedicated.py", "--timeout", "78", "--out", "{out}/colocated_vs_dedicated.json"),
        180,
    ),
    *(  # one thing each changed in the two-process run (what made colocated decode 0.57-0.68x there)
        Stage(
            f"colocated-vs-dedicated-two-processes-{tag}",
            f"the two-process run with {what}: one setting changed from it, to tell order, training, parameters "
            "that require grad and when the weights are written apart (~1-2 min)",
            (
                "bench/colocated_vs_dedicated.py",
                "--timeout",
                "78",
                *flags,
                "--out",
                f"{{out}}/colocated_vs_dedicated_{tag.replace('-', '_')}.json",
            ),
            180,
            default=False,
        )
        for tag, flags, what in (
            ("dedicated-first", ("--dedicated-first",), "the dedicated process first (order)"),
            ("untrained", ("--train-steps", "0"), "the colocated model never trained (its trainer built)"),
            ("frozen", ("--freeze",), "the colocated model's parameters not requiring grad while it decodes"),
            (
                "saved-at-end",
                ("--save-weights", "at-end"),
                "the colocated role writing its weights at its end, not before its decode (the order of the runs "
                "that measured 0.57-0.68x; its colocated process ran slow in 3 of 5 runs, 3 of 4 on one H200 and not "
                "the one on an H100 at 2b672ff, against none of 8 writing them before, 3 there and 5 on H100s; "
                "the dedicated role then loads weights two train steps later)",
            ),
        )
    ),
    Stage(
        "resident-vs-rebuild",
        "a resident engine's resume against a rebuild (with and without CUDA graphs)",
        (
            "bench/resident_vs_rebuild.py",
            "--graph-cycles",
            "2",
            "--graph-rebuilds",
            "1",
            "--out",
            "{out}/resident_vs_rebuild.json",
        ),
        200,
    ),
    Stage(
        "memory-peak",
        "the trainer's peak memory beside a resident KV buffer, against the memory-budget estimate",
        ("bench/memory_peak.py", "--graphs", "off", "--buffer-gb", "8", "--out", "{out}/memory_peak.json"),
        90,
    ),
    Stage(
        "fingerprint-nccl",
        "the fingerprint barrier against a plain barrier over NCCL (world of one)",
        (
            "bench/fingerprint_barrier.py",
            "--backend",
            "nccl",
            "--ranks",
            "1",
            "--quick",
            "--json",
            "{out}/fingerprint_barrier_nccl.json",
        ),
        90,
        smoke=("--backend", "gloo", "--ranks", "2"),
    ),
    Stage(
        "adapter-1gpu",
        "the megatron-core adapter end to end on one GPU: KV modes, suspend/resume timings, train, checkpoint",
        ("scripts/gpu_megatron_check.py", "--out", "{out}/adapter_1gpu"),
        240,
        smoke=("--device", "cpu"),
    ),
    Stage(
        "demo-cuda",
        "the demo on CUDA: 60 steps with validation and checkpoints",
        (
            "-m",
            "colo_fsm.demo",
            "--device",
            "cuda",
            "--steps",
            "60",
            "--validate-every",
            "20",
            "--checkpoint-every",
            "30",
            "--no-tensorboard",
            "--run-dir",
            "{out}/demo_run",
        ),
        180,
        smoke=("--device", "cpu", "--steps", "6"),
    ),
    Stage(
        "adapter-tp2",
        "the adapter over 2 GPUs at TP=2 (NCCL)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_megatron_check.py", "--tp", "2", "--out", "{out}/tp2"),
        240,
        gpus=2,
    ),
    Stage(
        "adapter-dp2",
        "the adapter over 2 GPUs at DP=2 (NCCL)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_megatron_check.py", "--tp", "1", "--out", "{out}/dp2"),
        200,
        gpus=2,
    ),
    Stage(
        "coordinator-ep2",
        "megatron's coordinator loop with expert parallelism over 2 GPUs (MoE)",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_coordinator_multi.py", "--ep", "2"),
        240,
        gpus=2,
    ),
    Stage(
        "coordinator-tp2",
        "megatron's coordinator loop at TP=2 over 2 GPUs",
        ("torchrun", "--nproc-per-node", "2", "scripts/gpu_coordinator_multi.py", "--tp", "2"),
        240,
        gpus=2,
    ),
)
BY_NAME = {s.name: s for s in STAGES}
NAME_WIDTH = max(len(s.name) for s in STAGES) + 1  # the stage-name column of --list and of the summary


__all__ = ["BY_NAME", "HANDOFF", "NAME_WIDTH", "SMOKE_COORDINATOR", "SMOKE_HANDOFF", "STAGES", "Stage"]
