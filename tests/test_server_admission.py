"""Admission counted in tokens: a request costs the engine (prompt tokens + max_tokens) x n per prompt, bounded per
request (400 naming the field, the value and the limit) and server-wide (:class:`TokenBudget`: a request that does
not fit waits first come, first served, then 429 with Retry-After, or 503 while the engine is suspended)."""

from __future__ import annotations

import asyncio
import concurrent.futures

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake

from colo_fsm.errors import ConfigError, ServerBusy
from colo_fsm.server import ServerSettings
from colo_fsm.server.admission import TokenBudget, request_cost
from colo_fsm.server.params import Sampling
from colo_fsm.server.settings import engine_batch_tokens


def base(gated) -> str:  # type: ignore[no-untyped-def]
    return gated.server_base_urls()[0]


def wait_until(cond, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_cost_counts_prompt_tokens_for_every_choice() -> None:
    s = Sampling(max_tokens=1, n=1)
    # the request that starved training: 32,768 prompts of 30 tokens, max_tokens=1 (prompts x n x max_tokens
    # was 32,768, at the old bound); the engine processes 32,768 x 31 tokens
    assert request_cost([30] * 32768, s) == 32768 * 31
    assert request_cost([5, 7], Sampling(max_tokens=10, n=3)) == (5 + 10) * 3 + (7 + 10) * 3


def test_many_short_prompts_are_refused_by_their_prompt_tokens() -> None:
    gated, _ = serve_fake(settings=ServerSettings(max_request_tokens=1000))
    try:
        prompts = [[5] * 30 for _ in range(64)]  # 64 x (30 + 1) = 1984 tokens > 1000, though 64 x 1 x 1 = 64
        r = httpx.post(base(gated) + "/completions", json={"prompt": prompts, "max_tokens": 1}, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "prompt", err  # a smaller max_tokens cannot fit it
        assert "1984 tokens" in err["message"] and "max_request_tokens=1000" in err["message"]
        chat = {"messages": [{"role": "user", "content": "1" * 40}], "n": 30, "max_tokens": 1}
        r = httpx.post(base(gated) + "/chat/completions", json=chat, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        ok = httpx.post(base(gated) + "/completions", json={"prompt": prompts[:30], "max_tokens": 1}, timeout=30)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 30  # 30 x 31 = 930 fits
    finally:
        gated.shutdown()


def test_default_bound_is_one_engine_batch() -> None:
    class Engine:
        max_sequence_length = 32

        class config:
            max_active_requests = 64

    assert engine_batch_tokens(Engine()) == 2048
    assert ServerSettings().token_limits(Engine()) == (2048, 2048)
    assert ServerSettings(max_request_tokens=100).token_limits(Engine()) == (100, 2048)
    assert ServerSettings().token_limits(None) == (1 << 15, 1 << 15)
    with pytest.raises(ConfigError, match="max_request_tokens"):
        ServerSettings(max_request_tokens=10, max_inflight_tokens=5)
    assert ServerSettings(max_inflight_tokens=1000).token_limits(Engine()) == (1000, 1000)
    for bad in ({"max_inflight_tokens": 0}, {"max_waiting_requests": -1}, {"max_body_bytes": True}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ServerSettings(**bad)  # type: ignore[arg-type]


def test_budget_is_first_come_first_served_and_gives_back_on_cancel() -> None:
    async def scenario() -> None:
        b = TokenBudget(10, max_waiting=2)
        await b.acquire(8, 1)
        order: list[str] = []

        async def want(name: str, cost: int) -> None:
            await b.acquire(cost, 30)
            order.append(name)

        big = asyncio.create_task(want("big", 5))
        await asyncio.sleep(0)
        small = asyncio.create_task(want("small", 1))  # fits now, but waits behind "big": no barging
        await asyncio.sleep(0)
        assert b.waiting == 2 and order == []
        with pytest.raises(ServerBusy, match="max_waiting_requests"):
            await b.acquire(1, 30)  # a third waiter is refused at once
        b.release(8)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and b.held == 6
        b.release(5)
        b.release(1)
        await b.acquire(10, 1)
        late = asyncio.create_task(b.acquire(4, 30))
        await asyncio.sleep(0)
        late.cancel()  # a waiter whose client went away leaves the queue; nothing is held for it
        with pytest.raises(asyncio.CancelledError):
            await late
        assert b.waiting == 0 and b.held == 10
        with pytest.raises(ServerBusy, match="max_inflight_tokens"):
            await b.acquire(1, 0.05)
        b.release(10)
        assert b.held == 0 and b.holders == 0

    asyncio.run(scenario())


def test_http_work_over_the_bound_waits_then_429_or_503_and_nothing_is_lost() -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, settings=ServerSettings(max_inflight_tokens=40), request_timeout_s=1.0)
    url = base(gated)
    body = {"prompt": "1234>", "max_tokens": 20, "temperature": 0}  # (5 + 20) x 1 = 25 tokens each
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            eng.suspend()  # the engine holds the first request parked; the gate stays open (admissible)
            first = pool.submit(httpx.post, url + "/completions", json=body, timeout=60)
            wait_until(lambda: gated.server.app.state.ctx.budget.held == 25, "the first request to hold 25 tokens")
            budget = gated.server.app.state.ctx.budget
            second = pool.submit(httpx.post, url + "/completions", json=body, timeout=60)
            wait_until(lambda: budget.waiting or budget.held > 25, "the second request to wait or be admitted")
            assert (budget.held, budget.waiting) == (25, 1)  # 25 + 25 > 40: it waits for room, not in the engine
            r = second.result(30)  # after request_timeout_s: 429 (the gate is admissible)
            assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
            err = r.json()["error"]
            assert err["code"] == "max_inflight_tokens" and "costs 25 tokens" in err["message"], err
            gated.attach_admit(lambda: False)  # a handoff: the same wait ends in 503 with Retry-After
            r = httpx.post(url + "/completions", json=body, timeout=60)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
            gated.attach_admit(lambda: True)
            eng.resume()
            assert first.result(30).status_code == 200  # the held request was answered, not dropped
            assert httpx.post(url + "/completions", json=body, timeout=60).status_code == 200
        assert gated.server.app.state.ctx.budget.held == 0
    finally:
        gated.shutdown()


def test_a_stream_holds_its_tokens_until_it_ends() -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, settings=ServerSettings(max_inflight_tokens=40), request_timeout_s=5.0)
    budget = gated.server.app.state.ctx.budget
    try:
        for abandon in (False, True):
            with httpx.stream(
                "POST", base(gated) + "/completions", json={"prompt": "12>", "max_tokens": 9, "stream": True}
            ) as r:
                assert r.status_code == 200 and budget.held == 12
                if not abandon:
                    lines = [x for x in r.iter_lines() if x]
                    assert lines[-1] == "data: [DONE]"
            # the whole budget: served once the stream gave its 12 tokens back (else 429 after 5 s)
            whole = httpx.post(base(gated) + "/completions", json={"prompt": "1234>", "max_tokens": 35}, timeout=60)
            assert whole.status_code == 200, whole.text
    finally:
        gated.shutdown()
