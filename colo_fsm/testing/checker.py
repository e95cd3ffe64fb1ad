"""Exhaustive multi-rank checker: every interleaving of N ranks running the declared lifecycle.

Each rank runs the same program (:func:`~colo_fsm.testing.rank_program.plan_program`): the transitions the spec
selects for a run whose latched decisions cover a plain step, a checkpoint step, a validation step, a checkpoint+validation step and the last step (see
:data:`SCENARIOS`). A transition's declared actions run one at a time per rank, in any interleaving across
ranks; ``barrier`` blocks a rank until every rank has arrived. Device asynchrony is modelled: an action whose
spec declares ``issues`` puts that kind of collective work on the rank's own device (device ``rank``, as with
``LOCAL_RANK`` on one node) and it stays in flight until a ``drain_device`` of that device. The device a rank's
drain synchronizes comes from the real drain implementation's :meth:`~colo_fsm.guards.drain.DeviceDrain.
target_device`, so a drain of the calling thread's device is caught. (Work finishing on its own earlier can only
remove work from flight, so keeping it in flight until the drain is the worst case for every property below.)

Properties, checked in every reachable state (a violation is marked with the
:class:`~colo_fsm.states.rules.LifecycleRule` it breaks, :attr:`CheckResult.rule`):

* **one communicator, never interleaved**: no two kinds of collective work in flight at once on any ranks
  (in particular no decode on one rank while another has training or checkpoint work in flight);
* **drain before barrier**: a rank's own device is idle when it arrives at a barrier;
* **no deadlock**: some rank can move until every rank has finished; every run ends in a terminal state;
* per rank, from the program itself: the engine is built once and torn down only on entering a terminal
  state; training and checkpoint work start only with the engine suspended and the collector paused; each step
  bumps the weight version exactly once; nothing resumes after the last step latched.

Breadth-first search with symmetry reduction (ranks 1..N-1 are interchangeable; rank 0 is kept apart because a
drain of the calling thread's device hits device 0), so a violation comes with a shortest counterexample.

Command line: ``python -m colo_fsm.testing.checker --ranks 2..8``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from colo_fsm.errors import ConfigError
from colo_fsm.guards.drain import DeviceDrain
from colo_fsm.states.rules import LifecycleRule, rule_in
from colo_fsm.states.spec import (
    LIFECYCLE,
    Collective,
    LifecycleSpec,
    Role,
)
from colo_fsm.states.validate import check_names
from colo_fsm.testing.rank_program import Op, Program, plan_program
from colo_fsm.testing.scenarios import (
    EXTRA_SCENARIOS,
    SCENARIOS,
    STOP_AT_START_SCENARIOS,
    VAL_AT_START_SCENARIOS,
    StepPlan,
    scenarios_for,
)

R = LifecycleRule


class DrainTarget(Protocol):
    """What the checker needs of a drain: the device index it synchronizes."""

    def target_device(self) -> int: ...


DrainFactory = Callable[[int], DrainTarget]
"""Builds the drain of one rank (its ``LOCAL_RANK``)."""


def real_drain(local_rank: int) -> DrainTarget:
    """The shipped :class:`DeviceDrain` of ``local_rank`` (with a no-op synchronize)."""
    return DeviceDrain(local_rank, synchronize=lambda _device: None)


# ---------------------------------------------------------------------------------------------- search
_KIND_BIT = {k: 1 << i for i, k in enumerate(Collective)}
_PENDING_BIT = 1 << len(Collective)  # an async save's collectives, running on until its finalize (not a drain)
_DEVICE_BITS = _PENDING_BIT - 1


def _kinds(mask: int) -> list[str]:
    kinds = [k.value for k, b in _KIND_BIT.items() if mask & b]
    if mask & _PENDING_BIT and Collective.CHECKPOINT.value not in kinds:
        kinds.append(Collective.CHECKPOINT.value)
    return kinds


def _label(mask: int) -> list[str]:
    out = [k.value for k, b in _KIND_BIT.items() if mask & b]
    if mask & _PENDING_BIT:
        out.append("async checkpoint (not finalized)")
    return out


RankState = tuple[int, bool, int]  # pc, arrived at a barrier, in-flight kinds on this rank's device (bit mask)


@dataclass
class CheckResult:
    """Outcome of one exhaustive check."""

    ranks: int
    scenario: str
    ok: bool
    states: int
    edges: int
    seconds: float
    ops_per_rank: int
    symmetry_reduction: bool
    violation: str | None = None
    counterexample: list[str] = field(default_factory=list)

    @property
    def rule(self) -> LifecycleRule | None:
        """The lifecycle rule the violation breaks (None when ok, or for a deadlock or a stuck run)."""
        return rule_in(self.violation)

    def summary(self) -> str:
        """One line."""
        verdict = "ok" if self.ok else f"VIOLATION: {self.violation}"
        return (
            f"N={self.ranks} {self.scenario}: {self.states} states, {self.edges} transitions, "
            f"{self.seconds:.2f}s, {self.ops_per_rank} actions per rank - {verdict}"
        )

    def report(self) -> str:
        """The summary plus the shortest counterexample, if any."""
        lines = [self.summary()]
        if self.counterexample:
            lines.append("shortest counterexample:")
            lines.extend(f"  {line}" for line in self.counterexample)
        return "\n".join(lines)


class _Search:
    def __init__(self, programs: list[Program], targets: list[int], symmetric: bool) -> None:
        self.programs = programs
        self.ops = [p.ops for p in programs]
        self.targets = targets
        self.n = len(programs)
        self.symmetric = symmetric

    def canon(self, s: tuple[RankState, ...]) -> tuple[RankState, ...]:
        if not self.symmetric:
            return s
        return (s[0], *sorted(s[1:]))

    def moves(self, s: tuple[RankState, ...]) -> list[tuple[int, tuple[RankState, ...], str | None, str]]:
        """Successors: (rank, next state, violation or None, description)."""
        out = []
        for r, (pc, arrived, _mask) in enumerate(s):
            ops = self.ops[r]
            if arrived or pc >= len(ops):
                continue
            op = ops[pc]
            nxt = list(s)
            violation = None
            desc = op.label()
            if op.role is Role.BARRIER:
                own = s[r][2] & _DEVICE_BITS
                if own:
                    violation = R.ONE_COMMUNICATOR.tag(
                        f"rank {r} arrives at a barrier with {', '.join(_kinds(own))} work still in "
                        f"flight on its own device {r} (drain own device before the barrier)"
                    )
                nxt[r] = (pc, True, s[r][2])
                if all(a for _p, a, _m in nxt):  # the last rank arrives: everyone passes
                    met = {q: self.ops[q][p] for q, (p, _a, _m) in enumerate(nxt)}
                    where = {q: (o.transition.dest, o.step) for q, o in met.items()}
                    if violation is None and len(set(where.values())) > 1:
                        violation = R.ONE_COMMUNICATOR.tag(
                            "ranks met at different barriers ("
                            + "; ".join(f"rank {q}: {o.label()}" for q, o in met.items())
                            + "): their handoffs are paired wrongly (a fingerprint barrier raises HandoffDivergence)"
                        )
                    nxt = [(p + 1, False, m) for p, _a, m in nxt]
                    desc += "  (all ranks met: barrier released)"
                else:
                    desc += "  (waits)"
            elif op.role is Role.DRAIN:
                d = self.targets[r]
                nxt[r] = (pc + 1, False, nxt[r][2])
                if 0 <= d < self.n:
                    p, a, m = nxt[d]
                    nxt[d] = (p, a, m & _PENDING_BIT)
                desc += f"  (synchronizes device {d})"
            elif op.issues is not None:
                nxt[r] = (pc + 1, False, s[r][2] | _KIND_BIT[op.issues])
                desc += f"  (puts {op.issues.value} work on device {r})"
            elif op.role is Role.TEARDOWN:
                violation = self.teardown(s, r)
                nxt[r] = (pc + 1, False, s[r][2])
            else:
                nxt[r] = (pc + 1, False, s[r][2])
            if op.pending > 0:
                nxt[r] = (nxt[r][0], nxt[r][1], nxt[r][2] | _PENDING_BIT)
                desc += "  (the save runs on in the background)"
            elif op.pending < 0:
                nxt[r] = (nxt[r][0], nxt[r][1], nxt[r][2] & ~_PENDING_BIT)
                desc += "  (every collective of the save completed)"
            t = tuple(nxt)
            if violation is None:
                violation = self.interleaved(t)
            out.append((r, t, violation, desc))
        return out

    def teardown(self, s: tuple[RankState, ...], r: int) -> str | None:
        """Rank ``r`` tears its engine down: its own device idle (an async save finalized), no peer decoding."""
        own = s[r][2]
        if own:
            return R.ONE_COMMUNICATOR.tag(
                f"rank {r} tears its engine down with {', '.join(_label(own))} work still in flight on its own "
                f"device {r} (drain it, and finalize an async save, first)"
            )
        decoding = [q for q, (_p, _a, m) in enumerate(s) if q != r and m & _KIND_BIT[Collective.DECODE]]
        if decoding:
            return R.ONE_COMMUNICATOR.tag(
                f"rank {r} tears its engine down while rank(s) {decoding} still have decode work in flight (every "
                "rank suspends and drains, then all meet, before any tears down)"
            )
        return None

    def interleaved(self, s: tuple[RankState, ...]) -> str | None:
        union = 0
        for _p, _a, m in s:
            union |= m
        if union & _PENDING_BIT:
            union = (union & _DEVICE_BITS) | _KIND_BIT[Collective.CHECKPOINT]
        if bin(union).count("1") <= 1:
            return None
        by_rank = {r: _kinds(m) for r, (_p, _a, m) in enumerate(s) if m}
        decode = [r for r, ks in by_rank.items() if "decode" in ks]
        heavy = [r for r, ks in by_rank.items() if {"train", "checkpoint"} & set(ks)]
        detail = "; ".join(f"rank {r}: {', '.join(_label(m))}" for r, (_p, _a, m) in enumerate(s) if m)
        if decode and heavy:
            return R.ONE_COMMUNICATOR.tag(
                f"decode in flight on rank(s) {decode} while training/checkpoint collectives are in flight on "
                f"rank(s) {heavy} ({detail})"
            )
        return R.ONE_COMMUNICATOR.tag(f"collectives of different phases in flight on one communicator ({detail})")

    def done(self, s: tuple[RankState, ...]) -> bool:
        return all(p >= len(self.ops[r]) for r, (p, _a, _m) in enumerate(s))

    def deadlock(self, s: tuple[RankState, ...]) -> str:
        parts = []
        for r, (p, a, _m) in enumerate(s):
            ops = self.ops[r]
            parts.append(
                f"rank {r}: " + ("finished" if p >= len(ops) else f"{'waiting at' if a else 'at'} {ops[p].label()}")
            )
        return "deadlock: no rank can move (" + "; ".join(parts) + ")"


def check(
    ranks: int,
    *,
    spec: LifecycleSpec = LIFECYCLE,
    scenario: str = "all-step-kinds",
    steps: Sequence[StepPlan] | None = None,
    rank0_steps: Sequence[StepPlan] | None = None,
    drain_factory: DrainFactory = real_drain,
    symmetry: bool = True,
    max_states: int = 5_000_000,
    val_at_start: bool | None = None,
) -> CheckResult:
    """Explore every interleaving of ``ranks`` ranks running ``spec`` through ``steps`` (or a named scenario).

    ``rank0_steps`` gives rank 0 different latched decisions than the others (a world that did not agree on
    one decision); ``drain_factory(local_rank)`` builds each rank's drain, whose ``target_device()`` is the
    device its ``drain_device`` synchronizes. ``symmetry=False`` turns the symmetry reduction off (it is also
    off when the drain targets would break it).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError("ranks", ranks, "an integer >= 1")
    known = scenarios_for(spec)
    if steps is None and scenario not in known:
        raise ConfigError("scenario", scenario, f"one of {', '.join(known)}")
    if not callable(drain_factory):
        raise ConfigError("drain_factory", drain_factory, "a callable local_rank -> drain with target_device()")
    check_names(spec)  # an unknown state, trigger or action is a SpecError naming the transition
    t0 = time.perf_counter()
    plan = tuple(steps) if steps is not None else known[scenario]
    vas = val_at_start if val_at_start is not None else scenario in VAL_AT_START_SCENARIOS
    sas = steps is None and scenario in STOP_AT_START_SCENARIOS
    others = plan_program(spec, plan, val_at_start=vas, stop_at_start=sas)
    first = plan_program(spec, rank0_steps, val_at_start=vas, stop_at_start=sas) if rank0_steps is not None else others
    programs = [first] + [others] * (ranks - 1)
    targets = [int(drain_factory(r).target_device()) for r in range(ranks)]
    symmetric = all(targets[r] == r for r in range(1, ranks)) or all(
        targets[r] == targets[1] and (targets[1] == 0 or targets[1] >= ranks) for r in range(1, ranks)
    )
    symmetric = symmetry and symmetric and (targets[0] == 0 or targets[0] >= ranks)
    n_ops = max(len(p.ops) for p in programs)
    search = _Search(programs, targets, symmetric)
    init: tuple[RankState, ...] = tuple((0, False, 0) for _ in range(ranks))
    start = search.canon(init)
    parent: dict[tuple[RankState, ...], tuple[RankState, ...] | None] = {start: None}
    queue = deque([start])
    edges = 0
    while queue:
        s = queue.popleft()
        succ = search.moves(s)
        if not succ and not search.done(s):
            return _fail(search, parent, s, None, search.deadlock(s), ranks, scenario, edges, t0, n_ops, init)
        for _r, t, violation, _desc in succ:
            edges += 1
            c = search.canon(t)
            if violation is not None:
                return _fail(search, parent, s, c, violation, ranks, scenario, edges, t0, n_ops, init)
            if c not in parent:
                parent[c] = s
                queue.append(c)
        if len(parent) > max_states:
            raise RuntimeError(f"more than {max_states} states; raise max_states")
    for who, prog in (("rank 0", first), ("every rank", others)):
        if prog.problems:  # the interleavings were fine as far as the program goes; the program itself is not
            return CheckResult(
                ranks,
                scenario,
                False,
                len(parent),
                edges,
                time.perf_counter() - t0,
                n_ops,
                symmetric,
                violation=f"{who}: {prog.problems[0]}",
                counterexample=[f"{i + 1:4}. {who}: {op.label()}" for i, op in enumerate(prog.ops)][-40:]
                + prog.problems,
            )
    return CheckResult(ranks, scenario, True, len(parent), edges, time.perf_counter() - t0, n_ops, symmetric)


