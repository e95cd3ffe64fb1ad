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
from tests.support.holds import FirstRequestHold

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
        assert "out" not in box and engine.request_counts().queued == 0  # never handed to the sleeping engine
        gated.resume()
        t.join(30)
        out = box["out"]
        assert out.choices[0].text == expected  # served by the real engine after resume
        assert out.usage.completion_tokens >= len(expected)
    finally:
        gated.shutdown()
    assert engine.torn_down


class SlowEngine:
    """The real engine whose suspend and resume take real time (like an offload-mode restore); counts requests
    handed to it while it is not awake (must stay 0) and keeps every handle."""

    def __init__(self, engine: MegatronEngine, delay_s: float) -> None:
        self.engine = engine
        self.delay_s = delay_s
        self.tokenizer = engine.tokenizer
        self.max_sequence_length = engine.max_sequence_length
        self.reads_weights_in_place = True
        self.awake = False
        self.asleep_submits = 0
        self.handles: list = []
        self.version = 0
        self.tokens_while_asleep = 0
        self.tokens = 0
        self.hold = FirstRequestHold(lambda t: engine._batcher.wait_for_control(t))  # spans a suspend

    def bring_up(self) -> None:
        self.engine.bring_up()
        self.awake = True

    def suspend(self) -> None:
        self.awake = False
        self.engine.suspend()
        time.sleep(self.delay_s)

    def resume(self) -> None:
        time.sleep(self.delay_s)
        self.version += 1
        self.engine.resume()
        self.awake = True

    def shutdown(self) -> None:
        self.engine.shutdown()

    def server_base_urls(self):
        return []

    def submit(self, prompt_ids, **kw):
        if not self.awake:
            self.asleep_submits += 1
        self.hold.wrap(kw, len(self.handles))
        user = kw.get("on_token")

        def on_token(t, lp, v):
            self.tokens += 1
            if not self.engine.awake:
                self.tokens_while_asleep += 1  # a token generated during a handoff
            return user(t, lp, v) if user is not None else None

        kw["on_token"] = on_token
        h = self.engine.submit(prompt_ids, **kw)
        self.handles.append(h)
        return h


def test_real_engine_parks_http_requests_and_never_gets_one_while_asleep(model):
    import httpx

    slow = SlowEngine(MegatronEngine(model, TOK, weight_version=lambda: slow.version), delay_s=0.3)
    gated = GatedEngine(slow, slow, serve=True, request_timeout_s=60.0)
    gated.bring_up()
    codes: list = []
    stop = threading.Event()

    streamed: list = []

    def hammer():
        with httpx.Client(timeout=60) as h:
            while not stop.is_set():
                r = h.post(
                    gated.server_base_urls()[0] + "/completions",
                    json={"prompt": "12>", "max_tokens": 20, "temperature": 1.0, "logprobs": 0},
                )
                codes.append((r.status_code, r.json()))

    def stream():
        from openai import OpenAI

        c = OpenAI(base_url=gated.server_base_urls()[0], api_key="unused", max_retries=0, timeout=60)
        while not stop.is_set():
            chunks = list(c.completions.create(model="m", prompt="1>", max_tokens=25, temperature=1.0, stream=True))
            streamed.append(("".join(ch.choices[0].text for ch in chunks), chunks[-1].choices[0].token_ids))

    threads = [threading.Thread(target=hammer) for _ in range(3)] + [threading.Thread(target=stream)]
    try:
        for t in threads:
            t.start()
        for _ in range(3):
            deadline = time.monotonic() + 30
            while slow.engine.request_counts().running == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            gated.suspend()  # parks what runs, does not wait for it
            gated.resume()
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        gated.shutdown()
    assert codes and {c for c, _ in codes} == {200}
    assert slow.asleep_submits == 0 and slow.tokens > 0 and slow.tokens_while_asleep == 0
    assert streamed and all(text == TOK.detokenize(ids) for text, ids in streamed)  # paused, continued, whole
    outs = [h.future.result(5) for h in slow.handles if h.future.done() and not h.future.cancelled()]
    assert any(len(set(o.weight_versions)) > 1 for o in outs), "no request was parked across a suspend"
    assert slow.hold.index is not None and slow.hold.failed is None, slow.hold.failed
    held = slow.handles[slow.hold.index].future.result(5)  # the held request: parked by a suspend, finished after it
    assert len(set(held.weight_versions)) > 1, held.weight_versions
    by_ids = {tuple(o.token_ids): tuple(o.logprobs) for o in outs}
    for _, body in codes:
        ch = body["choices"][0]
        assert by_ids[tuple(ch["token_ids"])] == tuple(ch["logprobs"]["token_logprobs"])  # what the engine made


