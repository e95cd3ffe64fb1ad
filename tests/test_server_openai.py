"""The OpenAI-compatible server over real HTTP on 127.0.0.1, with the official ``openai`` client: endpoints,
malformed requests, suspend/resume (queued, none lost, none served mid-handoff), 503 + Retry-After."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from functools import partial

import httpx
import openai
import pytest

from colo_fsm.adapters.protocols import Completion
from colo_fsm.errors import ConfigError, EngineRebuild, ServerUnavailable, WaitTimeout
from colo_fsm.server import GatedEngine, OpenAIServer, SuspendGate, overlaps
from colo_fsm.testing.fakes import RecordingEngine
from tests.support import waits


class CheckedGenerator:
    """Echoes prompts after ``delay``; raises if its engine is not awake at the start or the end of a call."""

    def __init__(self, engine: RecordingEngine, delay: float = 0.0) -> None:
        self.engine = engine
        self.delay = delay
        self.hold: threading.Event | None = None  # when set to an Event, every call waits for it
        self.violations: list[str] = []
        self.calls = 0
        self.lock = threading.Lock()

    def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls += 1
        if self.engine.condition != "awake":
            self.violations.append(f"start while {self.engine.condition}")
            raise RuntimeError(f"generate while the engine is {self.engine.condition}")
        if self.hold is not None:
            assert self.hold.wait(30), "held request never released"
        if self.delay:
            time.sleep(self.delay)
        if self.engine.condition != "awake":
            self.violations.append(f"end while {self.engine.condition}")
        return [Completion(f"echo:{p}"[: max_tokens + 5], tuple(range(max_tokens)), 7, "length") for p in prompts]


def _serve():  # type: ignore[no-untyped-def]
    """A served engine with a checked generator, shut down when the caller's fixture ends."""
    engine = RecordingEngine()
    gen = CheckedGenerator(engine, delay=0.02)
    gated = GatedEngine(engine, gen, serve=True, record=True, request_timeout_s=10.0)
    gated.bring_up()
    try:
        yield gated, gen
    finally:
        gated.shutdown()


@pytest.fixture
def served():  # type: ignore[no-untyped-def]
    yield from _serve()


@pytest.fixture(scope="module")
def served_for_refusals():  # type: ignore[no-untyped-def]
    """One server for every case of the malformed-request test: a refused request never reaches its generator
    (each case checks), so the cases cannot see each other."""
    yield from _serve()


wait_until = partial(waits.wait_until, timeout_s=30.0)  # this file's bound


def client(gated: GatedEngine, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gated.server_base_urls()[0], api_key="unused", **kw)


def root(gated: GatedEngine) -> str:
    return gated.server_base_urls()[0].removesuffix("/v1")


# ---------------------------------------------------------------- endpoints
def test_openai_client_endpoints(served) -> None:
    gated, gen = served
    url = gated.server_base_urls()[0]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    c = client(gated)
    r = c.completions.create(model="anything", prompt="hello", max_tokens=3)
    assert r.choices[0].text == "echo:hel" and r.usage.completion_tokens == 3 and r.model == "anything"
    r = c.completions.create(model="m", prompt=["a", "b"], max_tokens=2, n=2)
    assert [ch.text for ch in r.choices] == ["echo:a", "echo:a", "echo:b", "echo:b"]
    chat = c.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=60,
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content.startswith("echo:system: be brief\nuser: hi\nassistant:")
    assert [m.id for m in c.models.list()] == ["colo-fsm"]
    health = httpx.get(root(gated) + "/health").json()
    assert health["status"] == "ok" and health["gate"] == "open" and health["admitted"] == 3


def test_health_reports_lifecycle_state_and_weight_version(served) -> None:
    gated, _ = served
    gated.attach_status(lambda: {"state": "Training", "weight_version": 4})
    gated.gate.close_and_drain(1)
    h = httpx.get(root(gated) + "/health").json()
    assert h["status"] == "handoff" and h["admission"] == "closed" and h["gate"] == "Training"
    assert h["lifecycle_state"] == "Training" and h["weight_version"] == 4
    gated.gate.open()