def _fail(
    search: _Search,
    parent: dict[Any, Any],
    last: tuple[RankState, ...],
    bad: tuple[RankState, ...] | None,
    violation: str,
    ranks: int,
    scenario: str,
    edges: int,
    t0: float,
    n_ops: int,
    init: tuple[RankState, ...],
) -> CheckResult:
    """Build the shortest trace to ``last`` (then the violating move into ``bad``, if any)."""
    path = [last]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    path.reverse()
    # replay on concrete (unpermuted) states so rank numbers stay consistent along the trace
    lines: list[str] = []
    concrete = init
    steps: list[tuple[tuple[RankState, ...], bool]] = [(c, False) for c in path[1:]]
    if bad is not None:
        steps.append((bad, True))
    for target, violating in steps:
        for r, t, v, desc in search.moves(concrete):
            if search.canon(t) == target and (v is not None) == violating:
                lines.append(f"{len(lines) + 1:4}. rank {r}: {desc}")
                concrete = t
                if v is not None:
                    violation = v  # name the ranks as the trace does
                break
        else:  # pragma: no cover - the canonical path always has a concrete witness
            lines.append("     (trace reconstruction lost the path)")
            break
    if bad is None and not search.moves(concrete) and not search.done(concrete):
        violation = search.deadlock(concrete)
    in_flight = "; ".join(f"device {r}: {', '.join(_label(m)) or 'idle'}" for r, (_p, _a, m) in enumerate(concrete))
    lines.append(f"      in flight: {in_flight}")
    lines.append(f"      VIOLATION: {violation}")
    return CheckResult(
        ranks,
        scenario,
        False,
        len(parent),
        edges,
        time.perf_counter() - t0,
        n_ops,
        search.symmetric,
        violation=violation,
        counterexample=lines,
    )


