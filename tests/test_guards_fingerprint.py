"""The fingerprint barrier on real gloo processes (2 and 4 ranks): one divergent rank makes every rank raise
HandoffDivergence within that barrier, naming field, values and ranks; the same program over a plain barrier
passes silently. Plus the in-process (thread) fingerprint barrier and the fingerprint's wire form."""

from __future__ import annotations

import dataclasses
import tempfile
import threading

import pytest

from colo_fsm.errors import HandoffDivergence
from colo_fsm.guards.barrier import SoloBarrier, ThreadBarrier, TorchBarrier
from colo_fsm.guards.decision import CheckpointDecision
from colo_fsm.guards.drain import NoDeviceDrain
from colo_fsm.guards.fingerprint import (
    FIELDS,
    SPEC,
    FieldRule,
    FingerprintField,
    HandoffFingerprint,
    divergence,
    rows_pass,
)
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import State
from colo_fsm.testing.fakes import Journal, ModalEngine, RecordingCollector, RecordingTrainer
from tests.support.procs import rank_context
from tests.support.waits import get_or_fail, join_or_fail

CASES = ("padding", "weight_version", "save")


def _rendezvous() -> str:
    """A file-store address for one process group: no TCP port to pick, so none another test can take between
    picking and binding (a port race once hung this module's ranks on a loaded machine)."""
    return f"file://{tempfile.mkdtemp(prefix='colo-fsm-gloo-')}/store"


class _PlainBarrier:
    """The same gloo barrier, without the fingerprint (what the handoff did before)."""

    exchanges_fingerprints = False

    def __init__(self, inner: TorchBarrier) -> None:
        self.inner = inner

    def wait(self, *, state=None, weight_version=None) -> None:
        self.inner.wait(state=state, weight_version=weight_version)


def _odd_rank(case: str, world: int) -> int:
    return {"padding": world - 1, "weight_version": 0, "save": 1}[case]


def _rank_lifecycle(case: str, rank: int, world: int, barrier) -> tuple[Lifecycle, ModalEngine]:
    """One rank's program: start, one decode step, begin_step. Rank ``_odd_rank`` differs in one way."""
    odd = rank == _odd_rank(case, world)
    j = Journal()
    engine = ModalEngine(j, reset_on_suspend=not (odd and case == "padding"))
    lc = Lifecycle(
        engine,
        RecordingTrainer(j),
        RecordingCollector(j),
        config=LifecycleConfig(
            num_steps=4, rank=rank, world_size=world, start_weight_version=1 if odd and case == "weight_version" else 0
        ),
        drain=NoDeviceDrain("gloo test"),
        barrier=barrier,
        checkpoint=CheckpointDecision(1 if odd and case == "save" else None),
    )
    return lc, engine


