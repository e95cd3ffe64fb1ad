"""Which distribution the returned log-probs come from (``logprobs_mode``), and the importance ratio it feeds.

"raw" (default) is the model's untempered softmax; "processed" is the distribution the token was sampled from
(temperature, top-k, top-p applied). At temperature 2 the trainer's ratio is 1 on the step that generated the
tokens only when the behaviour log-probs and the trainer's log-probs are of the same (sampled) distribution.
"""

from __future__ import annotations

import math

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
from colo_fsm.errors import ConfigError

TOK = CharTokenizer("0123456789>")
WAIT = 120


@pytest.fixture(scope="module")
def model(dist1):  # noqa: F811
    torch.manual_seed(4321)
    return tiny(TOK)


def _ratios(model, c, temperature):
    trainer = MegatronTrainer(model, TrainerConfig(temperature=temperature))
    ratios, comp = trainer.importance_ratios([Rollout(c.prompt_ids, c.token_ids, 0.0, 0, c.logprobs)])
    model.eval()
    return ratios[comp].tolist()


def test_at_temperature_2_the_ratio_is_1_with_processed_logprobs_and_a_trainer_at_that_temperature(model):
    eng = MegatronEngine(model, TOK, GenerationConfig(logprobs_mode="processed"))
    eng.bring_up()
    try:
        prompt = TOK.tokenize("3141>")
        proc = eng.submit(prompt, max_tokens=10, temperature=2.0, seed=11).result(timeout=WAIT)
        raw = eng.submit(prompt, max_tokens=10, temperature=2.0, seed=11, logprobs_mode="raw").result(timeout=WAIT)
        assert proc.token_ids == raw.token_ids  # the mode changes what is reported, never what is sampled
        assert proc.logprobs != pytest.approx(raw.logprobs, abs=1e-3)
        assert _ratios(model, proc, 2.0) == pytest.approx([1.0] * len(proc.token_ids), abs=1e-4)
        # the mismatches the option exists for: each side of the ratio from a different distribution
        assert _ratios(model, raw, 2.0) != pytest.approx([1.0] * len(raw.token_ids), abs=1e-3)
        assert _ratios(model, proc, 1.0) != pytest.approx([1.0] * len(proc.token_ids), abs=1e-3)
        assert _ratios(model, raw, 1.0) == pytest.approx([1.0] * len(raw.token_ids), abs=1e-4)
    finally:
        eng.shutdown()


def test_processed_alternatives_are_the_sampled_distribution_and_greedy_is_a_point_mass(model):
    eng = MegatronEngine(model, TOK, GenerationConfig(logprobs_mode="processed"))
    eng.bring_up()
    try:
        prompt = TOK.tokenize("27>")
        c = eng.submit(prompt, max_tokens=6, temperature=1.5, top_k=2, seed=5, top_logprobs=5).result(timeout=WAIT)
        for tok, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
            assert len(top) == 2  # top-k 2: the other tokens cannot be sampled and are not offered
            assert sum(math.exp(v) for _, v in top) == pytest.approx(1.0, abs=1e-5)
            assert dict(top)[tok] == pytest.approx(lp, abs=1e-6)
        greedy = eng.submit(prompt, max_tokens=4).result(timeout=WAIT)
        assert greedy.logprobs == (0.0,) * len(greedy.token_ids)  # sampled from a point mass
        assert eng.submit(prompt, max_tokens=4, logprobs_mode="raw").result(timeout=WAIT).logprobs[0] < 0
    finally:
        eng.shutdown()


def test_logprobs_mode_is_validated_and_the_dynamic_engine_refuses_a_per_request_change(model):
    assert GenerationConfig().logprobs_mode == "raw"
    assert GenerationConfig(logprobs_mode="PROCESSED").logprobs_mode == "processed"
    for bad in ("tempered", None, 1):
        with pytest.raises(ConfigError) as exc:
            GenerationConfig(logprobs_mode=bad)
        assert exc.value.field == "logprobs_mode" and "processed" in str(exc.value)
    eng = MegatronEngine(model, TOK)
    eng.backend_name = "dynamic"  # the refusal is decided before any GPU work
    with pytest.raises(ConfigError) as exc:
        eng._check_logprobs_mode("processed")
    assert exc.value.field == "logprobs_mode" and "'raw'" in str(exc.value)
    eng._check_logprobs_mode("raw")
    eng._check_logprobs_mode(None)
    with pytest.raises(ConfigError):
        TrainerConfig(temperature=0.0)