def check_all(ranks: Sequence[int], *, scenarios: Sequence[str] | None = None, **kwargs: Any) -> list[CheckResult]:
    """:func:`check` for every N in ``ranks`` and every scenario (default: all of :func:`scenarios_for` the spec)."""
    names = scenarios or list(scenarios_for(kwargs.get("spec", LIFECYCLE)))
    return [check(n, scenario=name, **kwargs) for n in ranks for name in names]


def _parse_ranks(text: str) -> list[int]:
    """``'2..8'`` or ``'2,4,8'``; anything else raises ``argparse.ArgumentTypeError`` (a one-line usage error)."""
    try:
        if ".." in text:
            lo, hi = text.split("..", 1)
            values = list(range(int(lo), int(hi) + 1))
        else:
            values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected N >= 1 as '2..8' or '2,4,8', got {text!r}")
    return values


def main(argv: Sequence[str] | None = None, **check_kwargs: Any) -> int:
    """``python -m colo_fsm.testing.checker --ranks 2..8 [--scenario NAME] [--json PATH]``.

    Exit status 0 when every check passes, 1 when one finds a violation (its shortest trace is printed).
    ``check_kwargs`` go to every :func:`check` (a caller checking a modified spec or drain passes them).
    """
    ap = argparse.ArgumentParser(prog="colo-fsm check", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--ranks", default=[2, 3, 4, 5, 6, 7, 8], type=_parse_ranks, help="N values: '2..8' or '2,4,8' (default 2..8)"
    )
    ap.add_argument(
        "--scenario",
        action="append",
        help="run only these scenarios (repeatable; default: all the spec's: "
        f"{', '.join(scenarios_for(LIFECYCLE))}, and more for specs that decide more facts)",
    )
    ap.add_argument(
        "--spec",
        default="lifecycle",
        help="the lifecycle to check: lifecycle (default), nemo_rl, or your own as module:ATTR or path/to/file.py:ATTR",
    )
    ap.add_argument("--json", type=Path, help="also write the results as JSON to this path")
    args = ap.parse_args(argv)
    from colo_fsm.states.presets import resolve_spec
    from colo_fsm.states.validate import validate_spec

    try:
        spec = resolve_spec(check_kwargs.pop("spec", None) or args.spec)
    except ConfigError as exc:
        ap.error(f"argument --spec: {exc}")
    try:
        validate_spec(spec)  # a spec the static rules reject is a violation, before any interleaving is explored
    except ConfigError as exc:
        print(f"spec {spec.name}: {type(exc).__name__}: {exc}")
        print("total: 0 states; 1 violation(s)")
        return 1
    if args.scenario:
        unknown = [n for n in args.scenario if n not in scenarios_for(spec)]
        if unknown:
            ap.error(f"argument --scenario: {', '.join(unknown)} not a scenario of spec {args.spec!r}")
    results = check_all(args.ranks, scenarios=args.scenario, spec=spec, **check_kwargs)
    total_states = sum(r.states for r in results)
    for r in results:
        print(r.report() if not r.ok else r.summary())
    print(
        f"total: {total_states} states in {sum(r.seconds for r in results):.2f}s; "
        f"{sum(not r.ok for r in results)} violation(s)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "EXTRA_SCENARIOS",
    "SCENARIOS",
    "CheckResult",
    "DrainFactory",
    "DrainTarget",
    "Op",
    "Program",
    "StepPlan",
    "check",
    "check_all",
    "main",
    "plan_program",
    "real_drain",
    "scenarios_for",
]
