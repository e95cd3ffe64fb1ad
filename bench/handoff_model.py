"""A model of the handoff modes in virtual time: what park, drain and sync should make of a workload, on the CPU.

    python bench/handoff_model.py                                  # the committed H200 runs' workload, cuts and ages
    python bench/handoff_model.py --cut 32768 --age 4 --steps 20   # one point of the map
    python bench/handoff_model.py --smoke                          # the code path in a second

The bench (``bench/inflight_handoff.py``) measures; this predicts, so that a GPU session knows what to expect
of a stage before it spends device time on it, and so that a measured figure can be told apart from a model of
it. Everything the modes decide comes from colo-fsm itself: admission is :class:`~colo_fsm.collector.ReplayBuffer`
(``reserve``/``put``/``ready``/``sample``, start order) and :class:`~colo_fsm.guards.capacity.InFlightCap`, as
the bench's collector uses them; the output lengths are the bench's own draws (``output_length``). What is
modelled: time. An engine step decodes one token of every running request and takes the pure CUDA-graph
decode's time at that batch (interpolated from a committed run's ``graph_decode`` rows) plus a fixed host cost
per step; a training step takes a fixed cost per trained token; prefill, handoffs and threads cost nothing.

Each mode runs its warm-up steps, then its measured steps; samples/s is the samples of the groups finished
inside the measured window over its length, as the bench counts them. It writes JSON (``--out``) and prints a
table. A model is not evidence (the docs' rule): its figures are quoted as predictions, beside the measured
ones where they exist.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._handoff import MAX_BUFFER_GROWTH  # noqa: E402  (after the sys.path line above)
from bench.inflight_handoff import Shape, output_length  # noqa: E402
from colo_fsm.adapters.protocols import Completion  # noqa: E402
from colo_fsm.collector import ReplayBuffer, TrajectoryGroup  # noqa: E402
from colo_fsm.errors import ConfigError  # noqa: E402
from colo_fsm.guards.capacity import InFlightCap  # noqa: E402

RUNS = ROOT / "docs" / "gpu-runs"
WORKLOAD = RUNS / "2026-12-02-h200-reasoning-cut8192-drain-sync-791d078.json"
"""The committed run whose workload shape and graph baseline (from the workload's mean context) the model uses."""
HOST_MS = 1.06
"""Host time per engine step outside megatron's step: park's, measured at the 8,192 cut (``reasoning-8k``)."""
TRAIN_US_PER_TOKEN = 12.8
"""Training time per trained token (prompt + output): park's Training time at the 8,192 cut over its tokens."""
MODES = ("park", "drain", "sync")


@dataclass
class Timing:
    """What a step costs in the model: engine steps from a table of (batch, ms), training per token."""

    table: list[tuple[int, float]]
    host_ms: float = HOST_MS
    train_us_per_token: float = TRAIN_US_PER_TOKEN

    def __post_init__(self) -> None:
        if not self.table or any(b <= 0 or ms <= 0 for b, ms in self.table):
            raise ConfigError("table", self.table, "one or more (batch > 0, ms > 0) rows")
        self.table = sorted(self.table)
        if self.host_ms < 0:
            raise ConfigError("host_ms", self.host_ms, "a non-negative number of milliseconds")
        if self.train_us_per_token < 0:
            raise ConfigError("train_us_per_token", self.train_us_per_token, "a non-negative number of microseconds")

    def step_s(self, batch: int) -> float:
        """One engine step at ``batch`` running requests: the table, linear between rows and past its ends."""
        xs = [b for b, _ in self.table]
        ys = [ms for _, ms in self.table]
        if len(xs) == 1:
            ms = ys[0]
        else:
            k = min(max(bisect.bisect_left(xs, batch), 1), len(xs) - 1)
            (x0, y0), (x1, y1) = self.table[k - 1], self.table[k]
            ms = y0 + (y1 - y0) * (batch - x0) / (x1 - x0)
        return (max(ms, ys[0] * 0.5) + self.host_ms) / 1000.0


@dataclass
class _Group:
    index: int
    ticket: Any
    version: int
    left: list[int]  # tokens still to decode, one per sample (0: finished)
    tokens: int  # prompt + output tokens of every sample: what training it costs


@dataclass
class ModeResult:
    """One mode's prediction over its measured window."""

    mode: str
    samples_per_s: float
    measured_steps: int
    measured_s: float
    made: int
    trained: int
    mean_decoding: float  # running requests per engine step, averaged over steps
    generating_share: float
    training_share: float
    waiting_share: float  # draining (drain); no mode idles otherwise in this model
    step_s: list[float] = field(default_factory=list)
    made_per_step: list[int] = field(default_factory=list)

    @property
    def buffer_growth(self) -> float:
        """Samples made over samples trained, minus one: the bench's steady-state measure (``MAX_BUFFER_GROWTH``)."""
        return self.made / self.trained - 1.0 if self.trained else 0.0

    def window_rates(self, width: int) -> list[float]:
        """samples/s of every run of ``width`` consecutive measured steps: what one bench window could have seen."""
        n = len(self.step_s)
        return [
            sum(self.made_per_step[i : i + width]) / sum(self.step_s[i : i + width])
            for i in range(n - width + 1)
            if sum(self.step_s[i : i + width]) > 0
        ]


class _Sim:
    """One mode's run: a virtual clock, the collector's admission, the engine's running requests, the trainer."""

    def __init__(self, shape: Shape, timing: Timing, seed: int) -> None:
        self.shape, self.timing, self.seed = shape, timing, seed
        self.buffer = ReplayBuffer(shape.num_prompts_per_step, shape.max_trajectory_age_steps, order=shape.buffer_order)
        self.cap = InFlightCap(
            shape.num_prompts_per_step, shape.max_trajectory_age_steps, samples_per_group=shape.samples_per_group
        ).value
        self.t = 0.0
        self.version = 0
        self.next_prompt = 0
        self.groups: list[_Group] = []  # in flight, in start order
        self.made = 0  # samples of finished groups
        self.trained = 0
        self.steps_run = 0
        self.decode_steps = 0
        self.decoding_sum = 0
        self.time = {"generating": 0.0, "training": 0.0, "waiting": 0.0}

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
            tokens = sum(lengths) + self.shape.prompt_len * len(lengths)
            self.groups.append(_Group(i, ticket, self.version, lengths, tokens))
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
        for g, j in run:
            g.left[j] -= k
        dt = k * self.timing.step_s(len(run))
        self.t += dt
        self.time[bucket] += dt
        self.decode_steps += k
        self.decoding_sum += k * len(run)
        for g in [g for g in self.groups if not any(g.left)]:
            self.groups.remove(g)
            done = Completion(text="", token_ids=(), weight_version=g.version)
            group = TrajectoryGroup(
                f"p{g.index}", "", (done,) * len(g.left), (0.0,) * len(g.left), g.version,
                newest_weight_version=self.version, metadata={"tokens": g.tokens},
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

    # the modes: one training step each
    def step(self, mode: str) -> None:
        if mode == "sync":  # the whole batch, tail included, then train
            self.admit(limit=self.shape.num_prompts_per_step)
            while not self.ready():
                self.decode("generating")
        else:  # the collector admits as soon as the engine generates again, before the trainer's next handoff
            self.admit()
            while not self.ready():
                self.decode("generating")
                self.admit()
            if mode == "drain":  # nothing starts while draining; every request in flight finishes first
                while self.groups:
                    self.decode("waiting")
        self.train()
        self.steps_run += 1


def run_mode(mode: str, shape: Shape, timing: Timing, *, seed: int, warmup: int, steps: int) -> ModeResult:
    """One mode: ``warmup`` steps (sync: none), then ``steps`` measured, as the bench counts them."""
    if mode not in MODES:
        raise ConfigError("mode", mode, f"one of {', '.join(MODES)}")
    if steps < 1:
        raise ConfigError("steps", steps, "at least 1 measured step")
    sim = _Sim(shape, timing, seed)
    for _ in range(0 if mode == "sync" else warmup):
        sim.step(mode)
    t0, made0, trained0 = sim.t, sim.made, sim.trained
    times0 = dict(sim.time)
    steps0, decoding0 = sim.decode_steps, sim.decoding_sum
    per_step, made = [], []
    for _ in range(steps):
        t, m = sim.t, sim.made
        sim.step(mode)
        per_step.append(sim.t - t)
        made.append(sim.made - m)
    window = sim.t - t0
    share = {k: (sim.time[k] - times0[k]) / window for k in sim.time}
    n = sim.decode_steps - steps0
    return ModeResult(
        mode=mode,
        samples_per_s=(sim.made - made0) / window,
        measured_steps=steps,
        measured_s=window,
        made=sim.made - made0,
        trained=sim.trained - trained0,
        mean_decoding=(sim.decoding_sum - decoding0) / n if n else 0.0,
        generating_share=share["generating"],
        training_share=share["training"],
        waiting_share=share["waiting"],
        step_s=per_step,
        made_per_step=made,
    )


def load_workload(path: Path) -> tuple[Shape, list[tuple[int, float]], int]:
    """A committed run's shape, its graph baseline from the workload's mean context (else its plain rows), its seed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError("--workload", str(path), f"a readable bench/inflight_handoff.py JSON ({exc})") from exc
    if not isinstance(data, dict) or "shape" not in data:
        raise ConfigError("--workload", str(path), "a bench/inflight_handoff.py JSON (it has no 'shape')")
    g = data.get("graph_decode") or {}
    rows = g.get("rows_matched_context") or g.get("rows")
    if not rows:
        raise ConfigError("--workload", str(path), "a run with a graph baseline ('graph_decode' rows)")
    return Shape(**data["shape"]), [(int(r["batch"]), float(r["step_ms"])) for r in rows], int(data.get("seed", 0))


def measured(folder: Path, commits: set[str]) -> dict[tuple[int, int, str, str], list[tuple[float, float | None]]]:
    """The committed GPU runs of ``commits`` (gpt200m, direct engine): ``(cut, age, order, mode)`` -> every
    run's (samples/s, requests per decode-only graph step), to print beside the model's figures."""
    out: dict[tuple[int, int, str, str], list[tuple[float, float | None]]] = {}
    for path in sorted(folder.glob("*reasoning*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or d.get("commit") not in commits or d.get("model") != "gpt200m":
            continue
        if d.get("engine", "direct") != "direct" or "shape" not in d:
            continue
        sh = d["shape"]
        for mode, row in (d.get("modes") or {}).items():
            if "samples_per_s" not in row or row.get("measured_steps", 0) < 3:
                continue
            prof = (row.get("engine_step_profile_per_round") or [{}])[0].get("decode_graph") or {}
            key = (int(sh["max_tokens"]), int(sh["max_trajectory_age_steps"]), sh.get("buffer_order", "start"), mode)
            out.setdefault(key, []).append((float(row["samples_per_s"]), prof.get("mean_active")))
    return out


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
    ap.add_argument("--modes", default="park,drain,sync", help="comma-separated, of park, drain, sync")
    ap.add_argument("--window", type=int, default=3, help="the bench's measured steps (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps of park and drain (the bench's 1)")
    ap.add_argument("--steps", type=int, default=30, help="steps of the long run after the warm-up (default 30)")
    ap.add_argument("--host-ms", type=float, default=HOST_MS, help=f"host ms per engine step (default {HOST_MS})")
    ap.add_argument("--train-us-per-token", type=float, default=TRAIN_US_PER_TOKEN, help="training us per token")
    ap.add_argument("--commits", default="6bd92a8,791d078", help="GPU runs to print beside the model (docs/gpu-runs)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "handoff_model.json")
    ap.add_argument("--smoke", action="store_true", help="one small point, for the code path (CPU, a second)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes {args.modes!r}: comma-separated, of {', '.join(MODES)}")
    orders = [o.strip() for o in args.order.split(",") if o.strip()]
    if not orders or any(o not in ("start", "deadline") for o in orders):
        ap.error(f"--order {args.order!r}: comma-separated, of start, deadline")
    cuts, ages = _ints(ap, "--cut", args.cut), _ints(ap, "--age", args.age)
    if args.window < 1 or args.steps < args.window or args.warmup < 0:
        ap.error(f"--window {args.window} (>= 1), --steps {args.steps} (>= --window), --warmup {args.warmup} (>= 0)")
    try:
        shape, table, seed = load_workload(args.workload)
        timing = Timing(table, host_ms=args.host_ms, train_us_per_token=args.train_us_per_token)
    except ConfigError as exc:
        ap.error(str(exc))
    if args.smoke:
        shape = replace(shape, num_prompts_per_step=4, max_active_requests=32)
        cuts, ages, orders = [min(cuts[0], 2048)], [ages[0]], orders[:1]
    seen = measured(RUNS, {c.strip() for c in args.commits.split(",") if c.strip()})
    print(
        f"handoff_model (a model, not a measurement): workload {args.workload.name} ({shape.num_prompts_per_step}x"
        f"{shape.samples_per_group} per step, {shape.max_active_requests} active, lognormal median "
        f"{shape.median_tokens:g} sigma {shape.sigma:g}); an engine step is the graph decode at its batch "
        f"({', '.join(f'{b}:{ms:.2f}' for b, ms in timing.table)} ms) + {timing.host_ms} ms; training "
        f"{timing.train_us_per_token} us per token. 'bench window': {args.warmup} warm-up step(s) (sync none), then "
        f"{args.window} measured, as the bench runs; 'long run': {args.steps} steps after the warm-up, and the range "
        f"over its every {args.window} consecutive steps."
    )
    head = (
        f"{'cut':>6} {'age':>3} {'order':<8} {'mode':<5} | {'window':>6} {'growth':>6} | {'long':>5} "
        f"{'windows':>11} {'decoding':>8} {'wait':>4} | measured (decoding)"
    )
    print(head)
    points: list[dict[str, Any]] = []
    for cut in cuts:
        for age in ages:
            for order in orders:
                s = replace(shape, max_tokens=cut, max_trajectory_age_steps=age, buffer_order=order)
                point: dict[str, Any] = {"cut": cut, "max_age": age, "order": order, "modes": {}}
                for mode in modes:
                    r = run_mode(mode, s, timing, seed=seed, warmup=args.warmup, steps=args.steps)
                    first = run_mode(mode, s, timing, seed=seed, warmup=args.warmup, steps=args.window)
                    windows = r.window_rates(args.window)
                    row = {
                        "bench_window": {**vars(first), "buffer_growth": first.buffer_growth},
                        "long_run": {**vars(r), "buffer_growth": r.buffer_growth},
                        "window_range": [min(windows), max(windows)],
                    }
                    point["modes"][mode] = row
                    got = seen.get((cut, age, order, mode), [])
                    shown = "; ".join(f"{x:.2f}" + (f" ({a:.0f})" if a is not None else "") for x, a in got) or "-"
                    steady = "" if abs(first.buffer_growth) <= MAX_BUFFER_GROWTH else "!"
                    print(
                        f"{cut:>6} {age:>3} {order:<8} {mode:<5} | {first.samples_per_s:>6.2f} "
                        f"{first.buffer_growth:>+5.0%}{steady or ' '} | {r.samples_per_s:>5.2f} "
                        f"{min(windows):>5.2f}-{max(windows):<5.2f} {first.mean_decoding:>8.0f} {r.waiting_share:>4.2f} "
                        f"| {shown}"
                    )
                for other in ("drain", "sync"):
                    if "park" in point["modes"] and other in point["modes"]:
                        a, b = point["modes"]["park"], point["modes"][other]
                        point[f"model_park_over_{other}"] = {
                            "bench_window": a["bench_window"]["samples_per_s"] / b["bench_window"]["samples_per_s"],
                            "long_run": a["long_run"]["samples_per_s"] / b["long_run"]["samples_per_s"],
                        }
                ratios = [
                    f"park/{o} {point[k]['bench_window']:.2f} in the bench window, {point[k]['long_run']:.2f} long"
                    for o in ("drain", "sync")
                    if (k := f"model_park_over_{o}") in point
                ]
                if ratios:
                    print(f"{'':>26}{'; '.join(ratios)}")
                points.append(point)
    print(f"'!': the bench window made more than {MAX_BUFFER_GROWTH:.0%} more or fewer samples than it trained: the "
          "bench gives no ratio from it (a longer --warmup fills the pipeline first)")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "handoff_model",
        "note": "a model, not a measurement: colo-fsm's admission in virtual time, a GPU run's step-time table",
        "workload": args.workload.name,
        "shape": asdict(shape),
        "timing": {"table": timing.table, "host_ms": timing.host_ms, "train_us_per_token": timing.train_us_per_token},
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