# ---------------------------------------------------------------- malformed requests
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"model": "m"}, "prompt"),
        ("/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/completions", {"prompt": "x", "max_tokens": "lots"}, "max_tokens"),
        ("/completions", {"prompt": "x", "temperature": 9}, "temperature"),
        ("/completions", {"prompt": "x", "n": 0}, "n"),
        ("/completions", {"prompt": [1, 2, 3]}, "prompt"),
        ("/completions", {"prompt": []}, "prompt"),
        ("/completions", {"prompt": "x", "stream": True}, "stream"),
        ("/completions", [1, 2], "body"),
        ("/chat/completions", {"messages": []}, "messages"),
        ("/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ("/chat/completions", {"messages": [{"content": "x"}]}, "messages.0.role"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0",
        ),
        ("/chat/completions", {"messages": "hi"}, "messages"),
    ],
)
def test_malformed_requests_get_400_naming_the_field(served_for_refusals, path: str, body, param: str) -> None:
    gated, gen = served_for_refusals
    r = httpx.post(gated.server_base_urls()[0] + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["message"].startswith(param)
    assert gen.calls == 0, "a refused request reached the generator"


def test_invalid_json_and_wrong_methods_do_not_crash_the_server(served) -> None:
    gated, _ = served
    base = gated.server_base_urls()[0]
    r = httpx.post(base + "/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body" and "JSON" in r.json()["error"]["message"]
    assert httpx.get(base + "/completions").status_code == 405
    assert httpx.post(base + "/nope", json={}).status_code == 404
    with pytest.raises(openai.BadRequestError) as info:
        client(gated).completions.create(model="m", prompt="x", max_tokens=0)
    assert "max_tokens" in str(info.value)
    assert client(gated).completions.create(model="m", prompt="still up", max_tokens=2).choices


def test_a_failing_generator_gives_500_and_the_server_keeps_serving(served) -> None:
    gated, gen = served
    real = gen.generate
    gen.generate = lambda *a, **k: (_ for _ in ()).throw(ValueError("kv cache exploded"))  # type: ignore[method-assign]
    r = httpx.post(gated.server_base_urls()[0] + "/completions", json={"prompt": "x"})
    assert r.status_code == 500 and "kv cache exploded" in r.json()["error"]["message"]
    gen.generate = real  # type: ignore[method-assign]
    assert httpx.post(gated.server_base_urls()[0] + "/completions", json={"prompt": "x"}).status_code == 200


# ---------------------------------------------------------------- suspend / resume
def test_requests_queue_across_a_suspend_none_lost_none_mid_handoff(served) -> None:
    gated, gen = served
    gen.delay = 0.0
    gen.hold = threading.Event()  # the first 8 requests stay in flight until released
    c = client(gated, max_retries=0)
    pool = concurrent.futures.ThreadPoolExecutor(24)

    def ask(i: int) -> tuple[float, str]:
        r = c.completions.create(model="m", prompt=f"r{i}", max_tokens=4)
        return time.monotonic(), r.choices[0].text

    before = [pool.submit(ask, i) for i in range(8)]  # in flight when the handoff starts
    wait_until(lambda: gen.calls == 8 and gated.gate.in_flight == 8, "8 requests in flight")
    suspender = threading.Thread(target=gated.suspend)  # closes the gate, waits for those 8, then suspends
    suspender.start()
    wait_until(lambda: not gated.gate.is_open, "the gate to close")
    suspender.join(0.2)
    # still waiting for the held requests (a suspend that did not wait would be done by now; one that is
    # merely slow under load still passes)
    assert suspender.is_alive() and engine_condition(gated) == "awake"
    gen.hold.set()
    suspender.join(30)
    assert not suspender.is_alive() and engine_condition(gated) == "suspended"
    assert gen.violations == [] and gated.gate.in_flight == 0
    during = [pool.submit(ask, 100 + i) for i in range(16)]  # arrive while suspended: they wait
    wait_until(lambda: gated.gate.waiting == 16, "16 requests waiting at the gate")
    assert gen.calls == 8  # none of them reached the generator
    resumed_at = time.monotonic()
    gated.resume()
    results = [f.result(timeout=30) for f in before + during]
    pool.shutdown()
    assert [t for _, t in results] == [f"echo:r{i}"[:9] for i in range(8)] + [f"echo:r{100 + i}"[:9] for i in range(16)]
    assert all(done >= resumed_at for done, _ in results[8:])  # queued across the suspend, served after it
    assert gen.violations == []
    assert overlaps(gated.gate.served, gated.gate.closed_periods()) == []
    assert len(gated.gate.served) == 24


def engine_condition(gated: GatedEngine) -> str:
    return gated.inner.condition  # type: ignore[attr-defined]


def test_a_request_waiting_too_long_gets_503_with_retry_after(served) -> None:
    gated, _ = served
    # a second server on the same gate, with a short request timeout
    short = OpenAIServer(gated.generator, gate=gated.gate, request_timeout_s=0.2, retry_after_s=2)
    short.start()
    try:
        gated.suspend()
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            openai.OpenAI(base_url=short.base_url, api_key="x", max_retries=0).completions.create(
                model="m", prompt="x", max_tokens=2
            )
        # it gave up after this server's 0.2 s, not after the 10 s of the gated engine's own server
        assert 0.2 <= time.monotonic() - t0 < gated.request_timeout_s
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "2"
        assert "suspended" in info.value.message
        # the official client honours Retry-After and retries: resumed meanwhile, the request succeeds
        threading.Timer(0.5, gated.resume).start()
        r = openai.OpenAI(base_url=short.base_url, api_key="x", max_retries=3).completions.create(
            model="m", prompt="again", max_tokens=2
        )
        assert r.choices[0].text == "echo:ag"
    finally:
        short.stop()


def test_gated_generate_used_by_the_collector_waits_or_raises() -> None:
    engine = RecordingEngine()
    gated = GatedEngine(engine, CheckedGenerator(engine), request_timeout_s=0.1)
    with pytest.raises(ServerUnavailable):  # not brought up yet: the gate is closed
        gated.generate(["x"], max_tokens=1)
    gated.bring_up()
    assert gated.generate(["x"], max_tokens=1)[0].text == "echo:x"
    assert gated.server_base_urls() == []  # serve=False
    gated.suspend()
    threading.Timer(0.05, gated.resume).start()
    gated.request_timeout_s = 5
    assert gated.generate(["y"], max_tokens=1)[0].text == "echo:y"


def test_suspend_refuses_to_proceed_under_a_request_that_never_ends() -> None:
    """A request inside the gate that does not end makes suspend() raise WaitTimeout after ``drain_timeout_s`` and
    leaves the engine awake. Forced: the request waits on an Event that is set only after the suspend gave up, and
    the suspend starts only once the gate counts it in flight."""
    engine = RecordingEngine()
    gen = CheckedGenerator(engine)
    gen.hold = threading.Event()
    gated = GatedEngine(engine, gen, drain_timeout_s=0.1)
    gated.bring_up()
    t = threading.Thread(target=gated.generate, args=(["slow"],), kwargs={"max_tokens": 1})
    t.start()
    try:
        wait_until(lambda: gated.gate.in_flight == 1, "the request to be in the gate")
        with pytest.raises(WaitTimeout, match="in-flight requests"):
            gated.suspend()
        assert engine.condition == "awake"  # the engine was not suspended under the running request
    finally:
        gen.hold.set()
        t.join(30)
    assert not t.is_alive() and gen.violations == []


def test_server_comes_up_once() -> None:
    engine = RecordingEngine()
    gated = GatedEngine(engine, CheckedGenerator(engine), serve=True)
    gated.bring_up()
    try:
        with pytest.raises(EngineRebuild):
            gated.bring_up()
        with pytest.raises(EngineRebuild):
            gated.server.start()
        assert engine.builds == 1 and len(gated.server_base_urls()) == 1
    finally:
        gated.shutdown()
    assert engine.condition == "torn_down"


def test_bad_settings() -> None:
    engine = RecordingEngine()
    with pytest.raises(ConfigError, match="generator"):
        GatedEngine(engine, object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="port"):
        OpenAIServer(CheckedGenerator(engine), port=70000)
    with pytest.raises(ConfigError, match="retry_after_s"):
        OpenAIServer(CheckedGenerator(engine), retry_after_s=0)
    with pytest.raises(ConfigError, match="poll_s"):
        SuspendGate(poll_s=0)


def test_async_generator_is_awaited_on_the_server_loop() -> None:
    import asyncio

    class AsyncGen:
        def __init__(self) -> None:
            self.active = 0
            self.max_active = 0

        def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
            raise AssertionError("the server must use agenerate")

        async def agenerate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            await asyncio.sleep(0.1)
            self.active -= 1
            return [Completion(p, (0,), 1) for p in prompts]

    gen = AsyncGen()
    server = OpenAIServer(gen)
    server.start()
    try:
        c = openai.OpenAI(base_url=server.base_url, api_key="x")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda i: c.completions.create(model="m", prompt=f"a{i}").choices[0].text, range(8)))
        assert texts == [f"a{i}" for i in range(8)] and gen.max_active >= 2
    finally:
        server.stop()
