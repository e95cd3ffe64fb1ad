"""A model of the handoff modes in virtual time: what park, drain, sync and abort should make of a workload, on the
CPU.

    python bench/handoff_model.py                                  # the committed H200 runs' workload, cuts and ages
    python bench/handoff_model.py --cut 32768 --age 4 --steps 20   # one point of the map
    python bench/handoff_model.py --smoke                          # the code path in a second

The bench (``bench/inflight_handoff.py``) measures; this predicts, so that a GPU session knows what to expect
of a stage before it spends device time on it, and so that a measured figure can be told apart from a model of
it. What the modes decide comes from colo-fsm itself: admission is :class:`~colo_fsm.collector.ReplayBuffer`
(``reserve``/``put``/``ready``/``sample``) and :class:`~colo_fsm.guards.capacity.InFlightCap`, as the bench's
collector uses them; the output lengths are the bench's own draws (``output_length``). The loop around them (the
collector admitting while the engine generates, the trainer taking a batch as soon as one is ready, the engine
decoding its running requests first in, first out, with no KV limit) is re-written here. No timing enters what is
decided, so the requests decoding per step follow from the admission rule and the lengths alone. What is
modelled is time: an engine step decodes one token of every running request and takes the pure CUDA-graph
decode's time at that batch, from a committed run's ``graph_decode`` rows, taken linearly in the decode context
between its two contexts (the workload's mean decode context at each cut), plus a host cost per step (fixed by
default, or growing with the requests running: ``--host-us-per-request``), and, with ``--kv-ns-per-token``, a price
for each context token a running request holds above that mean, and with ``--kv-credit-below`` a credit as large
for each below it (``bench/_model_costs.py``, where every price lives and says where it comes from; ``--workload``
names the run whose graph decode is the table); a training step takes a fixed cost per trained token. Both fixed costs are fitted to
park's run at the 8,192 cut.
Prefill, handoffs and threads cost nothing, but for abort's re-prefill: abort is park whose handoff ends every
running request, and after the resume each is re-prefilled (prompt + output so far) at a fixed cost per token,
fitted to the same run's abort. Each step records what was in flight as its handoff began (groups, running
requests, their tokens so far): what drain waits for, and what abort ends and re-prefills.

Each mode runs its warm-up steps, then its measured steps; sync runs none and draws its prompts from the one after
those the others' warm-up trains, so every mode's measured steps train the same prompts, as the bench draws them
(``_workload.first_prompt``); samples/s is the samples of the groups finished inside the measured window over its
length, as the bench counts them. It writes JSON (``--out``) and prints a table. A model is not evidence (the docs'
rule): its figures are quoted as predictions, beside the measured ones where they exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import gpu_runs  # noqa: E402  (after the sys.path line above)
from bench._graph_baseline import decode_weighted_context  # noqa: E402
from bench._handoff import MAX_BUFFER_GROWTH  # noqa: E402
from bench._model_costs import (  # noqa: E402  (the prices; re-exported for the model's users)
    COSTS,
    GRAPH_SIZINGS,
    HOST_LINE,
    HOST_MS,
    KV_NS_PER_TOKEN,
    PADDED_ROWS,
    REPREFILL_US_PER_TOKEN,
    TRAIN_US_PER_TOKEN,
    Baseline,
    Timing,
    cost_refusal,
    credit_refusal,
    decode_graph_sizes,
)
from bench._provenance import provenance  # noqa: E402  (after the sys.path line above)
from bench._workload import Shape, first_prompt, output_length  # noqa: E402
from colo_fsm.adapters.protocols import Completion  # noqa: E402
from colo_fsm.collector import ReplayBuffer, TrajectoryGroup  # noqa: E402
from colo_fsm.errors import ConfigError  # noqa: E402
from colo_fsm.guards.capacity import InFlightCap  # noqa: E402

RUNS = gpu_runs.RUNS
WORKLOAD = RUNS / "2026-12-02-h200-reasoning-cut8192-drain-sync-791d078.json"
"""The committed run whose workload shape and graph baseline (from the workload's mean context) the model uses."""
MODES = ("park", "drain", "sync", "drain-hold", "abort")
"""``drain-hold`` is drain where the trainer's handoff wins the race with the collector whenever the next batch is
already buffered: nothing is admitted between the resume and that handoff, so it drains nothing and the next
generation admits two batches' worth. The bench's ``drain`` forces neither outcome by default (its threads race;
``--drain-race collector-first`` forces the other one); its ``drain-hold`` forces this one. ``abort`` admits and
decodes as park does and pays, after each resume, the re-prefill of what its handoff ended."""


@dataclass
class _Group:
    index: int
    ticket: Any
    version: int
    left: list[int]  # tokens still to decode, one per sample (0: finished)
    lengths: tuple[int, ...]  # each sample's output length: what it has decoded is its length less ``left``


@dataclass
class StepRecord:
    """One training step of a mode: its seconds, samples made and trained, engine steps, running requests summed
    over them, the seconds spent draining, what was in flight as its handoff began (:class:`InFlight`), and the
    seconds abort spent re-prefilling what the handoff before this step ended."""

    seconds: float
    made: int
    trained: int
    engine_steps: int
    decoding: int
    waiting_s: float
    at_handoff: InFlight | None = None  # None for sync, which has no handoff with work in flight
    reprefill_s: float = 0.0


@dataclass(frozen=True)
class InFlight:
    """What is in flight as a handoff begins: prompt groups, the requests the engine is running, and their tokens
    so far (prompt + output), which abort would end and re-prefill after the resume."""

    groups: int
    requests: int
    tokens: int


@dataclass
class ModeResult:
    """One mode's prediction over a window of measured steps (:func:`summarize`)."""

    mode: str
    samples_per_s: float
    measured_steps: int
    measured_s: float
    made: int
    trained: int
    mean_decoding: float  # running requests per engine step, averaged over steps
    waiting_share: float  # draining (drain); no mode idles otherwise in this model
    buffer_growth: float  # made / trained - 1: the bench's steady-state measure (MAX_BUFFER_GROWTH)
    reprefill_share: float = 0.0  # abort's re-prefill


def summarize(mode: str, steps: list[StepRecord]) -> ModeResult:
    """The figures of a window of consecutive steps, as the bench computes them over its measured window."""
    seconds = sum(r.seconds for r in steps)
    made, trained = sum(r.made for r in steps), sum(r.trained for r in steps)
    engine_steps = sum(r.engine_steps for r in steps)
    return ModeResult(
        mode=mode,
        samples_per_s=made / seconds if seconds else 0.0,
        measured_steps=len(steps),
        measured_s=seconds,
        made=made,
        trained=trained,
        mean_decoding=sum(r.decoding for r in steps) / engine_steps if engine_steps else 0.0,
        waiting_share=sum(r.waiting_s for r in steps) / seconds if seconds else 0.0,
        buffer_growth=made / trained - 1.0 if trained else 0.0,
        reprefill_share=sum(r.reprefill_s for r in steps) / seconds if seconds else 0.0,
    )


def window_rates(steps: list[StepRecord], width: int) -> list[float]:
    """samples/s over every ``width`` consecutive steps: what one bench window could have seen."""
    return [summarize("", steps[i : i + width]).samples_per_s for i in range(len(steps) - width + 1)]


class _Sim:
    """One mode's run: a virtual clock, the collector's admission, the engine's running requests, the trainer."""

    def __init__(self, shape: Shape, timing: Timing, seed: int, first: int = 0) -> None:
        self.shape, self.timing, self.seed = shape, timing, seed
        self.buffer = ReplayBuffer(shape.num_prompts_per_step, shape.max_trajectory_age_steps, order=shape.buffer_order)
        self.cap = InFlightCap(
            shape.num_prompts_per_step, shape.max_trajectory_age_steps, samples_per_group=shape.samples_per_group
        ).value
        self.t = 0.0
        self.version = 0
        self.next_prompt = first  # the first prompt the mode draws
        self.groups: list[_Group] = []  # in flight, in start order
        self.made = 0  # samples of finished groups
        self.trained = 0
        self.steps_run = 0
        self.decode_steps = 0
        self.decoding_sum = 0
        self.time = {"generating": 0.0, "training": 0.0, "waiting": 0.0, "reprefill": 0.0}
        self.ended_tokens = 0  # what abort's last handoff ended: re-prefilled as the engine generates again

    # the collector
    def admit(self, limit: int | None = None) -> int:
        """Start groups while the in-flight cap and the buffer's age window allow (at most ``limit``)."""
        started = 0
        while len(self.groups) < self.cap and (limit is None or started < limit):
            ticket = self.buffer.reserve(self.version)
            if ticket is None:
                break
            i = self.next_prompt
            self.next_prompt += 1
            lengths = [output_length(self.seed, i, j, self.shape) for j in range(self.shape.samples_per_group)]
            self.groups.append(_Group(i, ticket, self.version, list(lengths), tuple(lengths)))
            started += 1
        return started

    # the engine
    def running(self) -> list[tuple[_Group, int]]:
        """The requests the engine decodes this step: unfinished samples in start order, up to its active cap."""
        out = [(g, j) for g in self.groups for j, n in enumerate(g.left) if n > 0]
        return out[: self.shape.max_active_requests]

    def decode(self, bucket: str) -> None:
        """Decode until the next request finishes (every running request gains the same tokens meanwhile)."""
        run = self.running()
        if not run:
            raise RuntimeError("the model's engine has nothing to decode: no request in flight")
        k = min(g.left[j] for g, j in run)
        dt = self.timing.decode_s(  # each request's context before these steps, read where a long context is priced
            len(run), k, lambda: [self.shape.prompt_len + g.lengths[j] - g.left[j] for g, j in run]
        )
        for g, j in run:
            g.left[j] -= k
        self.t += dt
        self.time[bucket] += dt
        self.decode_steps += k
        self.decoding_sum += k * len(run)
        for g in [g for g in self.groups if not any(g.left)]:
            self.groups.remove(g)
            done = Completion(text="", token_ids=(), weight_version=g.version)
            tokens = sum(self.shape.prompt_len + n for n in g.lengths)  # what training the group costs
            group = TrajectoryGroup(
                f"p{g.index}", "", (done,) * len(g.left), (0.0,) * len(g.left), g.version,
                newest_weight_version=self.version, metadata={"tokens": tokens},
            )  # fmt: skip
            if not self.buffer.put(group, ticket=g.ticket):
                raise RuntimeError(f"group p{g.index} went stale in the model: the admission rule did not hold")
            self.made += len(g.left)

    # the trainer
    def train(self) -> float:
        """Take one batch and train on it: the clock moves by its tokens' training time."""
        batch = self.buffer.sample(self.version, timeout=0)
        tokens = sum(int(g.metadata["tokens"]) for g in batch)
        dt = tokens * self.timing.train_us_per_token / 1e6
        self.t += dt
        self.time["training"] += dt
        self.trained += sum(len(g.samples) for g in batch)
        self.version += 1
        self.buffer.advance(self.version)
        return dt

    def ready(self) -> bool:
        return self.buffer.ready(self.version) >= self.shape.num_prompts_per_step

    def in_flight(self) -> InFlight:
        run = self.running()
        tokens = sum(self.shape.prompt_len + g.lengths[j] - g.left[j] for g, j in run)
        return InFlight(len(self.groups), len(run), tokens)

    def reprefill(self) -> None:
        """Re-prefill what abort's last handoff ended (nothing in any other mode): the clock moves by its tokens."""
        if not self.ended_tokens:
            return
        dt = self.ended_tokens * self.timing.reprefill_us_per_token / 1e6
        self.t += dt
        self.time["reprefill"] += dt
        self.ended_tokens = 0

    # the modes: one training step each
    def step(self, mode: str) -> InFlight | None:
        """One training step of ``mode``; what was in flight as its handoff began (None for sync)."""
        at_handoff = None
        if mode == "sync":  # the whole batch, tail included, then train
            self.admit(limit=self.shape.num_prompts_per_step)
            while not self.ready():
                self.decode("generating")
        elif mode == "drain-hold" and self.ready():  # the handoff wins the race: nothing admitted, nothing to drain
            at_handoff = self.in_flight()
        else:  # the collector admits as soon as the engine generates again, before the trainer's next handoff
            self.reprefill()
            self.admit()
            while not self.ready():
                self.decode("generating")
                self.admit()
            at_handoff = self.in_flight()
            if mode.startswith("drain"):  # nothing starts while draining; every request in flight finishes first
                while self.groups:
                    self.decode("waiting")
            elif mode == "abort":  # every running request ends here and is resubmitted with its output so far
                self.ended_tokens = at_handoff.tokens
        self.train()
        self.steps_run += 1
        return at_handoff


def run_mode(
    mode: str, shape: Shape, timing: Timing, *, seed: int, warmup: int, steps: int, first: int | None = None
) -> list[StepRecord]:
    """One mode: ``warmup`` steps (sync: none), then ``steps`` measured ones, each recorded. ``first`` is the first
    prompt the mode draws; None: the bench's rule (``_workload.first_prompt``: sync starts after the prompts the
    others' ``warmup`` steps train), an index for a run that drew otherwise (the runs before that rule: 0)."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"one of {', '.join(MODES)}")
    if steps < 1:
        raise ConfigError("steps", steps, "at least 1 measured step")
    if first is None:
        first = first_prompt(mode, replace(shape, warmup=warmup))
    elif isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ConfigError("first", first, "a prompt index (0 or more), or None for the bench's rule")
    sim = _Sim(shape, timing, seed, first)
    for _ in range(0 if mode == "sync" else warmup):
        sim.step(mode)
    out = []
    for _ in range(steps):
        t, made, trained = sim.t, sim.made, sim.trained
        n, decoding, waiting, reprefill = sim.decode_steps, sim.decoding_sum, sim.time["waiting"], sim.time["reprefill"]
        at_handoff = sim.step(mode)
        out.append(
            StepRecord(
                seconds=sim.t - t,
                made=sim.made - made,
                trained=sim.trained - trained,
                engine_steps=sim.decode_steps - n,
                decoding=sim.decoding_sum - decoding,
                waiting_s=sim.time["waiting"] - waiting,
                at_handoff=at_handoff,
                reprefill_s=sim.time["reprefill"] - reprefill,
            )
        )
    return out


def load_workload(path: Path) -> tuple[Shape, Baseline, int]:
    """A committed run's shape, its graph baseline (one or two contexts) and its seed, read from ``path``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError("--workload", str(path), f"a readable bench/inflight_handoff.py JSON ({exc})") from exc
    return workload_of(data, str(path))


def workload_of(data: Any, source: str) -> tuple[Shape, Baseline, int]:
    """A run's shape, graph baseline and seed from its JSON ``data`` (as read from ``source``, which a refusal
    names)."""
    if not isinstance(data, dict) or "shape" not in data:
        raise ConfigError("--workload", source, "a bench/inflight_handoff.py JSON (it has no 'shape')")
    g = data.get("graph_decode") or {}
    if not g.get("rows") or not g.get("context_tokens"):
        raise ConfigError("--workload", source, "a run with a graph baseline ('graph_decode' rows and context)")
    try:
        shape = Shape(**data["shape"])
    except TypeError as exc:
        raise ConfigError("--workload", source, f"a shape this bench knows ({exc})") from exc

    def rows(key: str) -> tuple[tuple[int, float], ...]:
        return tuple((int(r["batch"]), float(r["step_ms"])) for r in g.get(key) or ())

    baseline = Baseline(
        int(g["context_tokens"]), rows("rows"), g.get("matched_context_tokens"), rows("rows_matched_context")
    )
    return shape, baseline, int(data.get("seed", 0))


def workload_context(shape: Shape, seed: int) -> int:
    """The decode context the workload's steps attend over on average, over the bench's first 400 prompts (the
    bench's own arithmetic, ``decode_weighted_context``)."""
    lengths = [output_length(seed, i, j, shape) for i in range(400) for j in range(shape.samples_per_group)]
    return decode_weighted_context(shape.prompt_len, lengths)


SAME_SHAPE = (
    "num_prompts_per_step",
    "samples_per_group",
    "max_active_requests",
    "median_tokens",
    "sigma",
    "prompt_len",
)


def measured(
    folder: Path, commits: set[str], shape: Shape, *, warmup: int, window: int
) -> dict[tuple[int, int, str, str], list[tuple[float, float | None]]]:
    """The committed GPU runs of ``commits`` (gpt200m, direct engine) of the model's workload, warm-up and window:
    ``(cut, age, order, mode)`` -> every run's (samples/s, requests per engine step). The runs are the report's
    (:func:`bench.gpu_runs.load`), so the model and PERFORMANCE.md read the same files."""
    out: dict[tuple[int, int, str, str], list[tuple[float, float | None]]] = {}
    runs, _ = gpu_runs.load(folder)
    for (model, _cut, _age), group in sorted(runs.items()):
        for d in group:
            sh = d["shape"]
            if model != "gpt200m" or d.get("commit") not in commits or d.get("engine", "direct") != "direct":
                continue
            if any(sh.get(k) != getattr(shape, k) for k in SAME_SHAPE):
                continue
            for mode, row in (d.get("modes") or {}).items():
                ran = (d.get("warmup_steps") or {}).get(mode)
                if "samples_per_s" not in row or row.get("measured_steps") != window:
                    continue
                if ran is not None and ran != (0 if mode == "sync" else warmup):
                    continue
                if gpu_runs.drawn_from(d, mode) != first_prompt(mode, replace(shape, warmup=warmup)):
                    continue  # it drew other prompts than the model's mode (a sync run before the bench aligned it)
                key = (
                    int(sh["max_tokens"]),
                    int(sh["max_trajectory_age_steps"]),
                    sh.get("buffer_order", "start"),
                    mode,
                )
                out.setdefault(key, []).append((float(row["samples_per_s"]), gpu_runs.requests_per_engine_step(row)))
    return out


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ints(ap: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{flag} {text!r}: comma-separated whole numbers, each at least 1")
    if not values or any(v < 1 for v in values):
        ap.error(f"{flag} {text!r}: comma-separated whole numbers, each at least 1")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/handoff_model.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=WORKLOAD, help="a committed handoff JSON with a graph baseline")
    ap.add_argument("--cut", default="8192,32768", help="output-length cuts, comma-separated (default 8192,32768)")
    ap.add_argument("--age", default="1,2,4", help="max_age values, comma-separated (default 1,2,4)")
    ap.add_argument("--order", default="start", help="buffer orders, comma-separated: start, deadline")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--window", type=int, default=3, help="the bench's measured steps (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps of every mode but sync (the bench's 1)")
    ap.add_argument("--steps", type=int, default=30, help="steps of the long run after the warm-up (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="the output lengths' seed (default: the workload run's)")
    ap.add_argument("--host-ms", type=float, default=HOST_MS, help=f"host ms per engine step (default {HOST_MS})")
    ap.add_argument(
        "--host-us-per-request",
        type=float,
        default=0.0,
        help="host us per engine step for each request running, on top of --host-ms (default 0: a fixed host cost); "
        f"--host-ms {HOST_LINE[0]} --host-us-per-request {HOST_LINE[1]} is the line the direct runs before the "
        "first max_age 4 run give",
    )
    ap.add_argument(
        "--kv-ns-per-token",
        type=float,
        default=0.0,
        help="ns per decode step for each context token a running request holds above the workload's mean decode "
        f"context, where the step table is taken (default 0: the table alone); {KV_NS_PER_TOKEN:g} is megatron's "
        "graph decode from 4,096 tokens against 1,715 at ca6c37b",
    )
    ap.add_argument(
        "--kv-credit-below",
        action="store_true",
        help="credit each context token a running request holds below the mean at --kv-ns-per-token too, a step "
        "linear in its context (the graph decode at fb85515 and b1d9af0: 24-43 and 26-30 ns per request-token "
        "from 832 to 1,715 tokens, 21-28 and 21-30 above); needs --kv-ns-per-token",
    )
    ap.add_argument(
        "--graphs",
        choices=GRAPH_SIZINGS,
        default="none",
        help="price each decode step on the captured graph megatron runs it on (it pads a step to the smallest graph "
        "holding it): none (default: at its own batch), default (megatron-core 0.19.2's sizing, the powers of two) "
        "or linear (every 16 requests at 256); a padded row is priced at the graph's step less one request's "
        "attention, from "
        "the table's two contexts (an assumption: needs a table with two) unless --padded-row full",
    )
    ap.add_argument(
        "--padded-row",
        choices=PADDED_ROWS,
        default=None,
        help="with --graphs, what a padded row costs: fixed (default: the graph's fixed work, its step less the "
        "row's attention) or full (as much as a real request: the upper bound)",
    )
    ap.add_argument("--train-us-per-token", type=float, default=TRAIN_US_PER_TOKEN, help="training us per token")
    ap.add_argument(
        "--reprefill-us-per-token",
        type=float,
        default=REPREFILL_US_PER_TOKEN,
        help=f"abort's re-prefill us per token (default {REPREFILL_US_PER_TOKEN})",
    )
    ap.add_argument(
        "--commits",
        default="headline",
        help="the commits whose GPU runs (docs/gpu-runs) are printed beside the model, comma-separated; default: "
        "the performance page's headline (bench/gpu_runs.py: HEADLINE_COMMITS)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "handoff_model.json")
    ap.add_argument("--smoke", action="store_true", help="one small point, for the code path (CPU, a second)")
    args = ap.parse_args(argv)
    prov = provenance()  # when the run starts: its commit and the load it starts under
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes {args.modes!r}: comma-separated, of {', '.join(MODES)}")
    orders = [o.strip() for o in args.order.split(",") if o.strip()]
    if not orders or any(o not in ("start", "deadline") for o in orders):
        ap.error(f"--order {args.order!r}: comma-separated, of start, deadline")
    cuts, ages = _ints(ap, "--cut", args.cut), _ints(ap, "--age", args.age)
    for name in COSTS:
        if why := cost_refusal(name, getattr(args, name)):
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: {why}")
    if why := credit_refusal(args.kv_ns_per_token, args.kv_credit_below):
        ap.error(f"--kv-credit-below with --kv-ns-per-token {args.kv_ns_per_token}: {why}")
    if args.window < 1 or args.steps < args.window or args.warmup < 0:
        ap.error(f"--window {args.window} (>= 1), --steps {args.steps} (>= --window), --warmup {args.warmup} (>= 0)")
    try:
        shape, baseline, seed = load_workload(args.workload)
    except ConfigError as exc:
        ap.error(str(exc))
    seed = seed if args.seed is None else args.seed
    if args.smoke:
        shape = replace(shape, num_prompts_per_step=4, max_active_requests=32)
        cuts, ages, orders = [min(cuts[0], 2048)], [ages[0]], orders[:1]
    if args.padded_row is not None and args.graphs == "none":
        ap.error(f"--padded-row {args.padded_row} prices padding: it needs --graphs default or linear")
    padded_row = args.padded_row or "fixed"
    graphs = decode_graph_sizes(args.graphs, shape.max_active_requests)
    if graphs and padded_row == "fixed" and baseline.attention_at(baseline.context) is None:
        ap.error(f"--graphs {args.graphs}: {args.workload.name}'s graph decode has one context; a padded row's price "
                 "needs two")  # fmt: skip
    seen = measured(RUNS, set(gpu_runs.commits_arg(args.commits)), shape, warmup=args.warmup, window=args.window)
    print(
        f"handoff_model (a model, not a measurement): workload {args.workload.name} ({shape.num_prompts_per_step}x"
        f"{shape.samples_per_group} per step, {shape.max_active_requests} active, lognormal median "
        f"{shape.median_tokens:g} sigma {shape.sigma:g}, seed {seed}); an engine step is the graph decode at its "
        f"batch, linear in the context through {baseline.context} and {baseline.context2} tokens, "
        f"+ {args.host_ms} ms + {args.host_us_per_request} us per request running + {args.kv_ns_per_token} ns per "
        f"context token {'either side of' if args.kv_credit_below else 'above'} the workload's mean decode context; "
        + (
            f"each step priced on megatron's {args.graphs} captured graph holding it {list(graphs)}, a padded row "
            + (
                "at the graph's fixed work (its step less one request's attention); "
                if padded_row == "fixed"
                else "as dear as a real request (long contexts charged for real requests only); "
            )
            if graphs
            else ""
        )
        + "training "
        f"{args.train_us_per_token} us per token; abort's re-prefill "
        f"{args.reprefill_us_per_token} us per token. 'bench window': {args.warmup} "
        f"warm-up step(s) (sync none), then {args.window} measured, as the bench runs; 'long run': {args.steps} "
        f"steps after the warm-up, and the range over its every {args.window} consecutive steps."
    )
    print(
        f"{'cut':>6} {'age':>3} {'order':<8} {'mode':<10} | {'window':>6} {'growth':>6} {'decoding':>8} | {'long':>5} "
        f"{'windows':>11} {'wait':>4} | measured (requests/step)"
    )
    points: list[dict[str, Any]] = []
    for cut in cuts:
        context = workload_context(replace(shape, max_tokens=cut), seed)
        timing = Timing(
            baseline.table_at(context),
            host_ms=args.host_ms,
            host_us_per_request=args.host_us_per_request,
            train_us_per_token=args.train_us_per_token,
            reprefill_us_per_token=args.reprefill_us_per_token,
            kv_ns_per_token=args.kv_ns_per_token,
            kv_from=context,
            kv_credit_below=args.kv_credit_below,
            graphs=graphs,
            padded_row=padded_row,
            pad_row_ms=baseline.attention_at(context) if graphs and padded_row == "fixed" else None,
        )
        for age in ages:
            for order in orders:
                s = replace(shape, max_tokens=cut, max_trajectory_age_steps=age, buffer_order=order)
                point: dict[str, Any] = {
                    "shape": asdict(s), "seed": seed, "decode_context": context, "step_table": timing.table, "modes": {},
                }  # fmt: skip
                for mode in modes:
                    records = run_mode(mode, s, timing, seed=seed, warmup=args.warmup, steps=args.steps)
                    first, long = summarize(mode, records[: args.window]), summarize(mode, records)
                    windows = window_rates(records, args.window)
                    point["modes"][mode] = {
                        "bench_window": asdict(first),
                        "long_run": asdict(long),
                        "window_range": [min(windows), max(windows)],
                        "steps": [asdict(r) for r in records],
                    }
                    got = seen.get((cut, age, order, mode), [])
                    shown = "; ".join(f"{x:.2f}" + (f" ({a:.0f})" if a is not None else "") for x, a in got) or "-"
                    steady = " " if abs(first.buffer_growth) <= MAX_BUFFER_GROWTH else "!"
                    print(
                        f"{cut:>6} {age:>3} {order:<8} {mode:<10} | {first.samples_per_s:>6.2f} "
                        f"{first.buffer_growth:>+5.0%}{steady} {first.mean_decoding:>8.0f} | {long.samples_per_s:>5.2f} "
                        f"{min(windows):>5.2f}-{max(windows):<5.2f} {long.waiting_share:>4.2f} | {shown}"
                    )
                for other in MODES[1:]:
                    if "park" in point["modes"] and other in point["modes"]:
                        a, b = point["modes"]["park"], point["modes"][other]
                        point[f"model_park_over_{other}"] = {  # None: the other mode made nothing in that window
                            k: a[k]["samples_per_s"] / b[k]["samples_per_s"] if b[k]["samples_per_s"] else None
                            for k in ("bench_window", "long_run")
                        }
                ratios = [
                    f"park/{o} {_ratio(point[k]['bench_window'])} in the bench window, {_ratio(point[k]['long_run'])} long"
                    for o in MODES[1:]
                    if (k := f"model_park_over_{o}") in point
                ]
                if ratios:
                    print(f"{'':>31}{'; '.join(ratios)}")
                points.append(point)
    print(f"'!': the bench window made more than {MAX_BUFFER_GROWTH:.0%} more or fewer samples than it trained: the "
          "bench gives no ratio from it")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "provenance": prov,
        "benchmark": "handoff_model",
        "note": "a model, not a measurement: colo-fsm's admission in virtual time, a GPU run's step-time table",
        "workload": args.workload.name,
        "baseline": asdict(baseline),
        "host_ms": args.host_ms,
        "host_us_per_request": args.host_us_per_request,
        "train_us_per_token": args.train_us_per_token,
        "reprefill_us_per_token": args.reprefill_us_per_token,
        "kv_ns_per_token": args.kv_ns_per_token,
        "kv_credit_below": args.kv_credit_below,
        "graphs": args.graphs,
        "decode_graphs": list(graphs),
        "padded_row": padded_row if graphs else None,
        "window": args.window,
        "warmup": args.warmup,
        "steps": args.steps,
        "points": points,
    }
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
