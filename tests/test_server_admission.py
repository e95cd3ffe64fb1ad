"""Admission counted in tokens, and fair: a request costs the engine (prompt tokens + max_tokens) x n per prompt,
bounded per request by a share of the server-wide budget (400 naming the field, the value and the limit), and the
:class:`TokenBudget` grants waiting requests earliest deadline first (a small request passes a large one; a large
one whose deadline passed is served before anything behind it). A waiter cancelled just as it is granted gives its
tokens back."""

from __future__ import annotations

import asyncio
import concurrent.futures
from functools import partial

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake

from colo_fsm.errors import ConfigError, ServerBusy
from colo_fsm.server import ServerSettings
from colo_fsm.server.admission import TokenBudget, request_cost
from colo_fsm.server.params import Sampling
from colo_fsm.server.settings import engine_batch_tokens
from tests.support import waits


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def base(gated) -> str:  # type: ignore[no-untyped-def]
    return gated.server_base_urls()[0]


wait_until = partial(waits.wait_until, timeout_s=30.0)  # this file's bound


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


def test_one_request_costs_at_most_a_share_of_the_budget() -> None:
    class Engine:
        max_sequence_length = 32

        class config:
            max_active_requests = 64

    assert engine_batch_tokens(Engine()) == 2048
    # the budget is one engine batch; one request may cost 0.4 of it (max_request_share), never all of it
    assert ServerSettings().token_limits(Engine()) == (819, 2048)
    assert ServerSettings(max_request_share=1.0).token_limits(Engine()) == (2048, 2048)
    assert ServerSettings(max_request_tokens=100).token_limits(Engine()) == (100, 2048)
    assert ServerSettings().token_limits(None) == (13107, 1 << 15)
    assert ServerSettings(max_inflight_tokens=1000).token_limits(Engine()) == (400, 1000)
    with pytest.raises(ConfigError, match="max_request_tokens"):
        ServerSettings(max_request_tokens=600, max_inflight_tokens=1000)  # over the share: refused at once
    with pytest.raises(ConfigError, match="max_request_share=0.4 x max_inflight_tokens=2048 = 819"):
        ServerSettings(max_request_tokens=1500).token_limits(Engine())  # over the share of the engine's batch
    for bad in (
        {"max_inflight_tokens": 0},
        {"max_waiting_requests": -1},
        {"max_body_bytes": True},
        {"max_request_share": 0},
        {"max_request_share": 1.5},
        {"fair_window_s": -1.0},
        {"upload_timeout_s": 0},
        {"max_retry_after_s": 0},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ServerSettings(**bad)  # type: ignore[arg-type]


def test_a_request_over_its_share_of_the_budget_is_refused_naming_the_bound() -> None:
    gated, _ = serve_fake(settings=ServerSettings(max_inflight_tokens=100))
    try:
        body = {"prompt": "1234>", "max_tokens": 55}  # (5 + 55) x 1 = 60 tokens: 60% of the budget
        r = httpx.post(base(gated) + "/completions", json=body, timeout=30)
        assert r.status_code == 400, f"a request costing 60% of the budget was not refused: {r.status_code} {r.text}"
        err = r.json()["error"]
        assert err["param"] == "max_tokens" and "max_request_tokens=40" in err["message"], err  # 0.4 of 100
        assert httpx.post(base(gated) + "/completions", json={**body, "max_tokens": 35}, timeout=30).status_code == 200
    finally:
        gated.shutdown()


def test_a_small_request_passes_a_large_one_that_does_not_fit() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        b = TokenBudget(10, max_waiting=4, fair_window_s=2.0, clock=clock)
        await b.acquire(8, 1)
        order: list[str] = []

        async def want(name: str, cost: int) -> None:
            await b.acquire(cost, 30)
            order.append(name)

        big = asyncio.create_task(want("big", 5))  # 8 + 5 > 10: waits, due 2 x 5/10 = 1 s after it came
        await asyncio.sleep(0)
        assert b.waiting == 1
        small = asyncio.create_task(want("small", 1))  # arrives later, fits now: no head-of-line blocking
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["small"], f"a 1-token request waited behind a 5-token one that could not run: {order}"
        assert b.held == 9 and b.waiting == 1
        b.release(8)
        b.release(1)
        await asyncio.gather(big, small)
        assert order == ["small", "big"] and b.held == 5

    asyncio.run(scenario())


def test_a_large_request_past_its_deadline_is_served_before_later_ones() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        b = TokenBudget(10, max_waiting=4, fair_window_s=2.0, clock=clock)
        await b.acquire(8, 1)
        order: list[str] = []

        async def want(name: str, cost: int) -> None:
            await b.acquire(cost, 30)
            order.append(name)

        big = asyncio.create_task(want("big", 5))
        await asyncio.sleep(0)
        clock.now += 1.5  # past the big request's deadline (1 s): it reserves the room it waits for
        small = asyncio.create_task(want("small", 1))  # fits (8 + 1 <= 10), but the due request goes first
        await asyncio.sleep(0)
        assert order == [] and b.waiting == 2, "a request past its deadline was passed: it could starve"
        b.release(8)  # big (5) first, then small (1)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and b.held == 6
        # deadlines: arrival + fair_window_s x cost / limit
        assert b.deadline(10, 0.0) == 2.0 and b.deadline(1, 0.0) == pytest.approx(0.2)

    asyncio.run(scenario())


def test_a_waiter_cancelled_just_as_it_is_granted_gives_its_tokens_back() -> None:
    """The interleaving forced: the grant (another request's release) and the cancel (its client gone) land before
    the waiter runs again. Its tokens must come back, or every later request finds the budget full."""

    async def scenario() -> None:
        b = TokenBudget(10, max_waiting=4)
        await b.acquire(10, 1)
        waiter = asyncio.create_task(b.acquire(4, 30))
        await asyncio.sleep(0)
        assert b.waiting == 1
        b.release(10)  # grants the waiter: held 4 for it, its future resolved, the task not resumed yet
        assert b.held == 4 and b.waiting == 0
        waiter.cancel()  # its client went away in the same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (b.held, b.holders) == (0, 0), f"a cancelled waiter kept {b.held} tokens of the budget"
        assert await b.acquire(10, 0) == 0.0  # the whole budget is free: no 429 for the next request

    asyncio.run(scenario())


def test_waiters_leave_the_queue_on_cancel_and_the_queue_is_bounded() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        b = TokenBudget(10, max_waiting=1, clock=clock)
        await b.acquire(10, 1)
        late = asyncio.create_task(b.acquire(4, 30))
        await asyncio.sleep(0)
        with pytest.raises(ServerBusy, match="max_waiting_requests") as info:
            await b.acquire(1, 30)  # a second waiter is refused at once
        assert info.value.retry_after_s == b.retry_cap_s  # nothing drained yet: the longest wait
        late.cancel()  # a waiter whose client went away leaves the queue; nothing is held for it
        with pytest.raises(asyncio.CancelledError):
            await late
        assert b.waiting == 0 and b.held == 10
        with pytest.raises(ServerBusy, match="max_inflight_tokens"):
            await b.acquire(1, 0.01)
        b.release(10)
        assert b.held == 0 and b.holders == 0

    asyncio.run(scenario())


def test_retry_after_of_a_full_budget_is_its_observed_drain_rate() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        b = TokenBudget(100, max_waiting=8, retry_after_s=1, max_retry_after_s=60, clock=clock)
        assert b.retry_after(10, 0) == 1  # fits: no wait
        await b.acquire(100, 1)
        assert b.retry_after(10, 0) == 60  # nothing given back within the window: the longest wait
        for _ in range(5):  # 50 tokens given back over 10 s: 5 tokens/s
            clock.now += 2.0
            b.release(10)
            await b.acquire(10, 1)
        assert b.drain.per_second() == pytest.approx(5.0)
        # a 30-token request behind 20 waiting tokens, with the budget full: 50 tokens must drain, 10 s
        assert b.retry_after(30, 20) == 10
        clock.now += 31.0  # the window (30 s) has passed with nothing drained
        assert b.retry_after(30, 20) == 60

    asyncio.run(scenario())


def test_http_work_over_the_bound_waits_then_429_with_a_computed_retry_after_even_while_suspended() -> None:
    eng = FakeEngine()
    settings = ServerSettings(max_inflight_tokens=40, max_request_share=1.0, max_retry_after_s=45)
    gated, _ = serve_fake(eng, settings=settings, request_timeout_s=1.0)
    url = base(gated)
    body = {"prompt": "1234>", "max_tokens": 20, "temperature": 0}  # (5 + 20) x 1 = 25 tokens each
    budget = gated.server.app.state.ctx.budget
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            eng.suspend()  # the engine holds the first request parked; the gate stays open (admissible)
            first = pool.submit(httpx.post, url + "/completions", json=body, timeout=60)
            wait_until(lambda: budget.held == 25, "the first request to hold 25 tokens")
            second = pool.submit(httpx.post, url + "/completions", json=body, timeout=60)
            wait_until(lambda: budget.waiting or budget.held > 25, "the second request to wait or be admitted")
            assert (budget.held, budget.waiting) == (25, 1)  # 25 + 25 > 40: it waits for room, not in the engine
            r = second.result(30)  # after request_timeout_s: 429
            assert r.status_code == 429, r.text
            err = r.json()["error"]
            assert err["code"] == "max_inflight_tokens" and "costs 25 tokens" in err["message"], err
            # nothing drained yet: the computed Retry-After is the longest (not a constant 1)
            assert r.headers["Retry-After"] == "45", r.headers
            gated.attach_admit(lambda: False)  # a handoff: a wait for the *budget* is still a 429, never a 503
            r = httpx.post(url + "/completions", json=body, timeout=60)
            assert r.status_code == 429, f"a token-budget timeout answered as a suspended engine: {r.text}"
            assert r.json()["error"]["code"] == "max_inflight_tokens"
            gated.attach_admit(lambda: True)
            eng.resume()
            assert first.result(30).status_code == 200  # the held request was answered, not dropped
            eng.suspend()  # hold the budget again: now a drain rate was observed
            first = pool.submit(httpx.post, url + "/completions", json=body, timeout=60)
            wait_until(lambda: budget.held == 25, "the third request to hold 25 tokens")
            r = httpx.post(url + "/completions", json=body, timeout=60)
            assert r.status_code == 429
            retry = int(r.headers["Retry-After"])
            assert f"retry in about {retry} s" in r.json()["error"]["message"]
            assert retry == budget.retry_after(25, 0) or retry == budget.retry_after(25, 0) + 1
            eng.resume()
            assert first.result(30).status_code == 200
        health = httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()
        assert health["responses"]["busy"] == 3 and health["responses"]["suspended"] == 0, health["responses"]
        assert budget.held == 0
    finally:
        gated.shutdown()


def test_a_stream_holds_its_tokens_while_the_engine_holds_it() -> None:
    eng = FakeEngine()
    gated, _ = serve_fake(eng, settings=ServerSettings(max_inflight_tokens=40, max_request_share=1.0))
    budget = gated.server.app.state.ctx.budget
    try:
        for abandon in (False, True):
            eng.suspend()  # parked in the engine: the stream holds its 12 tokens
            with httpx.stream(
                "POST", base(gated) + "/completions", json={"prompt": "12>", "max_tokens": 9, "stream": True}
            ) as r:
                assert r.status_code == 200 and budget.held == 12
                eng.resume()
                if not abandon:
                    lines = [x for x in r.iter_lines() if x]
                    assert lines[-1] == "data: [DONE]"
            # the whole budget: served once the stream gave its 12 tokens back (else 429 after 30 s)
            whole = httpx.post(base(gated) + "/completions", json={"prompt": "1234>", "max_tokens": 35}, timeout=60)
            assert whole.status_code == 200, whole.text
        assert budget.held == 0
    finally:
        gated.shutdown()


class TurnRecordingEngine(FakeEngine):
    """A fake engine that says it admits by turn, and records the turn each submission carries."""

    admits_by_turn = True

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.turns: list[int | None] = []

    def submit(self, prompt_ids, *, turn=None, **kw):  # type: ignore[no-untyped-def,override]
        self.turns.append(turn)
        return super().submit(prompt_ids, **kw)


def test_the_server_numbers_a_requests_choices_for_an_engine_that_admits_by_turn() -> None:
    for engine, expected in ((TurnRecordingEngine(), [0, 1, 2, 3, 4, 5]), (FakeEngine(), None)):
        gated, eng = serve_fake(engine)
        try:
            r = httpx.post(
                gated.server_base_urls()[0] + "/completions", json={"prompt": ["1>", "2>"], "n": 3, "max_tokens": 2}
            )
            assert r.status_code == 200, r.text
            if expected is not None:
                assert sorted(eng.turns) == expected  # type: ignore[attr-defined]
        finally:
            gated.shutdown()
