"""One sampling stream per data-parallel replica, on the real CPU engine: a group's samples differ, replicas draw
different samples for the same seeded call (and one replica reproduces its own), unseeded sampling leaves
torch's global generator alone, and two replicas whose engines share a stream are refused at the first
handoff barrier, naming the field, the replicas and the ranks."""

from __future__ import annotations

import threading

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.errors import ConfigError, HandoffDivergence
from colo_fsm.guards.barrier import ThreadBarrier
from colo_fsm.guards.drain import NoDeviceDrain
from colo_fsm.guards.sampling import SamplingStream, mix_seed, stream_of
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.testing.fakes import Journal, RecordingCollector, RecordingTrainer
from tests.support.waits import join_or_fail

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz>")
PROMPT = "abc>"
GROUP = 4


@pytest.fixture(scope="module")
def model(dist1):  # noqa: F811
    return tiny(TOK)


def _engine(model, dp_rank: int | None) -> MegatronEngine:
    eng = MegatronEngine(model, TOK, GenerationConfig(backend="cpu", sampling_seed=7, data_parallel_rank=dp_rank))
    eng.bring_up()
    return eng


def _group(eng: MegatronEngine, seed: int | None) -> list[tuple[int, ...]]:
    if seed is None:  # unseeded rows share the engine's one generator, in row order per step: admitted together
        eng.suspend()  # so every run batches them alike, whatever the load
        handles = [eng.submit(TOK.tokenize(PROMPT), max_tokens=8, temperature=1.0) for _ in range(GROUP)]
        eng.resume()
        return [h.result(timeout=60).token_ids for h in handles]
    out = eng.generate_ids([TOK.tokenize(PROMPT)] * GROUP, max_tokens=8, temperature=1.0, seed=seed)
    return [c.token_ids for c in out]


def test_the_samples_of_a_group_differ_within_one_engine(model):
    """Many groups (one prompt x GROUP samples per call), seeded and unseeded: no group is one sample repeated."""
    eng = _engine(model, 0)
    try:
        groups = [_group(eng, seed) for seed in range(30)] + [_group(eng, None) for _ in range(15)]
    finally:
        eng.shutdown()
    repeated = [i for i, g in enumerate(groups) if len(set(g)) == 1]
    assert not repeated, f"groups {repeated} are one sample repeated (zero advantage)"
    all_distinct = sum(len(set(g)) == GROUP for g in groups)
    assert all_distinct >= 0.9 * len(groups), f"only {all_distinct} of {len(groups)} groups have {GROUP} distinct"


def test_replicas_draw_different_streams_and_one_replica_reproduces(model):
    before = torch.get_rng_state()
    runs: dict[str, list[list[tuple[int, ...]]]] = {}
    for name, dp in (("dp0", 0), ("dp1", 1), ("dp0-again", 0)):
        eng = _engine(model, dp)
        try:
            assert stream_of(eng) == SamplingStream(7, dp)
            runs[name] = [_group(eng, 5), _group(eng, None)]  # a seeded call, then an unseeded one
        finally:
            eng.shutdown()
    assert runs["dp0"] == runs["dp0-again"], "one replica must reproduce its own draws"
    assert runs["dp0"][0] != runs["dp1"][0], "two replicas drew the same samples for the same seeded call"
    assert runs["dp0"][1] != runs["dp1"][1], "two replicas drew the same unseeded samples"
    assert torch.equal(torch.get_rng_state(), before), "sampling consumed torch's global generator (the trainer's)"


def test_the_stream_mixes_seed_and_replica():
    s0, s1 = SamplingStream(7, 0), SamplingStream(7, 1)
    assert s0.seed != s1.seed and s0.request_seed(5) != s1.request_seed(5) and s0.request_seed(5) != s0.seed
    assert mix_seed(1, 0) != mix_seed(0, 1) and 0 <= mix_seed(2**62, 3) < 2**63
    assert SamplingStream(8, 0).seed != SamplingStream(7, 1).seed  # neighbouring base seeds do not swap streams
    with pytest.raises(ConfigError, match="dp_rank"):
        SamplingStream(7, -1)
    with pytest.raises(ConfigError, match="data_parallel_rank"):
        GenerationConfig(data_parallel_rank=-2)


@pytest.mark.parametrize("engine_dp", [(0, 0), (0, 1)], ids=["one-stream", "own-streams"])
def test_two_replicas_on_one_stream_are_refused_at_the_first_barrier(engine_dp, dist1):  # noqa: F811
    """Two ranks of two data-parallel replicas (the lifecycle's view); their engines told the same DP rank draw
    one stream, and both ranks raise HandoffDivergence at start's barrier; told their own, both start."""
    shared = threading.Barrier(2)
    outcome: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        j = Journal()
        eng = MegatronEngine(
            tiny(TOK), TOK, GenerationConfig(backend="cpu", sampling_seed=7, data_parallel_rank=engine_dp[rank])
        )
        lc = Lifecycle(
            eng,
            RecordingTrainer(j),
            RecordingCollector(j),
            config=LifecycleConfig(num_steps=2, rank=rank, world_size=2, data_parallel_rank=rank),
            drain=NoDeviceDrain("cpu test"),
            barrier=ThreadBarrier(shared, rank, timeout_s=60),
        )
        try:
            lc.start()
            outcome[rank] = lc.state.value
        except HandoffDivergence as exc:
            outcome[rank] = exc
        except Exception as exc:  # anything else fails the test below, with its reason
            outcome[rank] = f"{type(exc).__name__}: {exc}"
        finally:
            lc.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    join_or_fail(threads, 120, "a rank hung at start's barrier")
    if engine_dp == (0, 1):
        assert outcome == {0: "Generating", 1: "Generating"}, outcome
        return
    for rank in range(2):
        err = outcome.get(rank)
        assert isinstance(err, HandoffDivergence), (rank, outcome)
        assert list(err.fields) == ["sampling_seed"], err.fields
        assert err.fields["sampling_seed"] == {SamplingStream(7, 0).seed: [0, 1]}
        assert "dp_rank [0, 1] (ranks [0, 1]) share" in str(err) and err.state == "Starting", str(err)
