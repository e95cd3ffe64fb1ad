"""The OpenAI-compatible server over the REAL megatron-core engine on the CPU (tiny GPT), with the ``openai``
client: a request made while the engine is suspended waits at the gate and is served after resume, with
the text the engine itself generates; admission is read from the lifecycle spec."""

from __future__ import annotations

import threading
import time

import pytest
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron.engine import MegatronEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.server import GatedEngine
from colo_fsm.server.server import admit_while_serving, serving_state
from colo_fsm.states.spec import LIFECYCLE, EngineCondition, State

TOK = CharTokenizer("0123456789>")


@pytest.fixture(scope="module")
def model(dist1):  # noqa: F811
    return tiny(TOK)


def test_openai_client_across_a_suspend_of_the_real_engine(model):
    from openai import OpenAI

    engine = MegatronEngine(model, TOK, weight_version=lambda: 7)
    gated = GatedEngine(engine, engine, serve=True, request_timeout_s=30.0, model_name="tiny")
    gated.bring_up()
    try:
        (base,) = gated.server_base_urls()
        assert base.startswith("http://127.0.0.1:")
        client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30.0)
        expected = engine.generate(["123>"], max_tokens=4, temperature=0.0)[0].text  # the engine's own greedy text
        first = client.completions.create(model="tiny", prompt="123>", max_tokens=4, temperature=0.0)
        assert first.choices[0].text == expected

        gated.suspend()  # gate closed and drained, then the real engine suspended
        assert not engine.awake
        box: dict = {}

        def call():
            box["t0"] = time.monotonic()
            box["out"] = client.completions.create(model="tiny", prompt="123>", max_tokens=4, temperature=0.0)
            box["t1"] = time.monotonic()

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while gated.gate.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gated.gate.waiting == 1 and "out" not in box  # it waits: nothing decodes while suspended
        time.sleep(0.3)
        assert "out" not in box and engine.generate_calls == 2
        t_resume = time.monotonic()
        gated.resume()
        t.join(30)
        out = box["out"]
        assert out.choices[0].text == expected  # served by the real engine after resume
        assert box["t1"] >= t_resume and out.usage.completion_tokens >= len(expected)
        assert engine.generate_calls == 3
    finally:
        gated.shutdown()
    assert engine.torn_down


def test_admission_is_read_from_the_spec():
    serving = {s for s in State if serving_state(s)}
    assert (
        serving
        == {s.state for s in LIFECYCLE.states if s.resting and s.engine is EngineCondition.AWAKE}
        == {State.GENERATING, State.VALIDATING}
    )

    class Lc:
        state = State.DRAINING
        spec = LIFECYCLE

    lc = Lc()
    admit = admit_while_serving(lc)
    assert admit() is False
    lc.state = State.GENERATING
    assert admit() is True
    lc.state = State.STARTING  # engine awake but a handoff is still running: not resting
    assert admit() is False
