"""HTTP hygiene: every malformed input gets its exact 4xx in OpenAI's error shape naming the field, and the server
keeps serving afterwards; ``text_offset`` indexes into ``text`` (also in streamed chunks); ``/health`` answers from
what the server holds, with a status code per server state."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake
from starlette.requests import Request

from colo_fsm.errors import PayloadTooLarge
from colo_fsm.server import ServerSettings
from colo_fsm.server.body import read_limited
from colo_fsm.server.formatting import TokenText
from colo_fsm.server.health import HEALTH_CODES

SHAPE = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def served():
    gated, eng = serve_fake(settings=ServerSettings(max_body_bytes=2000), request_timeout_s=10.0)
    yield gated, eng
    gated.shutdown()


def base(gated: Any) -> str:
    return str(gated.server_base_urls()[0])


def still_serving(gated: Any) -> None:
    r = httpx.post(base(gated) + "/completions", json={"prompt": "12>", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200, r.text


def refused(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == SHAPE and err["param"] == param, err
    return dict(err)


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("content", "headers", "status", "param"),
    [
        (b'{"prompt": "12>", "max_tokens": ' + b"9" * 5000 + b"}", JSON, 413, "body"),  # over max_body_bytes
        (b'{"prompt": "12>", "max_tokens": ' + b"9" * 1500 + b"}", JSON, 400, "max_tokens"),  # parsed, out of range
        (b"[" * 900 + b"]" * 900, JSON, 400, "body"),  # nested 900 deep: parsed, over the depth bound (64)
        (b'{"prompt": "12>"}', {"content-type": "text/plain"}, 415, "content-type"),
        (b'{"prompt": "12>"}', {}, 415, "content-type"),
        (b'{"prompt": "12>"}', {"content-type": "application/x-www-form-urlencoded"}, 415, "content-type"),
    ],
)
def test_malformed_bodies_get_their_4xx_and_the_server_keeps_serving(served, content, headers, status, param) -> None:
    gated, _ = served
    r = httpx.post(base(gated) + "/completions", content=content, headers=headers, timeout=30)
    refused(r, status, param)
    still_serving(gated)


def test_parser_limits_give_400_not_500() -> None:
    gated, _ = serve_fake(settings=ServerSettings(max_body_bytes=1 << 20))
    try:
        url = base(gated) + "/completions"
        digits = b'{"prompt": "12>", "max_tokens": ' + b"9" * 4301 + b"}"  # over Python's 4,300-digit limit
        err = refused(httpx.post(url, content=digits, headers=JSON, timeout=30), 400, "body")
        assert "4300" in err["message"]
        deep = b"[" * 100_000 + b"]" * 100_000  # 100,000 deep: the parser's own recursion bound
        err = refused(httpx.post(url, content=deep, headers=JSON, timeout=30), 400, "body")
        assert "nested deeper" in err["message"]
        ok = httpx.post(url, content=b'{"prompt": "12>"}', headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code == 200, ok.text
    finally:
        gated.shutdown()


def _request(headers: dict[str, str], chunks: list[bytes], pulled: list[int]) -> Request:
    async def receive() -> dict[str, Any]:
        pulled.append(1)
        i = len(pulled) - 1
        assert i < len(chunks), "read past the last chunk"
        return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "headers": raw}, receive)


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole() -> None:
    pulled: list[int] = []
    req = _request({"content-length": str(10 << 20)}, [b"x" * 100], pulled)
    with pytest.raises(PayloadTooLarge) as exc:
        asyncio.run(read_limited(req, 1000))
    assert exc.value.size == 10 << 20 and exc.value.status == 413 and pulled == []  # from Content-Length alone
    pulled = []
    req = _request({}, [b"x" * 400] * 10, pulled)  # chunked, no Content-Length: 4,000 bytes in 10 chunks
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_limited(req, 1000))
    assert len(pulled) == 3  # refused at the chunk that passed 1,000 bytes; the other 7 were never read
    pulled = []
    assert asyncio.run(read_limited(_request({}, [b"ab", b"cd"], pulled), 4)) == b"abcd"


def test_messages_with_null_content_and_params_at_fault(served) -> None:
    gated, _ = served
    url = base(gated)
    chat = {"messages": [{"role": "user", "content": None}]}
    err = refused(httpx.post(url + "/chat/completions", json=chat), 400, "messages.0.content")
    assert "required" in err["message"]
    missing = {"messages": [{"role": "user", "content": "1"}, {"role": "user"}]}
    refused(httpx.post(url + "/chat/completions", json=missing), 400, "messages.1.content")
    turns = [
        {"role": "user", "content": "12"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "3"},
    ]
    ok = httpx.post(url + "/chat/completions", json={"messages": turns, "max_tokens": 2})
    assert ok.status_code == 200, ok.text  # OpenAI accepts an assistant turn without content
    long_prompt = "1" * 70  # the fake's context is 64 tokens: the prompt alone does not fit
    refused(httpx.post(url + "/completions", json={"prompt": long_prompt, "max_tokens": 1}), 400, "prompt")
    chat = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1}
    refused(httpx.post(url + "/chat/completions", json=chat), 400, "messages")
    err = refused(httpx.post(url + "/completions", json={"prompt": "1" * 60, "max_tokens": 10}), 400, "max_tokens")
    assert "64" in err["message"] and "70 in all" in err["message"]
    refused(httpx.post(url + "/responses", json={"input": long_prompt, "max_output_tokens": 1}), 400, "input")
    # the digits chat template has no system turn: the refusal names this endpoint's field, not messages.0.content
    refused(httpx.post(url + "/responses", json={"input": "12", "instructions": "be brief"}), 400, "instructions")
    items = [{"role": "user", "content": "1"}, {"role": "system", "content": "x"}]
    refused(httpx.post(url + "/responses", json={"input": items}), 400, "input.1.content")
    still_serving(gated)


def test_text_offset_counts_only_the_text_a_token_adds() -> None:
    tok = FakeEngine().tokenizer
    text_of = TokenText(tok)
    one, eod, two = tok.tokenize("1")[0], tok.eod, tok.tokenize("2")[0]
    ids = [one, eod, two, eod]
    text = text_of.text(ids)
    assert text == "12" and text_of.offsets(ids, text) == [0, 1, 1, 2]  # eod adds nothing to the text
    assert text_of.offsets(ids, "1") == [0, 1, 1, 1]  # text cut at a stop string: offsets stay inside it


def test_text_offset_indexes_into_text_and_is_streamed(served) -> None:
    gated, _ = served
    url = base(gated) + "/completions"
    body = {"prompt": "12345>", "max_tokens": 8, "temperature": 0, "logprobs": 0, "stop": "32"}
    r = httpx.post(url, json=body, timeout=30).json()["choices"][0]
    text, lp = r["text"], r["logprobs"]
    assert text == "54" and len(lp["text_offset"]) == len(lp["tokens"]) == 4  # 5, 4, 3, 2 (stop "32")
    assert lp["text_offset"] == [0, 1, 2, 2]  # "3" and "2" are cut: they start at the end of the text
    for off, token in zip(lp["text_offset"], lp["tokens"]):
        assert off <= len(text) and (off == len(text) or text[off:].startswith(token))
    streamed_offsets, streamed_text = [], ""
    body = {"prompt": "123>", "max_tokens": 8, "temperature": 0, "logprobs": 0, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=30) as s:
        for line in s.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["logprobs"]:
                streamed_offsets += choice["logprobs"]["text_offset"]
                assert len(choice["logprobs"]["text_offset"]) == len(choice["logprobs"]["tokens"]) == 1
            streamed_text += choice["text"]
    assert streamed_text == "321" and streamed_offsets == [0, 1, 2, 3]  # 3, 2, 1, then eod at the end


def test_health_status_code_per_server_state() -> None:
    assert HEALTH_CODES == {"ok": 200, "handoff": 200, "stopping": 503, "stopped": 503, "failed": 503}
    gated, _ = serve_fake()
    url = base(gated).removesuffix("/v1") + "/health"
    try:
        status: dict[str, Any] = {"state": "Generating", "weight_version": 3, "failure": None}
        gated.attach_status(lambda: status)
        h = httpx.get(url)
        assert (h.status_code, h.json()["status"]) == (200, "ok")
        gated.gate.close_and_drain(1)  # a handoff: parked requests are alive, new ones wait
        status["state"] = "Training"
        h = httpx.get(url)
        assert (h.status_code, h.json()["status"]) == (200, "handoff")
        status.update(state="Failed", failure="ActionFailed: train")
        h = httpx.get(url)
        assert (h.status_code, h.json()["status"]) == (503, "failed") and "train" in h.json()["lifecycle"]["failure"]
        status.update(state="Training", failure=None)
        gated.gate.open()
        gated.stopping = True  # what shutdown() does first
        h = httpx.get(url)
        assert (h.status_code, h.json()["status"]) == (503, "stopping")
        gated.stopped = True
        h = httpx.get(url)
        assert (h.status_code, h.json()["status"]) == (503, "stopped")
    finally:
        gated.stopping = gated.stopped = False
        gated.shutdown()


def test_health_never_waits_on_the_engine() -> None:
    gated, eng = serve_fake()
    url = base(gated).removesuffix("/v1") + "/health"
    held, release = threading.Event(), threading.Event()

    def hold_engine_lock() -> None:
        with eng._cond:  # the lock the engine loop (and its request_counts) takes
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold_engine_lock)
    t.start()
    try:
        assert held.wait(30)
        try:
            h = httpx.get(url, timeout=10)
        except httpx.TimeoutException:
            pytest.fail("/health waited on the engine's lock")
        assert h.status_code == 200 and h.json()["status"] == "ok"
    finally:
        release.set()
        t.join(30)
        gated.shutdown()


def test_responses_names_instructions_when_they_make_the_prompt_too_long() -> None:
    """Over a template that renders a system turn, the refusal of a /v1/responses prompt over the context names
    `instructions` when the input alone would fit, and `input` when the input alone is too long."""
    gated, _ = serve_fake(chat_template=lambda msgs: "".join(m["content"] for m in msgs) + ">")
    url = base(gated)
    try:
        long = "1" * 70  # the fake's context is 64 tokens
        ok = httpx.post(url + "/responses", json={"input": "12", "instructions": "3", "max_output_tokens": 2})
        assert ok.status_code == 200, ok.text
        err = refused(
            httpx.post(url + "/responses", json={"input": "12", "instructions": long, "max_output_tokens": 1}),
            400,
            "instructions",
        )
        assert "maximum context length is 64" in err["message"], err
        refused(
            httpx.post(url + "/responses", json={"input": "12", "instructions": "3" * 62, "max_output_tokens": 1}),
            400,
            "instructions",  # 62 + 2 + '>' = 65 tokens: only the instructions push it past the context
        )
        refused(httpx.post(url + "/responses", json={"input": long, "instructions": "3"}), 400, "input")
        refused(httpx.post(url + "/responses", json={"input": "12", "instructions": "\u20ac"}), 400, "instructions")
        still_serving(gated)
    finally:
        gated.shutdown()
