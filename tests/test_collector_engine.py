"""The collector over the real continuous-batching MegatronEngine (CPU megatron model): a rollout parked through
a training step finishes after it, its tokens carry both weight versions, the buffer ages it from the oldest,
and the GRPO ratio of each token compares against the log-prob recorded when it was generated."""

from __future__ import annotations

import threading

import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine, to_completion
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
from colo_fsm.collector import AsyncCollector, Prompt, ReplayBuffer, TrajectoryGroup


class _NoEod:
    """The tokenizer with an end-of-document id the model never samples: every request runs to max_tokens."""

    def __init__(self, base: CharTokenizer) -> None:
        self._base = base

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._base, name)

    @property
    def eod(self) -> int:
        return int(self._base.vocab_size)


def test_rollout_parked_through_a_step_spans_two_versions_with_right_ratios(dist1) -> None:  # noqa: F811
    torch.manual_seed(0)
    base = CharTokenizer("0123456789>")
    model = tiny(base)
    version = [0]
    engine = MegatronEngine(model, _NoEod(base), GenerationConfig(), weight_version=lambda: version[0])
    trainer = MegatronTrainer(model, TrainerConfig(lr=5e-2), pad_id=base.pad)
    engine.bring_up()
    four = threading.Event()
    seen: list[int] = []

    def on_token(tok: int, lp: float, wv: int) -> None:
        seen.append(wv)
        if len(seen) == 4:
            four.set()
            # hold the request mid-generation until the handoff's suspend is on its way (ordering, not timing):
            # it is parked through the step on every run, however loaded the machine is
            assert engine._batcher.wait_for_control(60), "no suspend came"

    async def rollout(prompt: Prompt) -> TrajectoryGroup:
        h = engine.submit(base.tokenize(prompt.text), max_tokens=12, temperature=0.0, on_token=on_token)
        c = to_completion(await h.wait())
        return TrajectoryGroup(prompt.prompt_id, prompt.text, (c,), (1.0,), weight_version=c.weight_version)

    buffer = ReplayBuffer(1, 1)
    collector = AsyncCollector(rollout, iter([Prompt("p0", "123>")]), buffer, lambda: version[0], cap=1)
    try:
        collector.resume()
        assert four.wait(30)
        collector.pause()  # park: returns at once, the request stays in the engine
        engine.suspend()  # at a decode-step boundary; the request is parked, not finished
        counts = engine.request_counts()
        assert collector.in_flight == 1 and counts.parked == 1 and counts.running == 0
        prompt_ids = tuple(base.tokenize("123>"))
        trainer.train_step([Rollout(prompt_ids, (3, 4), r, "g") for r in (1.0, 0.0)])  # the weights move
        version[0] = 1
        engine.resume()
        collector.resume()
        (group,) = buffer.sample(1, timeout=30)
        s = collector.stats()
        assert s.spanning == 1 and s.started == s.completed + s.failed + s.deferred + s.in_flight
    finally:
        collector.close()
        engine.shutdown()
    c = group.samples[0]
    assert len(c.token_ids) == 12 and len(c.logprobs) == 12
    assert c.weight_versions == (0,) * 4 + (1,) * 8  # parked after its 4th token, on every run
    assert c.weight_version == 0  # the rollout is recorded with its first token's version (the oldest)
    assert (group.weight_version, group.newest_version, group.age(1)) == (0, 1, 1)  # aged from the oldest
    k = c.weight_versions.index(1)  # the first token of the new weights
    ratio, comp = trainer.importance_ratios(
        [Rollout(prompt_ids, c.token_ids, 1.0, "g", c.logprobs, group.weight_version)]
    )
    r = ratio[0, len(prompt_ids) : len(prompt_ids) + 12]
    assert torch.allclose(r[k:], torch.ones(12 - k), atol=1e-4), r  # on-policy tokens: ratio 1
    assert (r[:k] - 1).abs().max() > 1e-3, r  # tokens of the old weights: against their recorded log-probs