def test_admission_is_read_from_the_spec():
    serving = {s.state for s in LIFECYCLE.states if serving_state(s.state)}
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

    from colo_fsm.states import NEMO_RL

    nemo_serving = {s.state for s in NEMO_RL.states if serving_state(s.state, NEMO_RL)}
    assert nemo_serving == {s.state for s in NEMO_RL.states if s.serves_requests}
    assert State.CONCLUDING not in nemo_serving


def test_top_logprobs_over_the_real_engine_with_the_openai_client(model):
    import openai
    from openai import OpenAI

    from colo_fsm.adapters.megatron.engine import GenerationConfig

    engine = MegatronEngine(model, TOK, GenerationConfig(max_top_logprobs=5))
    gated = GatedEngine(
        engine, engine, serve=True, request_timeout_s=30.0, chat_template=lambda ms: ms[-1]["content"] + ">"
    )
    gated.bring_up()
    name = {t: TOK.detokenize([t], skip_special_tokens=False) for t in range(TOK.vocab_size)}
    try:
        client = OpenAI(base_url=gated.server_base_urls()[0], api_key="unused", max_retries=0, timeout=30.0)
        want = engine.submit(TOK.tokenize("123>"), max_tokens=4, top_logprobs=3).result(60)  # the engine's own
        assert len(want.top_logprobs) == len(want.token_ids) >= 1

        done = client.completions.create(model="m", prompt="123>", max_tokens=4, temperature=0, logprobs=3)
        lp = done.choices[0].logprobs
        assert lp is not None and lp.top_logprobs is not None and len(lp.top_logprobs) == len(want.token_ids)
        for got, tok, top in zip(lp.top_logprobs, want.token_ids, want.top_logprobs):
            assert list(got) == [name[t] for t, _ in top] and next(iter(got)) == name[tok]  # greedy: the likeliest
            assert list(got.values()) == pytest.approx([v for _, v in top], abs=1e-6)
        assert lp.token_logprobs == pytest.approx(list(want.logprobs), abs=1e-6)
        chunks = client.completions.create(
            model="m", prompt="123>", max_tokens=4, temperature=0, logprobs=3, stream=True
        )
        streamed_tops = [
            d
            for ch in chunks
            if ch.choices and ch.choices[0].logprobs
            for d in ch.choices[0].logprobs.top_logprobs or []
        ]
        assert streamed_tops == lp.top_logprobs  # the same alternatives, token by token

        chat = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "123"}],
            max_tokens=4,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content is not None and len(content) == len(want.token_ids)
        for item, tok, top in zip(content, want.token_ids, want.top_logprobs):
            assert item.token == name[tok] and [a.token for a in item.top_logprobs] == [name[t] for t, _ in top[:2]]
            assert [a.logprob for a in item.top_logprobs] == pytest.approx([v for _, v in top[:2]], abs=1e-6)
            assert item.top_logprobs[0].bytes == list(name[top[0][0]].encode())

        streamed = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "123"}],
            max_tokens=4,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
        per_token = [
            [a.token for a in c.top_logprobs]
            for ch in streamed
            if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content
            for c in ch.choices[0].logprobs.content
        ]
        assert per_token == [[a.token for a in item.top_logprobs] for item in content]
        plain = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "1"}], max_tokens=2, logprobs=True
        )
        assert all(c.top_logprobs == [] for c in plain.choices[0].logprobs.content or [])  # type: ignore[union-attr]

        bad = [
            ("completions", {"logprobs": -1}, "logprobs"),
            ("completions", {"logprobs": 6}, "logprobs"),
            ("chat", {"logprobs": True, "top_logprobs": 6}, "top_logprobs"),
            ("chat", {"logprobs": True, "top_logprobs": -2}, "top_logprobs"),
            ("chat", {"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
        ]
        for kind, extra, param in bad:
            with pytest.raises(openai.BadRequestError) as exc:
                if kind == "completions":
                    client.completions.create(model="m", prompt="1>", max_tokens=2, extra_body=extra)
                else:
                    client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "1"}], max_tokens=2, extra_body=extra
                    )
            assert exc.value.param == param, (extra, exc.value.body)
            if "needs" not in str(exc.value):
                assert "[0, 5]" in str(exc.value)  # names the engine's limit
        assert engine.request_counts() == (0, 0, 0)
    finally:
        gated.shutdown()
