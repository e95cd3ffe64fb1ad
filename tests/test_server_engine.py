"""The server over a request-level engine (a small fake of the engine contract; the real one is in
test_server_megatron.py): token ids, logprobs, stop, n, streaming, parking across a suspend, cancellation on
disconnect, 400 naming every unsupported parameter, OpenAI's error shape, /health, /tokenize, /v1/responses."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import httpx
import openai
import pytest
from _server_fake import FakeEngine, Hold, serve_fake

from colo_fsm.errors import WaitTimeout
from colo_fsm.server import OnPolicy, ServerSettings
from colo_fsm.server.runner import SERVER_PRIORITY
from tests.support.waits import wait_until

WAIT = 10.0  # a bound on what must happen, never a margin: a test waits this long only when it fails


@pytest.fixture
def served():
    gated, eng = serve_fake(request_timeout_s=10.0)
    yield gated, eng
    gated.shutdown()


@pytest.fixture(scope="module")
def served_for_refusals():
    """One server for every case of the 400 test: a refused request never reaches its engine (each case checks),
    so the cases cannot see each other."""
    gated, eng = serve_fake(request_timeout_s=10.0)
    yield gated, eng
    gated.shutdown()


def base(gated) -> str:  # type: ignore[no-untyped-def]
    return gated.server_base_urls()[0]


def root(gated) -> str:  # type: ignore[no-untyped-def]
    return base(gated).removesuffix("/v1")


def client(gated) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=base(gated), api_key="unused", max_retries=0)


def suspend_over(gated, hold: Hold, held: str) -> None:  # type: ignore[no-untyped-def]
    """``gated.suspend()`` while ``held`` is held in the engine (``hold``): it cannot finish before the test lets it
    go, so a suspend that waited for it (drained, not parked) would wait for ever; bounded, it fails here (letting
    the request go first, so the test's threads can end)."""
    gated.drain_timeout_s = WAIT
    try:
        gated.suspend()
    except WaitTimeout:
        hold.release.set()
        pytest.fail(f"the suspend waited for {held} (drained, not parked)")


def test_completions_token_ids_logprobs_match_the_engine(served) -> None:
    gated, eng = served
    tok = eng.tokenizer
    r = httpx.post(
        base(gated) + "/completions",
        json={"prompt": "123>", "max_tokens": 8, "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True},
    ).json()
    c = r["choices"][0]
    assert c["text"] == "321" and c["finish_reason"] == "stop"
    assert c["prompt_token_ids"] == tok.tokenize("123>")
    ids, lps = eng.generated[max(eng.generated)]
    assert c["token_ids"] == ids and c["logprobs"]["token_logprobs"] == lps
    assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    assert eng.submitted[-1][1] == int(SERVER_PRIORITY)  # HTTP traffic below the trainer's rollouts
    # a prompt given as token ids, and several of them
    r2 = httpx.post(
        base(gated) + "/completions", json={"prompt": [tok.tokenize("45>"), tok.tokenize("6>")], "temperature": 0}
    ).json()
    assert [c["text"] for c in r2["choices"]] == ["54", "6"]
    assert r2["usage"]["prompt_tokens"] == 5


def test_openai_client_stop_n_logprobs_and_chat(served) -> None:
    gated, _ = served
    c = client(gated)
    out = c.completions.create(model="m", prompt="555>", stop="5", max_tokens=5, temperature=0)
    assert out.choices[0].text == "" and out.choices[0].finish_reason == "stop"
    out = c.completions.create(model="m", prompt="123>", stop=["2"], max_tokens=5, temperature=0, n=3, logprobs=0)
    assert [ch.text for ch in out.choices] == ["3"] * 3
    assert out.usage.prompt_tokens == 4  # once, not times n
    assert out.choices[0].logprobs.token_logprobs and len(out.choices[0].logprobs.tokens) == 2
    chat = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "12>"}], logprobs=True, top_logprobs=0, max_tokens=6
    )
    assert chat.choices[0].logprobs.content and chat.choices[0].logprobs.content[0].logprob < 0


