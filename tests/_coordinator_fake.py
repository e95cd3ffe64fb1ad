"""A scripted stand-in for the surface of megatron-core 0.19.2's ``MegatronAsyncLLM(use_coordinator=True)``.

What :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine` touches, with megatron's semantics:

* a background thread running an asyncio loop (``run_forever``) and the engine-loop task on it
  (``engine.engine_loop_task``); an exception in that task becomes ``sys.exit(1)`` there, as megatron's
  ``trace_async_exceptions`` does, which ends the loop thread silently and leaves every future unanswered;
* ``engine.state`` (names of megatron's ``EngineState``), changed only by the loop, one control signal per
  iteration: PAUSE -> PAUSED, SUSPEND (from PAUSED) -> SUSPENDED, RESUME (from SUSPENDED) -> PAUSED with the
  RESUMED event set, UNPAUSE (from PAUSED) -> RUNNING, STOP -> STOPPED; requests stay in the engine throughout;
* ``SET_GENERATION_EPOCH`` stamps ``policy_epoch`` boundaries ``(index of the last token, epoch)`` on every
  request, and new requests get ``[(0, epoch)]``;
* ``add_request`` asserts like megatron when log-probs are asked with prompt log-probs;
* the stop-word hook: a request whose id is in ``engine.stop_word_finished_request_ids`` is finished at the next
  decode step with the tokens it has (none appended), and ``engine.context`` lists the requests in the context
  (``request_ids[:total_request_count]``; here every request is in it, none waits);
* coroutine methods ``generate``, ``pause``, ``unpause``, ``suspend``, ``resume``, ``shutdown``; the epoch goes
  through ``_coord_runtime.client.set_generation_epoch``.

Each decode step is ``await engine.async_step()`` from the loop, as megatron's own loop calls it, returning
megatron's result shape (``active_request_ids``, ``finished_request_records``, ``cuda_graph_request_count``: the
next power of two at or above the requests stepped), so a wrapper set on the engine object sees every step.

The loop takes megatron's consensus as megatron-core 0.19.2's ``run_engine_with_coordinator`` does: while it has
work, only every ``ep_consensus_interval`` iterations of its ``InferenceConfig`` (``engine.consensus_interval``),
so a pause lands only at the next consensus; ``engine.counter_at_pause = k`` sets the iteration counter to ``k``
when a pause arrives (k = 1 with the interval 20: the pause lands 19 iterations later). Two differences no test
here relies on: this loop yields to its event loop at every iteration, where megatron's does not on an iteration
that only takes the consensus or runs a dummy forward (so there answers and signals wait for a dummy tail), and an
iteration metered to no step (``allow_steps = 0``) still advances the counter.

``engine.context.step_count`` counts the steps, as megatron's does, and the dummy forwards an idle
expert-parallel rank runs (``engine.idle_dummy_forwards = n``: n more of ``engine.controller.dummy_forward()``
while RUNNING with no request); ``engine.count_base = engine.steps`` sets it back to 0, as megatron's graph
capture does. With ``engine.step_through_class = True`` the loop calls the class's ``async_step`` instead, as a
loop that no longer steps through the object would.

Decode steps are metered for tests that force an interleaving: with ``engine.allow_steps = n`` only ``n`` more
steps run (``engine.stepped`` is set after each one), ``None`` lets it run freely. With
``engine.free_at_pause = True``, ``pause()`` lets a held engine run freely on the loop, as it sends PAUSE: a
caller that reads the step count, then sends the pause late (a busy machine), sees no step in between.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from megatron.core.inference.sampling_params import SamplingParams


@dataclass
class FakeRequest:
    request_id: int
    prompt_tokens: list[int]
    sampling_params: Any
    future: asyncio.Future[Any]
    generated_tokens: list[int] = field(default_factory=list)
    generated_log_probs: list[float] = field(default_factory=list)
    policy_epoch: list[tuple[int, int]] | None = None
    status: Any = None


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine

    @property
    def request_ids(self) -> list[int]:
        return list(self._engine.requests)

    @property
    def total_request_count(self) -> int:
        return len(self._engine.requests)

    @property
    def step_count(self) -> int:
        return self._engine.steps - self._engine.count_base


class FakeEngine:
    def __init__(self, eod: int) -> None:
        self.stop_word_finished_request_ids: set[int] = set()
        self.context = FakeContext(self)
        self.decode_only = True  # every step here is decode-only (megatron's DecodeOnly; a plain bool is read too)
        self.state = SimpleNamespace(name="RUNNING")
        self.eod = eod
        self.requests: dict[int, FakeRequest] = {}
        self.inbox: deque[tuple[Any, ...]] = deque()
        self.signals: deque[str] = deque()
        self.epoch: int | None = None
        self.allow_steps: int | None = None
        self.steps = 0
        self.step_through_class = False
        self.token_span = 20  # tokens generated are 3 .. 3 + token_span - 1
        self.count_base = 0  # step_count is steps - count_base: megatron sets it to 0 when it captures graphs again
        self.reset_count_at_resume = False  # set step_count to 0 at each resume, as a graph re-capture does
        self.idle_dummy_forwards = 0  # dummy forwards to run while RUNNING with no request (an idle EP rank)
        self.controller = SimpleNamespace(dummy_forward=lambda: None)
        self.consensus_interval = 20  # megatron's default; FakeAsyncLLM sets its inference_config's
        self.consensus: tuple[int, bool] = (0, False)  # (work, every peer pausing) of the last consensus
        self.consensus_counter = 0
        self.counter_at_pause: int | None = None  # set the counter to this when a pause arrives (None: leave it)
        self.free_at_pause = False  # pause() sets allow_steps to None on the loop as it sends PAUSE
        self.stepped = threading.Event()
        self.die_with: BaseException | None = None  # raised inside the loop at its next iteration
        self.events: dict[str, asyncio.Event] = {}
        self.engine_loop_task: asyncio.Task[None] = None  # type: ignore[assignment]
        self.suspend_count = 0

    def _set(self, name: str) -> None:
        self.state = SimpleNamespace(name=name)

    async def wait_until(self, name: str) -> None:
        await self.events[name].wait()

    def add_request(self, rid: int, prompt: list[int], sp: SamplingParams, fut: asyncio.Future[Any]) -> None:
        if sp.return_log_probs and not sp.skip_prompt_log_probs:
            raise AssertionError("Prompt log probs cannot be calculated if only last token logits are materialized.")
        req = FakeRequest(rid, list(prompt), sp, fut)
        if self.epoch is not None:
            req.policy_epoch = [(0, self.epoch)]
        self.requests[rid] = req

    def _schedule(self) -> None:
        new_epoch = None
        while self.inbox:
            msg = self.inbox.popleft()
            if msg[0] == "submit":
                self.add_request(*msg[1:])
            elif msg[0] == "epoch":
                new_epoch = msg[1]
            else:
                self.signals.append(msg[0])
        if new_epoch is not None:
            self.epoch = new_epoch
            for r in self.requests.values():
                total = len(r.prompt_tokens) + len(r.generated_tokens)
                r.policy_epoch = (r.policy_epoch or []) + [(total - 1, new_epoch)]
        if self.signals:
            sig = self.signals.popleft()
            st = self.state.name
            if sig == "pause" and st == "RUNNING":
                if self.counter_at_pause is not None:  # where megatron's consensus schedule stands when it arrives
                    self.consensus_counter = self.counter_at_pause
                self._set("PAUSING")
                self.events["RUNNING"].clear()
            elif sig == "unpause":
                assert st == "PAUSED", f"Received UNPAUSE in state {st}"
                self._set("UNPAUSING")
            elif sig == "suspend":
                assert st == "PAUSED", f"Received SUSPEND in state {st}"
                self.events["RESUMED"].clear()
                self.suspend_count += 1
                self._set("SUSPENDING")
            elif sig == "resume":
                assert st == "SUSPENDED", f"Received RESUME in state {st}"
                self.events["SUSPENDED"].clear()
                self._set("RESUMING")
            elif sig == "stop":
                self._set("STOPPING")

    def _finish(self, r: FakeRequest) -> None:
        r.status = SimpleNamespace(name="COMPLETED")
        del self.requests[r.request_id]
        if not r.future.done():
            r.future.set_result(r)

    def _step(self) -> list[FakeRequest]:
        finished = []
        for r in list(self.requests.values()):
            if r.request_id in self.stop_word_finished_request_ids:  # megatron's hook: finished, nothing appended
                self.stop_word_finished_request_ids.discard(r.request_id)
                self._finish(r)
                finished.append(r)
                continue
            tok = 3 + (len(r.prompt_tokens) + len(r.generated_tokens)) % self.token_span
            r.generated_tokens.append(tok)
            r.generated_log_probs.append(-0.25)
            if len(r.generated_tokens) >= r.sampling_params.num_tokens_to_generate:
                self._finish(r)
                finished.append(r)
        self.steps += 1
        self.stepped.set()
        return finished

    async def async_step(self) -> dict[str, Any]:
        """One decode step with megatron's result shape (see the module docstring)."""
        stepped = len(self.requests)
        finished = self._step()
        return {
            "active_request_ids": list(self.requests),
            "finished_request_records": finished,
            "step_time": 0.0,
            "cuda_graph_request_count": 1 << max(0, stepped - 1).bit_length(),
        }

    async def _work_or_pause(self, st: str) -> None:
        """One RUNNING or PAUSING iteration of megatron's loop: the consensus (whether any peer has work, whether
        every peer asked to pause) is taken again only when the last one saw no work or every
        ``consensus_interval`` iterations; then pause, step, join a peer's step with a dummy forward, or idle."""
        local = len(self.requests)
        peer = 1 if self.idle_dummy_forwards > 0 else 0  # an expert-parallel peer with work of its own
        if self.consensus[0] == 0 or self.consensus_counter % self.consensus_interval == 0:
            self.consensus = (max(local, peer), st == "PAUSING")
        work, all_pausing = self.consensus
        self.consensus_counter += 1
        if all_pausing:
            self._set("PAUSED")
            self.events["PAUSED"].set()
        elif work > 0 and not local:
            self.idle_dummy_forwards = max(0, self.idle_dummy_forwards - 1)
            self.controller.dummy_forward()
            self.steps += 1
            self.stepped.set()
        elif local and (self.allow_steps is None or self.allow_steps > 0):
            if self.allow_steps is not None:
                self.allow_steps -= 1
            if self.step_through_class:  # a loop that bypasses the engine object's attribute
                await type(self).async_step(self)
            else:
                await self.async_step()

    async def run(self) -> None:
        try:
            try:
                while True:
                    if self.die_with is not None:
                        raise self.die_with
                    self._schedule()
                    st = self.state.name
                    if st in ("RUNNING", "PAUSING"):
                        await self._work_or_pause(st)
                    elif st == "UNPAUSING":
                        self.consensus = (0, False)  # as megatron drops the PAUSING phase's cached consensus
                        self._set("RUNNING")
                        self.events["PAUSED"].clear()
                        self.events["RUNNING"].set()
                    elif st == "SUSPENDING":
                        self._set("SUSPENDED")
                        self.events["SUSPENDED"].set()
                    elif st == "RESUMING":
                        if self.reset_count_at_resume:  # as megatron's graph re-capture at a recompute resume
                            self.count_base = self.steps
                        self._set("PAUSED")
                        self.events["RESUMED"].set()
                    elif st == "STOPPING":
                        break
                    await asyncio.sleep(0.001)
            except Exception:
                sys.exit(1)  # what megatron's trace_async_exceptions does with an exception in the loop
        finally:
            self._set("STOPPED")
            for r in self.requests.values():
                if not r.future.done():
                    r.future.cancel()
            self.events["STOPPED"].set()


