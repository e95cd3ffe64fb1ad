"""Where megatron-core's coordinator pause spends its decode steps, on the CPU, with megatron's own loop.

colo-fsm's coordinator engine parks its requests by calling megatron-core's ``MegatronAsyncLLM.pause()`` and then
``suspend()`` on megatron's event loop, and records the engine's decode steps from the first call to SUSPENDED
(``pause_steps``: 4 or 5 on one H200 at consensus interval 1). This bench runs that path on the CPU with
megatron-core 0.19.2's own code everywhere but the forward pass:

* its coordinator process (``DataParallelInferenceCoordinator``, spawned, real ZMQ), its ``InferenceClient`` and its
  event-loop thread (``_EventLoopManager``);
* ``MegatronAsyncLLM.pause``, ``suspend``, ``resume`` and ``unpause``, called as colo-fsm calls them
  (``call_on_loop``, the calls and states of ``SLEEP`` and ``WAKE``);
* the engine loop itself: ``DynamicInferenceEngine.run_engine_with_coordinator``, ``schedule_requests``,
  ``_ep_establish_consensus``, ``_world_barrier`` and ``wait_until``, run on a stand-in engine object whose decode
  step (``async_step``) sleeps ``--decode-ms`` around one ``await asyncio.sleep(0)``: the one yield megatron's
  default (legacy) decode step makes, after launching its forward and before sampling.

For each way of sending the pause it counts, per handoff, the decode steps finished between the call and PAUSE
leaving the client (``steps_at_send``), to PAUSED and to SUSPENDED (``pause_steps``, what colo-fsm records), and
``rounds_to_send``: the decode steps from the loop's first round that runs anything of the call to the send. That
round is read in the loop callback that starts the call (the task factory, as it makes the call's task; or the
callback itself), never from the calling thread, so a calling thread that waits for a core between reading the step
count and submitting the call moves ``steps_at_send``, not ``rounds_to_send``. The loop runs one decode step per
round, so that count is the rounds the call takes, whatever the phase of the step the call landed in;
``steps_at_send`` adds that phase (0 or 1 on a quiet machine, more where the calling thread waits for a core). The
ways:

* ``megatron``: colo-fsm's, megatron's public ``pause()`` then ``suspend()``. ``pause()`` runs on the loop and hands
  its body to the same loop again (``run_async``), so PAUSE leaves in the loop's fourth round;
* ``one-coroutine``: the client's ``pause_engines()`` and the engine's ``wait_until(PAUSED)`` in one coroutine
  (second round);
* ``callback``: ``pause_engines()`` as a plain callback on the loop, the wait apart (first round: 0 by construction,
  the callback both marks the round and sends; the reference the other two are read against);
* ``back-to-back``: PAUSE and SUSPEND in one callback. megatron's loop applies one signal per iteration and asserts
  PAUSED for SUSPEND: above interval 1 the SUSPEND finds PAUSING and the loop dies (its exception ends the loop's
  thread); the bench sends it right after a consensus, so the next one is ``interval - 1`` iterations away.

Usage::

    python bench/coordinator_pause_rounds.py            # intervals 1 and 20, 12 handoffs per way (~50 s)
    python bench/coordinator_pause_rounds.py --smoke    # interval 1, 4 handoffs per way, no back-to-back
    pip install 'colo-fsm[coordinator]'                 # pyzmq and msgpack, megatron's transport (in the dev extra)

Prints a table and writes ``bench/results/coordinator_pause_rounds.json`` after every section. Exits 1 when a way
other than ``back-to-back`` fails, and 0 with a message where pyzmq, msgpack or megatron-core is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "coordinator_pause_rounds.json"
WAYS = ("megatron", "one-coroutine", "callback", "back-to-back")
HEADLINE = {  # what bench/run_all.py --repeat reports as median and spread over the runs
    "megatron way: rounds to send, interval 1": "sections.0.ways.megatron.rounds_to_send_median",
    "megatron way: pause_steps, interval 1": "sections.0.ways.megatron.pause_steps_median",
    "one coroutine: pause_steps, interval 1": "sections.0.ways.one-coroutine.pause_steps_median",
    "callback: pause_steps, interval 1": "sections.0.ways.callback.pause_steps_median",
}
CALL_TIMEOUT_S = 30.0


def missing_dependencies() -> str | None:
    """What this bench needs and lacks (pyzmq, msgpack, megatron-core), in words; None when all are here."""
    import importlib.util

    needs = (("pyzmq", "zmq"), ("msgpack", "msgpack"), ("megatron-core", "megatron"))
    missing = [name for name, module in needs if importlib.util.find_spec(module) is None]
    return f"{' and '.join(missing)} not installed (pip install 'colo-fsm[coordinator,megatron]')" if missing else None


class LoopModel:
    """megatron's engine loop on a stand-in engine: the loop, the socket reads, the signal handling, the consensus
    and the waits are megatron's own methods; the decode step is a sleep with megatron's one yield in it."""

    def __init__(self, *, interval: int, cpu_s: float, gpu_s: float) -> None:
        from megatron.core.inference.engines.dynamic_engine import DynamicInferenceEngine, EngineState

        engine = DynamicInferenceEngine
        # megatron's own code, bound to this object
        self.run_engine_with_coordinator = engine.run_engine_with_coordinator.__get__(self)
        self.schedule_requests = engine.schedule_requests.__get__(self)
        self._ep_establish_consensus = engine._ep_establish_consensus.__get__(self)
        self._world_barrier = engine._world_barrier.__get__(self)
        self.wait_until = engine.wait_until.__get__(self)
        self.shutdown = engine.shutdown.__get__(self)
        # the state megatron's methods read and write (DynamicInferenceEngine.__init__ and its coordinator set-up)
        self._state_events = {k: asyncio.Event() for k in engine._STATE_EVENTS}
        self.state = EngineState.RUNNING
        self._state_events[EngineState.RUNNING].set()
        self._pending_signals: collections.deque[bytes] = collections.deque()
        self.requests: dict[int, Any] = {}
        self.waiting_request_ids: collections.deque[int] = collections.deque()
        self.disable_ep_consensus = False
        self.ep_world_size = 1
        self.ep_consensus_interval = interval
        self._ep_consensus_loop_counter = 0
        self._last_ep_consensus = (0, False)
        self.is_mp_coordinator = True
        self.rank = 0
        self.context = _Context()
        self.engine_loop_task: asyncio.Task[None] | None = None  # megatron's name; set once the loop runs
        self.cpu_s, self.gpu_s = cpu_s, gpu_s
        self.hold_until_delivered = False  # a test's hook, off in the bench (which measures where a PAUSE lands)
        self.undelivered = 0  # PAUSEs sent (Rig counts them) that the step under way has not yet seen arrive

    def connect(self, address: str) -> None:
        """Register with the coordinator as megatron's engine does (a DEALER named ``mp-coord-0``, one empty frame);
        the model-parallel publisher has no subscriber at tensor parallelism 1."""
        import zmq

        self.zmq_context = zmq.Context()
        self.socket_for_receiving_requests = self.zmq_context.socket(zmq.DEALER)
        self.socket_for_receiving_requests.setsockopt(zmq.IDENTITY, b"mp-coord-0")
        self.socket_for_receiving_requests.connect(address)
        self.socket_for_receiving_requests.send(b"")
        self.model_parallel_publisher_socket = self.zmq_context.socket(zmq.PUB)
        self.model_parallel_publisher_socket.bind_to_random_port("tcp://127.0.0.1")
        self.zmq_sockets = [self.socket_for_receiving_requests, self.model_parallel_publisher_socket]

    def suspend(self) -> None:
        """megatron offloads the KV cache here; nothing to offload."""

    def resume(self) -> None:
        """megatron restores the KV cache here; nothing to restore."""

    async def async_step(self) -> None:
        """One decode step: the launch, the one yield to the event loop, the rest, then the step count.

        With ``hold_until_delivered`` (a test's hook), a step under way when a PAUSE left the client ends only once
        megatron's coordinator process has forwarded it to this engine's socket (read without taking it, so
        megatron's loop still reads it itself): the delivery a quiet machine makes within the step, forced, however
        late a busy machine runs the coordinator process."""
        time.sleep(self.cpu_s)
        await asyncio.sleep(0)
        time.sleep(self.gpu_s)
        if self.hold_until_delivered and self.undelivered:
            import zmq

            if not self.socket_for_receiving_requests.poll(int(CALL_TIMEOUT_S * 1e3), zmq.POLLIN):
                raise RuntimeError(f"megatron's coordinator process forwarded no signal in {CALL_TIMEOUT_S:g} s")
            self.undelivered = 0
        self.context.step_count += 1


class _Context:
    """The two things megatron's loop reads of its context: active requests (always some) and the step count."""

    def __init__(self) -> None:
        self.step_count = 0

    def get_active_request_count(self) -> int:
        return 64


class Rig:
    """megatron's coordinator process, event loop, client and ``MegatronAsyncLLM`` around a :class:`LoopModel`."""

    def __init__(self, *, interval: int, cpu_s: float, gpu_s: float) -> None:
        from megatron.core.inference.apis._llm_base import _EventLoopManager
        from megatron.core.inference.apis.async_llm import MegatronAsyncLLM
        from megatron.core.inference.data_parallel_inference_coordinator import DataParallelInferenceCoordinator
        from megatron.core.inference.inference_client import InferenceClient

        spawn = multiprocessing.get_context("spawn")
        parent, child = spawn.Pipe()
        ready = spawn.Event()
        self.process = spawn.Process(
            target=DataParallelInferenceCoordinator.entrypoint,
            kwargs={
                "pipe_connection": child,
                "ready_event": ready,
                "data_parallel_size": 1,
                "tokenizer": None,
                "max_requests": 8,
                "hostname": "127.0.0.1",
            },
            daemon=True,
        )
        self.process.start()
        if not parent.poll(120):
            self.process.kill()
            raise RuntimeError("megatron's coordinator process sent no address in 120 s")
        address = parent.recv()
        self.manager = _EventLoopManager()
        self.manager.start()
        self.loop: asyncio.AbstractEventLoop = self.manager.loop
        self.engine = LoopModel(interval=interval, cpu_s=cpu_s, gpu_s=gpu_s)

        async def start() -> Any:
            self.engine.connect(address)
            if not ready.wait(120):
                raise RuntimeError("megatron's coordinator process was not ready in 120 s")
            client = InferenceClient(address, deserialize=True)
            client.start(loop=self.loop)
            self.engine.engine_loop_task = self.loop.create_task(
                self.engine.run_engine_with_coordinator(loop=self.loop)
            )
            return client

        self._mark: list[int] | None = None  # where the next call's first round goes (mark_first_round)
        self._watch: tuple[Any, list[int]] | None = None  # the coroutine whose task records it, and where
        self.late_by_steps = 0  # a hook: the calling thread waits this many decode steps before it submits the
        # first call of each handoff (the one mark_first_round marks)
        self.client = self.manager.run_sync(start())
        self.loop.call_soon_threadsafe(self.loop.set_task_factory, self._task_factory)
        self.sent: list[int] = []  # the step count each time PAUSE left the client
        pause_engines = self.client.pause_engines

        def recorded_pause() -> None:
            self.sent.append(self.engine.context.step_count)
            self.engine.undelivered += 1
            pause_engines()

        self.client.pause_engines = recorded_pause
        # megatron's own MegatronAsyncLLM, its coordinator runtime holding the client; no engine build
        self.llm = MegatronAsyncLLM.__new__(MegatronAsyncLLM)
        self.llm._loop_manager, self.llm._engine = self.manager, self.engine
        self.llm._is_primary_rank, self.llm._use_coordinator = True, True
        self.llm._coord_runtime = type("CoordinatorRuntime", (), {"client": self.client})()

    def mark_first_round(self, into: list[int]) -> None:
        """Have the next call (:meth:`call` or :meth:`call_soon`) append the step count to ``into`` in its first round
        on the loop, before anything of the call runs: read on the loop, whenever the calling thread gets to submit."""
        self._mark = into

    def _take_mark(self) -> list[int] | None:
        """The pending mark, taken for the call about to be submitted; where ``late_by_steps`` asks it, the calling
        thread first waits that many decode steps (a thread that waits for a core on a busy machine, forced)."""
        into, self._mark = self._mark, None
        if into is not None and self.late_by_steps:
            until, deadline = self.steps + self.late_by_steps, time.monotonic() + CALL_TIMEOUT_S
            while self.steps < until:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"megatron's engine loop took no {self.late_by_steps} steps in {CALL_TIMEOUT_S} s"
                    )
                time.sleep(0.001)
        return into

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        """The loop's task factory: the watched call's task records its first round as it is made (in the loop
        callback ``run_coroutine_threadsafe`` queued, the first thing of the call the loop runs)."""
        watch = self._watch
        if watch is not None and watch[0] is coro:
            self._watch = None
            watch[1].append(self.steps)
        return asyncio.Task(coro, loop=loop, **kwargs)

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on megatron's loop from this thread (``call_soon_threadsafe``); its round is marked as
        :meth:`mark_first_round` asked."""
        into = self._take_mark()

        def run() -> None:
            if into is not None:
                into.append(self.steps)
            callback()

        self.loop.call_soon_threadsafe(run)

    @property
    def steps(self) -> int:
        """The engine's decode steps so far (what colo-fsm reads as ``context.step_count``)."""
        return self.engine.context.step_count

    def died(self) -> BaseException | None:
        """The loop's end as an exception (read as colo-fsm's coordinator engine reads it), None while it runs."""
        from colo_fsm.adapters.megatron.coordinator_loop import loop_death

        why = loop_death(self.llm, self.loop)
        return None if why is None else RuntimeError(f"megatron's {why}")

    def call(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        """Run ``coro`` on megatron's loop as colo-fsm's coordinator engine does (``call_on_loop``)."""
        from colo_fsm.adapters.megatron.coordinator_loop import call_on_loop

        dead = self.died()
        if dead is not None:
            coro.close()
            raise dead
        try:
            into = self._take_mark()
        except BaseException:
            coro.close()
            raise
        if into is not None:
            self._watch = (coro, into)
        return call_on_loop(
            self.loop,
            coro,
            what,
            timeout_s=CALL_TIMEOUT_S,
            interval_s=0.05,
            died=self.died,
            state=lambda: str(self.engine.state),
        )

    def way(self, name: str) -> Callable[[], int | None]:
        """One handoff sent ``name``'s way; returns the step count at PAUSED (None where it is not awaited)."""
        from megatron.core.inference.engines.dynamic_engine import EngineState

        from colo_fsm.adapters.megatron.coordinator_states import SLEEP

        engine, client = self.engine, self.client

        async def send_and_wait(send: Callable[[], None], state: Any) -> None:
            send()
            await engine.wait_until(state)

        def megatron() -> int:
            at_paused = self.steps
            for call, want in SLEEP:
                self.call(getattr(self.llm, call)(), f"{call} (to {want})")
                if call == "pause":
                    at_paused = self.steps
            return at_paused

        def one_coroutine() -> int:
            self.call(send_and_wait(client.pause_engines, EngineState.PAUSED), "pause (to PAUSED)")
            at_paused = self.steps
            self.call(send_and_wait(client.suspend_engines, EngineState.SUSPENDED), "suspend (to SUSPENDED)")
            return at_paused

        def callback() -> int:
            self.call_soon(client.pause_engines)
            self.call(engine.wait_until(EngineState.PAUSED), "PAUSED")
            at_paused = self.steps
            self.call(send_and_wait(client.suspend_engines, EngineState.SUSPENDED), "suspend (to SUSPENDED)")
            return at_paused

        def back_to_back() -> None:
            async def right_after_a_consensus() -> None:
                interval = engine.ep_consensus_interval
                while engine._ep_consensus_loop_counter % interval != 1 % interval:
                    await asyncio.sleep(0)
                client.pause_engines()
                client.suspend_engines()

            self.call(right_after_a_consensus(), "PAUSE and SUSPEND sent")
            self.call(engine.wait_until(EngineState.SUSPENDED), "SUSPENDED")
            return None

        return {
            "megatron": megatron,
            "one-coroutine": one_coroutine,
            "callback": callback,
            "back-to-back": back_to_back,
        }[name]

    def wake(self) -> None:
        """Back to RUNNING the way colo-fsm resumes: megatron's ``resume()`` then ``unpause()``."""
        from colo_fsm.adapters.megatron.coordinator_states import WAKE

        for call, want in WAKE:
            self.call(getattr(self.llm, call)(), f"{call} (to {want})")

    def close(self) -> None:
        """Stop the engine loop, megatron's loop thread and the coordinator process."""
        from megatron.core.inference.engines.dynamic_engine import EngineState

        if self.died() is None:
            try:
                self.call(self.llm.pause(), "pause (to PAUSED)")
                self.client.stop_engines()
                self.call(self.engine.wait_until(EngineState.STOPPED), "STOPPED")
                self.client.shutdown_coordinator()
                self.manager.run_sync(_stop_client(self.client))
                self.manager.stop()
            except Exception as exc:  # the figures are taken; say why the teardown was cut
                print(f"  (teardown: {type(exc).__name__}: {exc})")
        else:  # megatron's loop has ended: close it and its client here, or they hold the process at exit
            try:
                self._close_dead_loop()
            except Exception as exc:  # the client and the coordinator process are closed all the same
                print(f"  (teardown: {type(exc).__name__}: {exc})")
            self.client.shutdown_coordinator()
            self.client.socket.close(linger=0)
            self.client.context.term()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)

    def _close_dead_loop(self) -> None:
        """megatron's engine loop has ended: its loop thread is let end (megatron's ``sys.exit`` ends it; a loop still
        running is stopped), then what the loop left pending (the client's listener, a call queued just before the
        end) is cancelled and the loop closed here, so none of it is destroyed pending at exit."""
        task = self.engine.engine_loop_task
        exited = task is not None and task.done() and not task.cancelled() and isinstance(task.exception(), SystemExit)
        thread = self.manager._thread
        if not exited and self.loop.is_running():  # the engine loop returned or was cancelled; its thread runs on
            self.manager.stop()  # the running loop takes the stop itself, and its thread ends
        elif thread is not None:  # megatron's sys.exit has left (or is leaving) run_forever; the thread ends with it
            thread.join(CALL_TIMEOUT_S)
        if thread is not None and thread.is_alive():
            raise RuntimeError(f"megatron's loop thread did not end in {CALL_TIMEOUT_S:g} s")
        self.loop.run_until_complete(asyncio.sleep(0))  # callbacks queued before the end become tasks
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for left in pending:
            left.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


async def _stop_client(client: Any) -> None:
    """megatron's client stopped on its own loop (it cancels its listener task there)."""
    client.stop()


def measure_way(rig: Rig, name: str, handoffs: int) -> dict[str, Any]:
    """``handoffs`` handoffs sent ``name``'s way, each after a stretch of decoding of its own length (so each starts
    at another point of a decode step), with a wake after each."""
    at_send: list[int] = []
    rounds: list[int] = []
    to_paused: list[int] = []
    to_suspended: list[int] = []
    wall_ms: list[float] = []
    failure: str | None = None
    send = rig.way(name)
    for i in range(handoffs):
        time.sleep(0.05 + 0.0137 * i)
        sent_before, before = len(rig.sent), rig.steps
        first_round: list[int] = []
        rig.mark_first_round(first_round)
        t0 = time.perf_counter()
        try:
            at_paused = send()
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            break
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        to_suspended.append(rig.steps - before)
        if at_paused is not None:
            to_paused.append(at_paused - before)
        if len(rig.sent) > sent_before:
            at_send.append(rig.sent[-1] - before)
            rounds.append(rig.sent[-1] - first_round[0])
        rig.wake()
    row: dict[str, Any] = {
        "handoffs": len(to_suspended),
        "rounds_to_send": rounds,
        "steps_at_send": at_send,
        "steps_to_paused": to_paused,
        "pause_steps": to_suspended,
        "wall_ms": [round(x, 2) for x in wall_ms],
        "failure": failure,
    }
    for key in ("rounds_to_send", "steps_at_send", "steps_to_paused", "pause_steps", "wall_ms"):
        row[f"{key}_median"] = statistics.median(row[key]) if row[key] else None
    return row


def run_section(interval: int, ways: list[str], handoffs: int, cpu_s: float, gpu_s: float) -> dict[str, Any]:
    """Every way at one consensus interval; ``back-to-back`` last and on a rig of its own (it may kill the loop)."""
    section: dict[str, Any] = {"interval": interval, "ways": {}}
    safe = [w for w in ways if w != "back-to-back"]
    if safe:
        rig = Rig(interval=interval, cpu_s=cpu_s, gpu_s=gpu_s)
        try:
            for name in safe:
                section["ways"][name] = measure_way(rig, name, handoffs)
        finally:
            rig.close()
    if "back-to-back" in ways:
        rig = Rig(interval=interval, cpu_s=cpu_s, gpu_s=gpu_s)
        try:
            row = measure_way(rig, "back-to-back", 1 if interval > 1 else handoffs)
            dead = rig.died()
            row["loop_died"] = None if dead is None else str(dead)
            section["ways"]["back-to-back"] = row
        finally:
            rig.close()
    return section


def table(sections: list[dict[str, Any]]) -> str:
    """The printed table: one row per interval and way."""
    lines = [
        "| interval | way | handoffs | rounds to send | steps at send | steps to PAUSED | pause_steps | ms to SUSPENDED "
        "| outcome |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict[str, Any], key: str) -> str:
        values = row[key]
        return f"{row[f'{key}_median']:g} ({min(values)}-{max(values)})" if values else "-"

    for section in sections:
        for name, row in section["ways"].items():
            ms = f"{row['wall_ms_median']:.1f}" if row["wall_ms_median"] is not None else "-"
            outcome = row.get("loop_died") or row["failure"] or "ok"
            lines.append(
                f"| {section['interval']} | {name} | {row['handoffs']} | {cell(row, 'rounds_to_send')} | "
                f"{cell(row, 'steps_at_send')} | "
                f"{cell(row, 'steps_to_paused')} | {cell(row, 'pause_steps')} | {ms} | {outcome} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the sections, print the table, write the JSON; 1 when a way other than back-to-back failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", type=int, nargs="+", default=[1, 20], help="consensus intervals (default 1 20)")
    ap.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    ap.add_argument("--handoffs", type=int, default=12, help="handoffs per way and interval (default 12)")
    ap.add_argument(
        "--decode-ms",
        default="1,4",
        help="a decode step's milliseconds before and after its yield (default 1,4: launch, then the rest)",
    )
    ap.add_argument("--smoke", action="store_true", help="interval 1, 4 handoffs per way, no back-to-back")
    ap.add_argument("--json", type=Path, default=RESULTS, help=f"where the JSON goes (default {RESULTS})")
    args = ap.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        ap.error(f"--ways: {', '.join(unknown)} unknown; expected some of {', '.join(WAYS)}")
    try:
        cpu_ms, gpu_ms = (float(x) for x in args.decode_ms.split(","))
    except ValueError:
        ap.error(f"--decode-ms: {args.decode_ms!r} is not two numbers (milliseconds before and after the yield)")
    if cpu_ms < 0 or gpu_ms < 0:
        ap.error(f"--decode-ms: {args.decode_ms!r} has a negative time; expected two numbers >= 0")
    if args.handoffs < 1:
        ap.error(f"--handoffs: {args.handoffs} is not a count; expected 1 or more")
    if args.smoke:
        args.intervals, args.handoffs = [1], 4
        ways = [w for w in ways if w != "back-to-back"]
    why = missing_dependencies()
    if why:
        print(f"coordinator_pause_rounds: skipped, {why}")
        return 0
    from importlib.metadata import version

    from bench._handoff import JsonReport
    from bench._provenance import provenance

    out: dict[str, Any] = {
        "bench": "coordinator_pause_rounds",
        "provenance": provenance(),  # commit, date, machine, load at the start
        "megatron_core": version("megatron-core"),
        "decode_ms_before_and_after_yield": [cpu_ms, gpu_ms],
        "loadavg_end": None,
        "sections": [],
    }
    failed = False
    for interval in args.intervals:
        section = run_section(interval, ways, args.handoffs, cpu_ms / 1e3, gpu_ms / 1e3)
        out["sections"].append(section)
        failed |= any(row["failure"] for name, row in section["ways"].items() if name != "back-to-back")
        out["loadavg_end"] = os.getloadavg()
        JsonReport(args.json, out).write()
    print(f"megatron-core {out['megatron_core']}, decode step {cpu_ms:g} + {gpu_ms:g} ms around its one yield")
    print(table(out["sections"]))
    print(f"JSON: {args.json}")
    if failed:
        print("FAILED: a way other than back-to-back did not reach SUSPENDED (the table's outcome column)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