def test_streaming_spans_a_suspend_pauses_and_continues(served) -> None:
    """A stream started before a suspend sends tokens of weight version 0, pauses while the engine is suspended, and
    goes on with version 1 after the resume. Forced: the engine holds the request after its 2nd token (of 10) until
    the suspend has returned, so it cannot finish under the old weights however slow the test thread is."""
    gated, eng = served
    c = client(gated)
    want = c.completions.create(model="m", prompt="123456789>", max_tokens=12, temperature=0).choices[0].text
    hold = eng.hold_at(2)
    stream = c.completions.create(model="m", prompt="123456789>", max_tokens=12, temperature=0, stream=True)
    chunks, got_first = [], threading.Event()

    def read() -> None:
        for chunk in stream:
            chunks.append(chunk.choices[0])
            got_first.set()

    t = threading.Thread(target=read)
    t.start()
    assert hold.reached.wait(WAIT), "the streamed request never made its 2nd token"
    assert got_first.wait(WAIT), "no chunk came before the suspend"
    suspend_over(gated, hold, "the streamed request")  # the request is parked in the engine, not waited for
    hold.release.set()  # the engine is asleep: the request stays parked until the resume
    time.sleep(0.2)  # room for a token while asleep to show (none may)
    assert eng.tokens_while_asleep == 0  # no token during the handoff
    gated.resume()
    t.join(20)
    assert "".join(ch.text for ch in chunks) == want
    assert chunks[-1].finish_reason == "stop" and set(chunks[-1].weight_versions) == {0, 1}  # paused, continued
    chat = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "98"}], stream=True, temperature=0
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chat if ch.choices) == "89"


def test_park_suspend_does_not_wait_and_answers_after_resume() -> None:
    """A suspend does not wait for a running HTTP request: it is parked in the engine, unanswered while suspended,
    and answered after the resume with tokens of both weight versions. Forced: the engine holds the request after
    its 2nd token (of 6) until the suspend has returned, so it cannot finish before it."""
    gated, eng = serve_fake(FakeEngine())
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool, eng.hold_at(2) as hold:
            fut = pool.submit(
                httpx.post,
                base(gated) + "/completions",
                json={"prompt": "12345>", "max_tokens": 8, "temperature": 0},
                timeout=30,
            )
            assert hold.reached.wait(WAIT), "the request never made its 2nd token"
            suspend_over(gated, hold, "the HTTP request")
            assert not fut.done()
            hold.release.set()  # the engine is asleep: the request stays parked until the resume
            time.sleep(0.2)
            assert not fut.done()  # parked: no answer while suspended
            gated.resume()
            r = fut.result(20).json()["choices"][0]
        assert r["text"] == "54321" and r["weight_versions"][0] == 0 and r["weight_versions"][-1] == 1
    finally:
        gated.shutdown()


def test_drain_option_waits_for_admitted_requests() -> None:
    gated, eng = serve_fake(FakeEngine(step_s=0.03), inflight="drain")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fut = pool.submit(
                httpx.post,
                base(gated) + "/completions",
                json={"prompt": "12345>", "max_tokens": 8, "temperature": 0},
                timeout=30,
            )
            wait_until(lambda: eng.steps > 1, "the request to start")
            gated.suspend()
            assert len(eng.generated) == 1  # drained: it finished before the engine was suspended
            r = fut.result().json()["choices"][0]
            gated.resume()
        assert set(r["weight_versions"]) == {0}
    finally:
        gated.shutdown()


def test_a_request_is_never_handed_to_an_engine_that_is_not_awake() -> None:
    gated, eng = serve_fake(FakeEngine(step_s=0.002, suspend_s=0.3, resume_s=0.3), request_timeout_s=30.0)
    stop = threading.Event()
    codes: list[int] = []

    def hammer() -> None:
        with httpx.Client(timeout=30) as h:
            while not stop.is_set():
                codes.append(
                    h.post(
                        base(gated) + "/completions", json={"prompt": "12>", "max_tokens": 3, "temperature": 0}
                    ).status_code
                )

    try:
        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(3):
            wait_until(lambda: len(codes) > 5, "requests to flow")
            gated.suspend()
            gated.resume()
        stop.set()
        for t in threads:
            t.join(30)
        assert codes and set(codes) == {200}
        assert eng.asleep_submits == 0
    finally:
        gated.shutdown()


