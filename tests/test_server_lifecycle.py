"""A real Lifecycle (recording fakes) driving the collector and the OpenAI-compatible server through several
steps, with external clients hammering the server: every request is answered, none is admitted outside
Generating/Validating, none runs while the engine is suspended. Also: URLs published by the lifecycle, the
URL gather across DP ranks over gloo, and nemo-gym's client where it installs."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import time

import openai

from colo_fsm import CheckpointDecision, Lifecycle, LifecycleConfig, State, ValidationDecision
from colo_fsm.adapters.protocols import Completion
from colo_fsm.collector import AsyncCollector, ReplayBuffer, TextRollout
from colo_fsm.errors import ServerUnavailable
from colo_fsm.guards.capacity import InFlightCap
from colo_fsm.machine.trace import TraceRecord
from colo_fsm.server import GatedEngine, ServedSpan, SuspendGate, gather_base_urls, overlaps
from colo_fsm.testing.fakes import RecordingEngine, recording_adapters
from tests.support.procs import rank_context

SERVING = (State.GENERATING, State.VALIDATING)


class StateCheckingGenerator:
    """Echo generator that records the lifecycle state and engine condition around every call."""

    def __init__(self, engine: RecordingEngine, delay: float) -> None:
        self.engine = engine
        self.delay = delay
        self.lc: Lifecycle | None = None
        self.bad: list[str] = []

    def generate(self, prompts, *, max_tokens, temperature=0.0, seed=None):  # type: ignore[no-untyped-def]
        if self.engine.condition != "awake":
            self.bad.append(f"start: engine {self.engine.condition}")
        time.sleep(self.delay)
        if self.engine.condition != "awake":
            self.bad.append(f"end: engine {self.engine.condition}")
        v = self.lc.weight_version if self.lc else 0
        return [Completion(f"ok:{p}"[:20], (1, 2), v) for p in prompts]


def serving_windows(records: list[TraceRecord]) -> list[tuple[float, float]]:
    """Wall-clock windows in which the machine may have been in Generating or Validating (conservative)."""
    recs = sorted(records, key=lambda r: r.seq)
    out = []
    for r, nxt in itertools.zip_longest(recs, recs[1:]):
        if r.dest in (State.GENERATING.value, State.VALIDATING.value):
            out.append((r.t_start, nxt.t_enter if nxt is not None else float("inf")))
    return out


def admitted_outside(served: list[ServedSpan], windows: list[tuple[float, float]]) -> list[ServedSpan]:
    """The spans whose admitting predicate read cannot have fallen in any window.

    The predicate read the state at some instant in ``[checked, admitted]``; a span is outside only when that whole
    interval misses every window (a single stamp would race with a transition that lands between the read and it).
    """
    return [s for s in served if not any(s.checked <= b and a <= s.admitted for a, b in windows)]


def test_admission_check_holds_when_a_transition_lands_between_the_read_and_the_stamp() -> None:
    """Forced: the state leaves serving right after the predicate read it, before the gate stamps the admission.
    The interval check accepts that request (its read was inside the window); a stamp-only check would not."""
    serving = {"now": True}
    window_start = time.time()
    window: list[tuple[float, float]] = []

    def admit() -> bool:
        seen = serving["now"]
        if seen and not window:  # the transition lands here: after the read, before the gate's stamp
            serving["now"] = False
            window.append((window_start, time.time()))
            time.sleep(0.002)
        return seen

    gate = SuspendGate(is_open=True, admit=admit, record=True)
    with gate.admit(timeout=1):
        pass
    (span,) = gate.served
    assert span.admitted > window[0][1]  # the single stamp lies past the window's end
    assert admitted_outside(gate.served, window) == []
    # and the check can fail: a span whose whole interval lies past the window is reported
    late = ServedSpan(window[0][1] + 1.0, window[0][1] + 2.0, 0.0, window[0][1] + 0.5)
    assert admitted_outside([late], window) == [late]


def test_lifecycle_collector_and_server_through_several_steps() -> None:
    journal, inner, trainer, _, drain = recording_adapters()
    gen = StateCheckingGenerator(inner, delay=0.01)
    gated = GatedEngine(inner, gen, serve=True, record=True, request_timeout_s=30.0)
    buffer = ReplayBuffer(4, 1)
    holder: dict[str, Lifecycle] = {}
    rollout = TextRollout(gated, lambda p, c: float(len(c.text)), samples_per_group=2, max_tokens=4)
    collector = AsyncCollector(
        rollout,
        (f"q{i}" for i in itertools.count()),
        buffer,
        lambda: holder["lc"].weight_version,
        cap=InFlightCap(4, 1, samples_per_group=2),
        admit=lambda: holder["lc"].state is State.GENERATING,
    )
    published: list[list[str]] = []
    validations: list[int] = []

    def validator(step: int, version: int) -> dict[str, float]:
        validations.append(version)  # the engine is awake, the collector paused: validation may generate
        return {"len": float(len(gated.generate(["v"], max_tokens=2)[0].text))}

    real_train = trainer.train_step
    waiters: list[threading.Thread] = []

    forced: list[str] = []  # how each forced waiting request ended

    def wait_at_the_gate() -> None:
        try:
            gated.generate(["w"], max_tokens=1)
            forced.append("answered")
        except ServerUnavailable:
            forced.append("stopping" if gated.stopping else "unavailable")

    def slow_train(batch):  # type: ignore[no-untyped-def]
        # every step: a request is waiting at the closed gate before the trainer's 50 ms begin (forced, so some
        # request surely waits across a handoff however the machine schedules the clients)
        waiting = threading.Thread(target=wait_at_the_gate, daemon=True)
        waiters.append(waiting)
        waiting.start()
        deadline = time.monotonic() + 10
        while gated.gate.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert gated.gate.waiting >= 1, "the forced request never reached the closed gate"
        time.sleep(0.05)
        return real_train(batch)

    trainer.train_step = slow_train  # type: ignore[method-assign]
    lc = holder["lc"] = Lifecycle(
        gated,
        trainer,
        collector,
        config=LifecycleConfig(num_steps=5),
        drain=drain,
        checkpoint=CheckpointDecision(2),
        validation=ValidationDecision(3),
        validator=validator,
        checkpoint_extra=lambda: {"replay_buffer": buffer.state_dict()},
        server_urls_sink=published.append,
    )
    gen.lc = lc
    gated.attach_status(lc.status)
    gated.attach_admit(lambda: lc.state in SERVING)

    stop = threading.Event()
    answers: list[tuple[float, float, str]] = []
    served_clients: set[int] = set()
    errors: list[BaseException] = []

    def external_client(k: int) -> None:
        c = openai.OpenAI(base_url=lc.dp_openai_server_base_urls[0], api_key="x", max_retries=0, timeout=30)
        for i in itertools.count():
            if stop.is_set():
                return
            t0 = time.time()
            try:
                if i % 2:
                    r = c.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": f"{k}-{i}"}], max_tokens=4
                    )
                    answers.append((t0, time.time(), r.choices[0].message.content or ""))
                else:
                    r2 = c.completions.create(model="policy", prompt=f"{k}-{i}", max_tokens=4)
                    answers.append((t0, time.time(), r2.choices[0].text))
                served_clients.add(k)
            except BaseException as exc:  # any failure is a lost request
                errors.append(exc)
                return

    try:
        lc.start()
        assert lc.dp_openai_server_base_urls == gated.server_base_urls() and published == [
            lc.dp_openai_server_base_urls
        ]
        clients = [threading.Thread(target=external_client, args=(k,)) for k in range(6)]
        for t in clients:
            t.start()
        while not lc.finished:
            batch = buffer.sample(lc.weight_version, timeout=30)
            assert all(0 <= g.age(lc.weight_version) <= 1 for g in batch)
            time.sleep(0.05)  # let external requests in while Generating
            if trainer.steps == 4:  # before the last step, every client has been served (bounded: load sets when)
                deadline = time.monotonic() + 30
                while len(served_clients) < 6 and not errors and time.monotonic() < deadline:
                    time.sleep(0.01)
            lc.step(batch)
        time.sleep(0.1)  # Done: the engine stays suspended; requests wait
        stop.set()
        lc.stop()  # teardown closes the gate; waiting requests get 503 (counted separately below)
        for t in [*clients, *waiters]:
            t.join(30)
    finally:
        stop.set()
        collector.close()
    # the forced waiters of steps 1-4 were answered after their resume; step 5's waited into Done (the engine
    # stays suspended there) and was answered 503 by the teardown, never left hanging
    assert sorted(forced) == ["answered"] * 4 + ["stopping"], forced
    assert lc.state is State.STOPPED and trainer.steps == 5 and validations == [3]
    assert inner.builds == 1  # the engine (and server) came up once
    assert gen.bad == []  # no generation while the engine was not awake
    # none lost: every request that started before the run ended got an answer (the run's end is Done/Stopped)
    lost = [e for e in errors if not (isinstance(e, openai.APIStatusError) and e.status_code == 503)]
    # every client was served at least once (waited for before the last step: how many times, and how soon, depends
    # on machine load, so no throughput bound here)
    assert lost == [] and served_clients == set(range(6))
    served = gated.gate.served
    assert len(served) >= len(answers)
    assert overlaps(served, gated.gate.closed_periods()) == []  # none ran while suspended
    windows = serving_windows(lc.trace.records)
    outside = admitted_outside(served, windows)
    assert outside == [], f"admitted outside Generating/Validating: {outside[:3]}"
    # requests did wait across handoffs: some waited at least one training step (train_step hangs 50 ms)
    assert max(s.waited_s for s in served) >= 0.04


def test_lifecycle_publishes_server_urls_without_serving() -> None:
    _, inner, trainer, collector, drain = recording_adapters()
    gated = GatedEngine(inner, StateCheckingGenerator(inner, 0.0))
    lc = Lifecycle(gated, trainer, collector, config=LifecycleConfig(num_steps=1), drain=drain)
    lc.start()
    assert lc.dp_openai_server_base_urls == []
    lc.stop()


def _gather_rank(rank: int, port: int, q) -> None:  # type: ignore[no-untyped-def]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        q.put((rank, gather_base_urls(f"http://127.0.0.1:{9000 + rank}/v1" if rank != 1 else None)))
    finally:
        dist.destroy_process_group()


def test_base_urls_gathered_across_dp_ranks_over_gloo() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = rank_context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_gather_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    # rank 1 serves nothing (e.g. not the first rank of its DP replica): left out, order kept
    assert got == {0: ["http://127.0.0.1:9000/v1"], 1: ["http://127.0.0.1:9000/v1"]}
    assert gather_base_urls("http://a/v1") == ["http://a/v1"] and gather_base_urls(None) == []


# nemo-gym's own clients (in their Python 3.13 venv) are driven by tests/test_server_nemo_gym.py.


def test_nemo_gym_shaped_requests_retry_through_a_suspend() -> None:
    """What nemo-gym's client does (read from its 0.4.0 source): aiohttp, a Bearer header, GET {base}/models,
    POST {base}/chat/completions, and on 429/5xx a retry after 0.5 s (503 counts as a rate limit and does not
    use up tries). Our 503 while suspended therefore turns into a wait, not a failure."""
    import aiohttp

    engine = RecordingEngine()
    gated = GatedEngine(engine, StateCheckingGenerator(engine, 0.0), serve=True, request_timeout_s=0.2)
    gated.bring_up()
    base = gated.server_base_urls()[0]

    async def gym_like() -> tuple[list[int], dict, dict]:
        statuses: list[int] = []
        headers = {"Authorization": "Bearer x"}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/models", headers=headers) as r:
                models = await r.json()
            while True:
                async with session.post(
                    f"{base}/chat/completions",
                    headers=headers,
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                ) as r:
                    statuses.append(r.status)
                    if r.status in (429, 500, 502, 503, 504, 520):
                        await asyncio.sleep(0.5)
                        continue
                    return statuses, models, await r.json()

    try:
        gated.suspend()
        threading.Timer(0.6, gated.resume).start()
        statuses, models, body = asyncio.run(gym_like())
    finally:
        gated.shutdown()
    assert models["data"][0]["id"] == "colo-fsm"
    assert statuses[0] == 503 and statuses[-1] == 200
    assert body["choices"][0]["message"]["content"].startswith("ok:")