def _worker(rank: int, world: int, store: str, out) -> None:
    """One process of a world of ``world``; the program runs over the whole world and over ranks {0, 1}."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        pair = dist.new_group([0, 1])  # every process takes part in creating it
        for n, group in ((world, None), (2, pair)):
            if rank >= n:
                continue
            torch_barrier = TorchBarrier(group, timeout_s=30)
            for case in CASES:
                for kind, barrier in (("fingerprint", torch_barrier), ("plain", _PlainBarrier(torch_barrier))):
                    lc, engine = _rank_lifecycle(case, rank, n, barrier)
                    try:
                        lc.start()  # its barrier already compares step, weight version and mode
                        engine.decode_step(padding=rank == n - 1)  # rank-local padding, as in a real decode step
                        lc.begin_step()
                        out.put((n, rank, case, kind, "passed", lc.state.value))
                    except HandoffDivergence as exc:
                        out.put((n, rank, case, kind, "divergence", (exc.fields, exc.mode, exc.rank, str(exc))))
                    except Exception as exc:  # anything else is a failure of the test
                        out.put((n, rank, case, kind, "error", f"{type(exc).__name__}: {exc}"))
                    lc.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int) -> dict[tuple[int, int, str, str], tuple[str, object]]:
    ctx = rank_context()
    out = ctx.Queue()
    store = _rendezvous()
    procs = [ctx.Process(target=_worker, args=(r, world, store, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    for _ in range((world + 2) * len(CASES) * 2):
        n, rank, case, kind, outcome, payload = get_or_fail(out, 120, "a rank hung at a fingerprint barrier")
        results[(n, rank, case, kind)] = (outcome, payload)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return results


def test_one_divergent_rank_makes_every_rank_raise_within_the_barrier():
    """4 gloo processes: the program over all 4 ranks and over a 2-rank subgroup (one spawn for both)."""
    results = _run(4)
    for world in (4, 2):
        for case in CASES:
            odd = _odd_rank(case, world)
            others = [r for r in range(world) if r != odd]
            for rank in range(world):
                outcome, payload = results[(world, rank, case, "plain")]
                assert (outcome, payload) == ("passed", State.DRAINING.value), (world, case, rank, outcome, payload)
                outcome, payload = results[(world, rank, case, "fingerprint")]
                assert outcome == "divergence", (world, case, rank, outcome, payload)
                fields, mode, err_rank, text = payload
                assert err_rank == rank
                if case == "padding":
                    assert set(fields) == {"mode_digest"}, fields
                    assert mode == {"expert_padding": {False: others, True: [odd]}}, mode
                    assert "expert_padding" in text and f"True on ranks [{odd}]" in text
                elif case == "weight_version":
                    assert fields == {"weight_version": {1: [odd], 0: others}}, fields
                    assert f"1 on ranks [{odd}]" in text
                else:
                    assert fields == {"save": {True: [odd], False: others}}, fields
                    assert "save: " in text


def test_thread_barrier_exchanges_fingerprints_and_names_the_mode_field():
    world = 3
    shared = threading.Barrier(world)
    outcomes: dict[int, object] = {}

    def run(rank: int) -> None:
        lc, engine = _rank_lifecycle("padding", rank, world, ThreadBarrier(shared, rank, timeout_s=10))
        try:
            lc.start()
            engine.decode_step(padding=rank == world - 1)
            lc.begin_step()
            outcomes[rank] = lc.state
        except HandoffDivergence as exc:
            outcomes[rank] = exc.mode

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    join_or_fail(threads, 30, "a rank hung at the thread fingerprint barrier")
    assert outcomes == {r: {"expert_padding": {False: [0, 1], True: [2]}} for r in range(world)}


def test_agreeing_ranks_pass_and_the_wire_form_round_trips():
    fp = HandoffFingerprint("Draining", 3, 3, save=True, validate=False, last=True, mode_digest=2**62 + 5)
    assert HandoffFingerprint.from_ints(fp.to_ints()) == fp
    assert divergence([fp, fp, fp], rank=1) is None
    other = HandoffFingerprint("Draining", 3, 4, save=True, last=True, mode_digest=2**62 + 5)
    err = divergence([fp, other], rank=0)
    assert err is not None and err.fields == {"weight_version": {3: [0], 4: [1]}}
    assert SoloBarrier().wait(state="Draining", fingerprint=fp) is None


# ---------------------------------------------------------------------------------------------- every field
# The cases are derived from the fingerprint's own declaration (SPEC): a field added there is covered here
# without editing this file. Two ranks in two data-parallel replicas keep every rule; each case changes rank
# 1's value of one field only, so as to break that field's rule, and every path must refuse it.


def _replicas() -> list[HandoffFingerprint]:
    """Two ranks of two data-parallel replicas that keep every rule of SPEC."""
    base = HandoffFingerprint(
        "Draining", 3, 3, save=False, validate=True, last=False, mode_digest=11, dp_rank=0, sampling_seed=101
    )
    return [base, dataclasses.replace(base, dp_rank=1, sampling_seed=202)]


def _other(name: str, value):
    if name == "state":
        return next(s.value for s in State if s.value != value)
    return (not value) if isinstance(value, bool) else value + 1


def _broken(spec: FingerprintField) -> list[HandoffFingerprint]:
    """The passing pair with rank 1 changed in ``spec.name`` only, so that its rule breaks."""
    a, b = _replicas()
    mine, theirs = getattr(b, spec.name), getattr(a, spec.name)
    return [a, dataclasses.replace(b, **{spec.name: theirs if mine != theirs else _other(spec.name, mine)})]


def _named(spec: FingerprintField) -> str:
    """The field an error names when ``spec``'s rule breaks (a replica key breaks its per-replica field)."""
    if spec.rule is FieldRule.REPLICA:
        return next(f.name for f in SPEC if f.key == spec.name)
    return spec.name