def test_a_client_that_disconnects_has_its_request_cancelled() -> None:
    gated, eng = serve_fake(FakeEngine(step_s=0.05))
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                base(gated) + "/completions", json={"prompt": "1>", "max_tokens": 50, "temperature": 1.0}, timeout=0.4
            )
        wait_until(lambda: eng.cancelled, "the engine to abort the request")
        with httpx.stream(
            "POST",
            base(gated) + "/completions",
            json={"prompt": "1>", "max_tokens": 50, "temperature": 1.0, "stream": True},
        ) as s:
            next(s.iter_lines())
        wait_until(lambda: len(eng.cancelled) == 2, "the engine to abort the streamed request")
    finally:
        gated.shutdown()


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("/completions", {"frequency_penalty": 1}, "frequency_penalty"),
        ("/completions", {"echo": True}, "echo"),
        ("/completions", {"best_of": 2}, "best_of"),
        ("/completions", {"logit_bias": {"5": 1}}, "logit_bias"),
        ("/completions", {"suffix": "x"}, "suffix"),
        ("/completions", {"logprobs": 3}, "logprobs"),
        ("/completions", {"wibble": 1}, "wibble"),
        ("/completions", {"max_tokens": True}, "max_tokens"),
        ("/completions", {"seed": 1 << 70}, "seed"),
        ("/completions", {"top_p": 0}, "top_p"),
        ("/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("/completions", {"max_tokens": 62}, "max_tokens"),  # 3 + 62 > the engine's 64
        ("/completions", {"prompt": "ABC"}, "prompt"),
        ("/completions", {"prompt": [999]}, "prompt"),
        ("/chat/completions", {"top_logprobs": 2, "logprobs": True}, "top_logprobs"),
        ("/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
        ("/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/chat/completions", {"messages": [{"role": "user", "content": "1", "foo": 2}]}, "messages.0.foo"),
    ],
)
def test_unsupported_or_bad_params_get_400_naming_them(served_for_refusals, path: str, extra: dict, param: str) -> None:
    gated, eng = served_for_refusals
    body = {"prompt": "12>"} if path == "/completions" else {"messages": [{"role": "user", "content": "12"}]}
    body.update(extra)
    r = httpx.post(base(gated) + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param) and err["type"] == "invalid_request_error"
    assert eng.submitted == [] and eng.steps == 0, "a refused request reached the engine"


def test_null_is_accepted_where_openai_allows_it(served) -> None:
    gated, _ = served
    nulls = {
        k: None
        for k in (
            "max_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "seed",
            "logprobs",
            "user",
            "presence_penalty",
            "logit_bias",
            "stream",
            "best_of",
            "echo",
            "suffix",
        )
    }
    r = httpx.post(base(gated) + "/completions", json={"prompt": "12>", **nulls})
    assert r.status_code == 200, r.text
    ok = {"presence_penalty": 0, "frequency_penalty": 0, "echo": False, "best_of": 1, "seed": (1 << 64) - 1}
    assert httpx.post(base(gated) + "/completions", json={"prompt": "12>", **ok}).status_code == 200


def test_on_policy_guard_and_request_bound() -> None:
    gated, _ = serve_fake(settings=ServerSettings(on_policy=OnPolicy(1.0, 1.0), max_request_tokens=100))
    try:
        r = httpx.post(base(gated) + "/completions", json={"prompt": "12>", "temperature": 0.7})
        err = r.json()["error"]
        assert (
            r.status_code == 400 and err["param"] == "temperature" and "0.7" in err["message"] and "1" in err["message"]
        )
        r = httpx.post(base(gated) + "/completions", json={"prompt": "12>", "top_p": 0.9})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
        r = httpx.post(base(gated) + "/completions", json={"prompt": ["1>", "2>"], "n": 6, "max_tokens": 10})
        err = r.json()["error"]  # (2 + 10) x 6 x 2 prompts = 144 tokens; (2 + 1) x 6 x 2 = 36 would fit
        assert r.status_code == 400 and err["param"] == "max_tokens", err
        assert "costs the engine 144 tokens" in err["message"] and "max_request_tokens=100" in err["message"]
        assert httpx.post(base(gated) + "/completions", json={"prompt": "12>", "max_tokens": 5}).status_code == 200
    finally:
        gated.shutdown()


JSON = {"content-type": "application/json"}


def test_errors_use_openais_shape_and_quote_a_short_prefix(served) -> None:
    gated, _ = served
    for r, code in (
        (httpx.post(base(gated) + "/nope", json={}), 404),
        (httpx.get(base(gated) + "/completions"), 405),
        (httpx.post(base(gated) + "/completions", content=b'{"prompt": "\xff"}', headers=JSON), 400),
        (httpx.post(base(gated) + "/completions", content=b'{"prompt": "1>"}'), 415),  # no JSON content type
        (httpx.get(base(gated) + "/models/other"), 404),
    ):
        assert r.status_code == code and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    big = "Z" * 200_000
    r = httpx.post(base(gated) + "/completions", json={"prompt": big})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and len(r.text) < 1000