class FakeClient:
    def __init__(self, llm: FakeAsyncLLM) -> None:
        self._llm = llm
        self.epochs: list[int] = []

    def set_generation_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self._llm.engine.inbox.append(("epoch", epoch))


class FakeAsyncLLM:
    """``MegatronAsyncLLM(..., use_coordinator=True)``'s surface (see the module docstring)."""

    instances: list[FakeAsyncLLM] = []

    def __init__(self, *, model: Any, tokenizer: Any, inference_config: Any, use_coordinator: bool, **kw: Any) -> None:
        assert use_coordinator, "the coordinator adapter always asks for use_coordinator=True"
        self.inference_config = inference_config
        self.kwargs = kw
        self.engine = FakeEngine(int(tokenizer.eod))
        self.engine.token_span = max(1, min(20, int(getattr(tokenizer, "vocab_size", 23) or 23) - 3))  # in its vocab
        self.engine.consensus_interval = int(getattr(inference_config, "ep_consensus_interval", 20))
        self._next = 0
        ready = threading.Event()

        def run_loop() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            except SystemExit:
                pass  # the engine task's sys.exit ends this thread silently (threading's default for SystemExit)

        self.thread = threading.Thread(target=run_loop, daemon=True)
        self.thread.start()
        ready.wait(10)

        async def start() -> None:
            eng = self.engine
            eng.events = {k: asyncio.Event() for k in ("RUNNING", "PAUSED", "SUSPENDED", "RESUMED", "STOPPED")}
            eng.events["RUNNING"].set()
            eng.engine_loop_task = asyncio.get_running_loop().create_task(eng.run())

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self._coord_runtime = SimpleNamespace(client=FakeClient(self))
        FakeAsyncLLM.instances.append(self)

    async def _on_loop(self, coro: Any) -> Any:
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def generate(self, prompt: list[int], sp: SamplingParams) -> Any:
        async def impl() -> Any:
            fut = asyncio.get_running_loop().create_future()
            self._next += 1
            self.engine.inbox.append(("submit", self._next, prompt, sp, fut))
            return await fut

        return await self._on_loop(impl())

    async def _signal(self, sig: str, wait_for: str) -> None:
        async def impl() -> None:
            self.engine.inbox.append((sig,))
            await self.engine.wait_until(wait_for)

        await self._on_loop(impl())

    async def pause(self) -> None:
        if self.engine.free_at_pause and asyncio.get_running_loop() is self.loop:
            self.engine.allow_steps = None  # in the callback that sends PAUSE: no step between the two
        await self._signal("pause", "PAUSED")

    async def unpause(self) -> None:
        await self._signal("unpause", "RUNNING")

    async def suspend(self) -> None:
        await self._signal("suspend", "SUSPENDED")

    async def resume(self) -> None:
        await self._signal("resume", "RESUMED")

    async def shutdown(self) -> None:
        if self.engine.state.name == "RUNNING":
            await self.pause()
        await self._signal("stop", "STOPPED")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


__all__ = ["FakeAsyncLLM", "FakeClient", "FakeContext", "FakeEngine", "FakeRequest"]