def test_the_declaration_is_the_wire_form_and_the_passing_pair_passes():
    assert FIELDS == tuple(f.name for f in SPEC) and len(HandoffFingerprint("Draining", 0, 0).to_ints()) == len(SPEC)
    fps = _replicas()
    assert rows_pass([fp.to_ints() for fp in fps]) and divergence(fps, rank=0) is None
    assert {"last", "sampling_seed", "dp_rank"} <= set(FIELDS)


@pytest.mark.parametrize("spec", SPEC, ids=lambda s: s.name)
def test_every_declared_field_is_refused_through_the_wire(spec):
    fps = _broken(spec)
    rows = [fp.to_ints() for fp in fps]
    decoded = [HandoffFingerprint.from_ints(r) for r in rows]
    assert [getattr(d, spec.name) for d in decoded] == [getattr(fp, spec.name) for fp in fps]  # survives the wire
    assert not rows_pass(rows), f"the barrier's fast path lets ranks differing in {spec.name} pass"
    err = divergence(decoded, rank=1)
    assert err is not None, f"ranks differing only in {spec.name} passed"
    assert _named(spec) in err.fields and err.rank == 1, err.fields
    assert f"{_named(spec)}: " in str(err)


@pytest.mark.parametrize("spec", SPEC, ids=lambda s: s.name)
def test_every_declared_field_is_refused_by_the_thread_barrier(spec):
    fps = _broken(spec)
    shared = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            ThreadBarrier(shared, rank, timeout_s=30).wait(state="Draining", weight_version=3, fingerprint=fps[rank])
            outcomes[rank] = "passed"
        except HandoffDivergence as exc:
            outcomes[rank] = exc.fields

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    join_or_fail(threads, 60, f"a rank hung at the thread barrier ({spec.name})")
    for rank in range(2):
        assert isinstance(outcomes.get(rank), dict) and _named(spec) in outcomes[rank], (spec.name, outcomes)


def _field_worker(rank: int, store: str, out) -> None:
    """Every SPEC case over one 2-rank gloo group (a refused exchange leaves the group healthy)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        barrier = TorchBarrier(timeout_s=30)
        for name, fps in [("<passing>", _replicas())] + [(s.name, _broken(s)) for s in SPEC]:
            try:
                barrier.wait(state="Draining", weight_version=3, fingerprint=fps[rank])
                out.put((name, rank, "passed"))
            except HandoffDivergence as exc:
                out.put((name, rank, exc.fields))
            except Exception as exc:  # anything else is a failure of the test
                out.put((name, rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_field_outcomes() -> dict[tuple[str, int], object]:
    ctx = rank_context()
    out = ctx.Queue()
    store = _rendezvous()
    procs = [ctx.Process(target=_field_worker, args=(r, store, out)) for r in range(2)]
    for p in procs:
        p.start()
    results: dict[tuple[str, int], object] = {}
    try:
        for _ in range(2 * (len(SPEC) + 1)):
            name, rank, outcome = get_or_fail(out, 120, "a rank hung at a fingerprint barrier")
            results[(name, rank)] = outcome
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.parametrize("spec", SPEC, ids=lambda s: s.name)
def test_every_declared_field_is_refused_by_the_gloo_barrier(spec, gloo_field_outcomes):
    assert gloo_field_outcomes[("<passing>", 0)] == gloo_field_outcomes[("<passing>", 1)] == "passed"
    for rank in range(2):
        got = gloo_field_outcomes[(spec.name, rank)]
        assert isinstance(got, dict) and _named(spec) in got, (spec.name, rank, got)