def test_tokenize_detokenize_models_and_responses(served) -> None:
    gated, eng = served
    tok = eng.tokenizer
    t = httpx.post(root(gated) + "/tokenize", json={"prompt": "12>"}).json()
    assert t["tokens"] == tok.tokenize("12>") and t["count"] == 3 and t["max_model_len"] == 64
    t = httpx.post(root(gated) + "/tokenize", json={"messages": [{"role": "user", "content": "12"}]}).json()
    assert t["tokens"] == tok.tokenize("12>")
    assert httpx.post(root(gated) + "/detokenize", json={"tokens": tok.tokenize("42")}).json() == {"prompt": "42"}
    assert client(gated).models.retrieve("colo-fsm").id == "colo-fsm"
    resp = client(gated).responses.create(model="m", input="34>", max_output_tokens=30, temperature=0)
    assert resp.output_text.endswith("43") or resp.output_text  # the fake reverses digits of the templated prompt
    assert resp.status in ("completed", "incomplete")


def test_health_reports_real_admission_and_teardown_says_shutting_down() -> None:
    gated, _ = serve_fake()
    h = httpx.get(root(gated) + "/health")
    assert h.status_code == 200 and h.json()["admission"] == "open"
    gated.attach_admit(lambda: False)  # e.g. the lifecycle is Draining: the gate is open, nothing is admitted
    assert httpx.get(root(gated) + "/health").json()["admission"] == "closed"
    gated.attach_admit(lambda: True)
    gated.stopping = True  # what shutdown() does first
    gated.gate.retire()
    h = httpx.get(root(gated) + "/health")
    assert h.status_code == 503 and h.json()["admission"] == "stopping"
    gated.stopped = True  # the engine is torn down; the server goes next
    assert httpx.get(root(gated) + "/health").json()["admission"] == "stopped"
    r = httpx.post(base(gated) + "/completions", json={"prompt": "1>"})
    assert r.status_code == 503 and "Retry-After" not in r.headers and "shutting down" in r.json()["error"]["message"]
    gated.shutdown()


def test_shutdown_answers_waiting_at_once_and_lets_in_flight_finish() -> None:
    gated, eng = serve_fake(FakeEngine(step_s=0.02), request_timeout_s=30.0, shutdown_grace_s=10.0)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(
            httpx.post, base(gated) + "/completions", json={"prompt": "123456>", "temperature": 0}, timeout=30
        )
        wait_until(lambda: eng.steps > 1, "the request to start")
        gated.gate.close_and_drain(10)  # a handoff: the next request waits
        waiting = pool.submit(httpx.post, base(gated) + "/completions", json={"prompt": "1>"}, timeout=30)
        wait_until(lambda: gated.gate.waiting == 1, "the second request to wait")
        gated.shutdown()
        w = waiting.result(5)
        assert w.status_code == 503 and "shutting down" in w.json()["error"]["message"]
        assert running.result(5).json()["choices"][0]["text"] == "654321"


def test_collector_generate_parks_too() -> None:
    """The collector's ``generate`` leaves the gate once its request is handed over: a suspend parks the rollout
    instead of waiting for it, and it is answered after the resume. Forced: the engine holds the rollout after its
    2nd token (of 6) until the suspend has returned, so it cannot finish before it."""
    gated, eng = serve_fake(FakeEngine())
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool, eng.hold_at(2) as hold:
            fut = pool.submit(gated.generate, ["12345>"], max_tokens=8)
            assert hold.reached.wait(WAIT), "the rollout never made its 2nd token"
            suspend_over(gated, hold, "the rollout")
            assert not fut.done()
            hold.release.set()  # the engine is asleep: the rollout stays parked until the resume
            gated.resume()
            assert fut.result(10)[0].text == "54321"
    finally:
        gated.shutdown()


def test_stream_chunks_are_sse_with_done(served) -> None:
    gated, _ = served
    with httpx.stream(
        "POST",
        base(gated) + "/chat/completions",
        json={
            "messages": [{"role": "user", "content": "12"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "logprobs": True,
        },
    ) as s:
        lines = [ln for ln in s.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    objs = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert objs[-1]["usage"]["completion_tokens"] > 0 and objs[-2]["choices"][0]["finish_reason"] == "stop"


def test_streamed_text_stops_before_a_multi_character_stop_string(served) -> None:
    gated, _ = served
    c = client(gated)
    # the fake answers "456789": the stop string "67" is held back while it may still be forming, never sent
    chunks = list(
        c.completions.create(model="m", prompt="987654>", stop=["67"], max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(ch.choices[0].text for ch in chunks) == "45"
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].stop_reason == "67"
