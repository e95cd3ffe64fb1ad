"""Continuous batching per rank: one engine thread steps every active request together (engine-agnostic).

Requests from rollouts, the server and validation are submitted one by one (:meth:`ContinuousBatcher.submit`)
and admitted between decode steps, training first (:class:`Priority`), at most ``max_active_requests`` at a
time; each caller waits on its own future. There is no global generate lock: a request never waits for another
caller's batch to finish.

A handoff stops *decode steps*, not requests (:attr:`~colo_fsm.states.rules.LifecycleRule.PARK_NOT_DRAIN`):
:meth:`ContinuousBatcher.suspend` returns once the step in flight has finished and the backend is suspended;
the active requests stay parked in the backend and continue after :meth:`ContinuousBatcher.resume` under the new
weights. Every generated token is stamped with the weight version it was produced under.
:attr:`InflightPolicy.DRAIN` restores the strictly on-policy behaviour (suspend waits for admitted requests).

Every backend call (build, add, step, abort, suspend, resume, shutdown) runs on the engine thread, so a
backend needs no locking of its own and an engine with its own event loop (megatron-core's dynamic engine) is
only ever driven from one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from colo_fsm.adapters.lockstep import (
    FEED_ID_BASE,
    LOCKSTEP_HEARTBEAT_S,
    CarriedRequest,
    Lockstep,
    StepPlan,
    room_for,
)
from colo_fsm.errors import ConfigError, EngineStopped, LifecycleError, RequestTooLarge
from colo_fsm.log import get_logger

log = get_logger(__name__)


class Priority(IntEnum):
    """Admission order between decode steps: lower value is admitted first."""

    TRAINING = 0  # the trainer's own rollouts and validation
    SERVER = 1  # HTTP traffic


class InflightPolicy(StrEnum):
    """What a suspend does with admitted requests."""

    PARK = "park"  # stop at a decode-step boundary, requests kept in the engine (default)
    DRAIN = "drain"  # close admission and wait until every admitted request finished (strictly on-policy)


def parse_inflight(value: Any) -> InflightPolicy:
    """``value`` as an :class:`InflightPolicy`; anything else raises :class:`ConfigError` naming the choices."""
    try:
        return InflightPolicy(str(value.value if isinstance(value, StrEnum) else value).lower())
    except ValueError:
        raise ConfigError("inflight", value, "one of 'park', 'drain'") from None


# ---------------------------------------------------------------------------------------------- backend protocol
@dataclass(frozen=True)
class BackendRequest:
    """What a backend needs to generate one request: ids, length bound and sampling settings."""

    request_id: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    top_logprobs: int = 0  # alternatives to record per generated token (0: none)


TopLogprobs = tuple[tuple[int, float], ...]
"""One generated token's most likely alternatives: ``(token_id, logprob)`` pairs, most likely first."""


@dataclass(frozen=True)
class StepOutput:
    """New tokens of one request from one decode step; ``finished`` is "stop"/"length" when the backend ended it.

    ``top_logprobs`` has one entry per new token when the request asked for alternatives (else it is empty).
    """

    request_id: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finished: str | None = None
    top_logprobs: tuple[TopLogprobs, ...] = ()


@runtime_checkable
class StepBackend(Protocol):
    """One engine, driven request by request from the engine thread (CPU loop or megatron's dynamic engine)."""

    name: str

    def add(self, request: BackendRequest) -> None:
        """Admit a request; it takes part in the next :meth:`step`."""

    def step(self) -> Sequence[StepOutput]:
        """Run one decode step over every active request; new tokens per request (prefill counts as a step)."""

    def abort(self, request_id: int) -> None:
        """Drop a request (a no-op for an unknown or finished one); nothing else is disturbed."""

    def suspend(self) -> float:
        """Suspend with the active requests kept (KV per the engine's mode); seconds taken."""

    def resume(self) -> float:
        """Resume; the kept requests continue at the next :meth:`step`. Seconds taken."""

    def shutdown(self) -> None:
        """Tear down (every request is dropped)."""


# ---------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class TokenCompletion:
    """A generated continuation with per-token log-probs and the weight version each token was generated under."""

    request_id: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # behaviour log-probs, recorded when each token was generated
    weight_versions: tuple[int, ...]  # one per token
    text: str
    finish_reason: str  # "stop" (eod / stop token / on_token returned False), "length" or "abort"
    admitted_version: int = 0  # the weight version when the request was admitted
    top_logprobs: tuple[TopLogprobs, ...] = ()  # per token, when asked: its top alternatives (token_id, logprob)

    @property
    def first_weight_version(self) -> int:
        """Version of the first token (the admission version if none was generated)."""
        return self.weight_versions[0] if self.weight_versions else self.admitted_version

    @property
    def last_weight_version(self) -> int:
        """Version of the last token (the admission version if none was generated)."""
        return self.weight_versions[-1] if self.weight_versions else self.admitted_version

    @property
    def weight_version(self) -> int:
        """The oldest version that produced a token: what a trajectory's age is counted from."""
        return min(self.weight_versions) if self.weight_versions else self.admitted_version

    @property
    def version_span(self) -> int:
        """``last_weight_version - first_weight_version`` (> 0 for a request that spanned a training step)."""
        return self.last_weight_version - self.first_weight_version


class RequestCounts(NamedTuple):
    """Requests waiting for admission, being decoded, and parked in a suspended engine."""

    queued: int
    running: int
    parked: int


OnToken = Callable[..., "bool | None"]
"""``on_token(token_id, logprob, weight_version)``; a request submitted with ``top_logprobs > 0`` gets a fourth
argument, that token's :data:`TopLogprobs`."""

DEFAULT_MAX_TOP_LOGPROBS = 20
"""The default bound of ``top_logprobs`` per request (OpenAI's own limit)."""


@dataclass(eq=False)
class _Request:
    """The batcher's mutable record of one request (owned by the engine thread once admitted)."""

    backend: BackendRequest
    priority: int
    seq: int
    stop_token_ids: frozenset[int]
    on_token: OnToken | None
    future: concurrent.futures.Future[TokenCompletion]
    state: str = "queued"  # queued -> running -> done
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tops: list[TopLogprobs] = field(default_factory=list)
    admitted_version: int = 0
    admitted_step: int | None = None
    detached: bool = False  # lockstep follower: the caller got "abort", the row runs on in step with the leader
    fed: bool = False  # submitted on the TP group's leader alone: the lockstep carries it to the followers
    finish_reason: str | None = None
    completion: TokenCompletion | None = None

    @property
    def request_id(self) -> int:
        return self.backend.request_id


class RequestHandle:
    """A submitted request: its id and future (``future.cancel()`` and :meth:`cancel` abort it in the engine)."""

    def __init__(self, batcher: ContinuousBatcher, request: _Request) -> None:
        self._batcher = batcher
        self._request = request
        self.request_id = request.request_id
        self.future = request.future

    @property
    def admitted_step(self) -> int | None:
        """The engine step count when the request was admitted (None while queued): shows admission order."""
        return self._request.admitted_step

    def cancel(self) -> bool:
        """Abort the request in the engine; the future resolves with ``finish_reason="abort"``. False if done."""
        return self._batcher.abort(self.request_id)

    def done(self) -> bool:
        """Whether the request finished (any reason) or was cancelled."""
        return self.future.done()

    def result(self, timeout: float | None = None) -> TokenCompletion:
        """Wait for the completion; a cancelled future gives the partial completion with finish "abort"."""
        try:
            return self.future.result(timeout)
        except concurrent.futures.CancelledError:
            return self._batcher._completion_of(self._request, "abort")

    async def wait(self) -> TokenCompletion:
        """Await the completion from asyncio code (same semantics as :meth:`result`).

        Cancelling the awaiting task (e.g. an HTTP client disconnected) cancels the future, which aborts the
        request in the engine; the task's cancellation is then re-raised as usual.
        """
        try:
            return await asyncio.wrap_future(self.future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled: the request was aborted through the future
            return self._batcher._completion_of(self._request, "abort")  # someone else cancelled the future


@dataclass
class _Command:
    kind: str  # "suspend" | "resume" | "shutdown"
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    drain: bool = False


def request_seed(seed: int | None, index: int) -> int | None:
    """The seed of the ``index``-th request of a call seeded ``seed``: distinct per request and per call seed."""
    if seed is None:
        return None
    return (int(seed) * 0x9E3779B1 + (index + 1) * 0x85EBCA77) % (2**63)


def _positive_int(name: str, value: Any, what: str = "a positive integer") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, what)
    return value


def check_top_logprobs(top_logprobs: Any, limit: int) -> int:
    """``top_logprobs`` as an int in [0, ``limit``]; anything else raises :class:`ConfigError` naming the limit."""
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= limit:
        raise ConfigError("top_logprobs", top_logprobs, f"an integer in [0, {limit}] (max_top_logprobs)")
    return top_logprobs


def check_sampling(temperature: Any, top_p: Any, top_k: Any, seed: Any) -> None:
    """Raise :class:`ConfigError` naming the first sampling value a backend cannot use."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not math.isfinite(temperature):
        raise ConfigError("temperature", temperature, "a finite number >= 0")
    if temperature < 0:
        raise ConfigError("temperature", temperature, "a finite number >= 0")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0:
        raise ConfigError("top_p", top_p, "a number in (0, 1]")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError("top_k", top_k, "an integer >= 0 (0: no top-k filtering)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError("seed", seed, "a non-negative integer or None")


class ContinuousBatcher:
    """The per-rank engine loop over a :class:`StepBackend` (built on the engine thread by ``backend_factory``).

    ``weight_version`` is read at every step and stamped on that step's tokens. ``device_context`` (a callable
    returning a context manager) wraps the engine thread, e.g. to make this rank's GPU current there.
    ``lockstep`` (tensor-parallel ranks) makes every rank of the group follow the leader's plan of each
    iteration (:mod:`colo_fsm.adapters.lockstep`); submissions and control calls must then be SPMD.
    ``max_top_logprobs`` bounds the alternatives per token one request may ask for.
    """

    def __init__(
        self,
        backend_factory: Callable[[], StepBackend],
        *,
        weight_version: Callable[[], int] | None = None,
        max_active_requests: int = 64,
        inflight: InflightPolicy | str = InflightPolicy.PARK,
        max_sequence_length: int | None = None,
        detokenize: Callable[[Sequence[int]], str] | None = None,
        device_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        name: str = "colo-fsm-engine",
        lockstep: Lockstep | None = None,
        lockstep_wait_s: float = 300.0,
        max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS,
    ) -> None:
        self._factory = backend_factory
        self._lockstep = lockstep  # TP > 1: the group's leader plans every iteration (colo_fsm.adapters.lockstep)
        self._lockstep_wait_s = float(lockstep_wait_s)
        self._weight_version = weight_version or (lambda: 0)
        self.max_active_requests = _positive_int("max_active_requests", max_active_requests)
        self.inflight = parse_inflight(inflight)
        if isinstance(max_top_logprobs, bool) or not isinstance(max_top_logprobs, int) or max_top_logprobs < 0:
            raise ConfigError("max_top_logprobs", max_top_logprobs, "a non-negative integer")
        self.max_top_logprobs = max_top_logprobs
        self.max_sequence_length = max_sequence_length
        self._detokenize = detokenize or (lambda ids: "")
        self._device_context = device_context or contextlib.nullcontext
        self._name = name
        self._cond = threading.Condition(threading.RLock())
        self._ids = itertools.count()
        self._feed_ids = itertools.count(FEED_ID_BASE)  # leader-only requests (feed=True): ids of their own
        self._seq = itertools.count()
        self._queue: list[_Request] = []  # waiting for admission (kept sorted by (priority, seq))
        self._active: dict[int, _Request] = {}  # admitted, in the backend (running, or parked while suspended)
        self._pending_aborts: list[int] = []  # admitted requests aborted by a caller: backend.abort at next boundary
        self._commands: deque[_Command] = deque()
        self._draining = False  # a drain-mode suspend closed admission
        self._awake = False
        self._stopping = False
        self._stopped = False
        self._decode_in_flight = False
        self._thread: threading.Thread | None = None
        self.backend: StepBackend | None = None
        self.steps = 0  # decode steps run so far
        self.steps_while_suspended = 0  # must stay 0: a decode step never runs while suspended
        self.completed = 0  # requests resolved (any finish reason)
        self.timings: list[tuple[str, float]] = []  # ("suspend"|"resume", backend seconds)

    # ------------------------------------------------------------------ lifecycle of the loop
    def start(self) -> None:
        """Start the engine thread, build the backend on it and wait for the build (its error is re-raised)."""
        if self._thread is not None:
            raise LifecycleError("ContinuousBatcher.start called twice")
        built: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(built,), name=self._name, daemon=True)
        self._thread.start()
        built.result()

    @property
    def awake(self) -> bool:
        """True while requests are being decoded (not suspended, not shut down)."""
        return self._awake and not self._stopped

    @property
    def stopped(self) -> bool:
        """True once :meth:`shutdown` began: new requests are refused."""
        return self._stopping or self._stopped

    @property
    def decode_in_flight(self) -> bool:
        """True only while a decode step runs on the engine thread."""
        return self._decode_in_flight

    def counts(self) -> RequestCounts:
        """Queued, running and parked requests right now."""
        with self._cond:
            n = len(self._active)
            return RequestCounts(len(self._queue), n if self._awake else 0, 0 if self._awake else n)

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        priority: Priority | int = Priority.TRAINING,
        on_token: OnToken | None = None,
        top_logprobs: int = 0,
        feed: bool = False,
    ) -> RequestHandle:
        """Queue one request; it is admitted at the next step boundary (after resume if suspended).

        ``feed=True`` (tensor-parallel leader only): this rank alone submits the request and the lockstep carries
        it to the group's other ranks (an HTTP request of the group's one server); a follower raises
        :class:`ConfigError`. Without a lockstep the request simply runs here (a group of one).

        ``top_logprobs`` (0 to ``max_top_logprobs``) records that many most likely alternatives per generated
        token (:attr:`TokenCompletion.top_logprobs`; also passed to ``on_token`` as a fourth argument). Raises :class:`EngineStopped` after shutdown, :class:`RequestTooLarge` when prompt + ``max_tokens``
        exceeds the sequence length, :class:`ConfigError` for a bad value.
        """
        if self.stopped:
            raise EngineStopped("request submitted after the engine was shut down")
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise ConfigError("prompt_ids", list(prompt_ids), "at least one token")
        _positive_int("max_tokens", max_tokens)
        check_sampling(temperature, top_p, top_k, seed)
        check_top_logprobs(top_logprobs, self.max_top_logprobs)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError("priority", priority, "a Priority (TRAINING or SERVER)")
        if not isinstance(feed, bool):
            raise ConfigError("feed", feed, "True or False")
        if feed and self._lockstep is not None and not self._lockstep.leader:
            raise ConfigError(
                "feed", True, "False on a follower of a tensor-parallel group (only its leader feeds requests to it)"
            )
        if self.max_sequence_length is not None and len(prompt) + max_tokens > self.max_sequence_length:
            raise RequestTooLarge(
                "prompt_tokens+max_tokens",
                len(prompt) + max_tokens,
                self.max_sequence_length,
                f"max_sequence_length; the prompt has {len(prompt)} tokens and max_tokens={max_tokens}",
            )
        req = _Request(
            backend=BackendRequest(
                next(self._feed_ids if feed else self._ids),
                prompt,
                max_tokens,
                float(temperature),
                float(top_p),
                top_k,
                seed,
                top_logprobs,
            ),
            priority=int(priority),
            seq=next(self._seq),
            stop_token_ids=frozenset(int(t) for t in stop_token_ids),
            on_token=on_token,
            future=concurrent.futures.Future(),
            fed=feed,
        )
        with self._cond:
            if self.stopped:
                raise EngineStopped("request submitted after the engine was shut down")
            self._queue.append(req)
            self._queue.sort(key=lambda r: (r.priority, r.seq))
            self._cond.notify_all()
        req.future.add_done_callback(self._on_future_done(req.request_id))
        return RequestHandle(self, req)

    def _on_future_done(self, request_id: int) -> Callable[[concurrent.futures.Future[TokenCompletion]], None]:
        def done(f: concurrent.futures.Future[TokenCompletion]) -> None:
            if f.cancelled():  # the caller cancelled its future: abort the request in the engine
                self.abort(request_id)

        return done

    def abort(self, request_id: int) -> bool:
        """Abort one request (queued, running or parked): its future resolves "abort"; False if it was done."""
        with self._cond:
            req = self._find_locked(request_id)
            if req is None or req.detached:
                return False
            if self._lockstep is not None and not self._lockstep.leader:
                # a follower keeps the request in the group's schedule (the leader decides what runs): only the
                # caller is answered now; the row leaves when the leader aborts it or it finishes
                req.detached = True
                done = self._completion_of(req, "abort")
                self._cond.notify_all()
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    req.future.set_result(done) if not req.future.done() else None
                return True
            if req.state == "queued":
                self._queue.remove(req)
            else:
                self._active.pop(request_id, None)
                self._pending_aborts.append(request_id)
            self._mark_done_locked(req, "abort")
            self._cond.notify_all()
        self._resolve(req)
        return True

    def _find_locked(self, request_id: int) -> _Request | None:
        req = self._active.get(request_id)
        if req is None:
            req = next((r for r in self._queue if r.request_id == request_id), None)
        return req if req is not None and req.state != "done" else None

    # ------------------------------------------------------------------ handoff
    def suspend(self) -> None:
        """Stop decoding: park (after the current step) or drain (after admitted requests finish), then suspend.

        On return no decode step is in flight and none starts until :meth:`resume`.
        """
        self._command("suspend", drain=self.inflight is InflightPolicy.DRAIN)

    def resume(self) -> None:
        """Resume the backend; parked requests continue and queued ones are admitted."""
        self._command("resume")

    def shutdown(self) -> None:
        """Abort everything left (futures resolve "abort"), tear the backend down and stop the engine thread."""
        if self._thread is None or self._stopped:
            self._stopping = self._stopped = True
            return
        with self._cond:
            self._stopping = True
        self._command("shutdown")
        self._thread.join()

    def _command(self, kind: str, *, drain: bool = False) -> None:
        if self._thread is None:
            raise LifecycleError(f"engine {kind} before start")
        if threading.current_thread() is self._thread:
            raise LifecycleError(
                f"engine {kind} called from the engine thread (e.g. inside on_token): it would deadlock"
            )
        if self._stopped:
            if kind == "shutdown":
                return
            raise EngineStopped(f"engine {kind} after shutdown")
        cmd = _Command(kind, drain=drain)
        with self._cond:
            if drain:
                self._draining = True
            self._commands.append(cmd)
            self._cond.notify_all()
        cmd.done.result()

    # ------------------------------------------------------------------ the engine thread
    def _run(self, built: concurrent.futures.Future[None]) -> None:
        with self._device_context():
            try:
                self.backend = self._factory()
            except BaseException as exc:  # the builder's error goes to start()'s caller
                self._stopped = True
                built.set_exception(exc)
                return
            self._awake = True
            built.set_result(None)
            try:
                while self._loop_once():
                    pass
            except BaseException as exc:  # never leave callers waiting forever on a dead loop
                log.exception("engine loop died")
                self._fail_everything(exc)
                with contextlib.suppress(Exception):
                    self.backend.shutdown()

    def _ready_command_locked(self) -> _Command | None:
        if not self._commands:
            return None
        if self._stopping:  # shutdown goes first (a drain-mode suspend waiting for requests would block it)
            stop = next((c for c in self._commands if c.kind == "shutdown"), None)
            if stop is not None:
                self._commands.remove(stop)
                return stop
        cmd = self._commands[0]
        if cmd.kind == "suspend" and cmd.drain and self._awake and self._active:
            return None  # drain: keep stepping the admitted requests until they are all done
        return self._commands.popleft()

    def _can_step_locked(self) -> bool:
        if not self._awake or self._stopping:
            return False
        return bool(self._active) or (bool(self._queue) and not self._draining)

    def _loop_once(self) -> bool:
        """One iteration: a control command, or admissions plus one decode step. False when the loop ends."""
        if self._lockstep is not None:
            return self._loop_once_lockstep(self._lockstep)
        with self._cond:
            while True:
                cmd = self._ready_command_locked()
                if cmd is not None or self._pending_aborts or self._can_step_locked():
                    break
                self._cond.wait()
            aborts, self._pending_aborts = self._pending_aborts, []
            admit: list[_Request] = []
            if cmd is None and self._awake and not self._draining:
                while self._queue and len(self._active) < self.max_active_requests:
                    req = self._queue.pop(0)
                    req.state = "running"
                    req.admitted_version = int(self._weight_version())
                    req.admitted_step = self.steps
                    self._active[req.request_id] = req
                    admit.append(req)
        backend = self.backend
        assert backend is not None
        for rid in aborts:
            backend.abort(rid)
        if cmd is not None:
            return self._execute(cmd, backend)
        for req in admit:
            try:
                backend.add(req.backend)
            except Exception as exc:  # this request cannot run; the others are not disturbed
                with self._cond:
                    self._active.pop(req.request_id, None)
                    req.state = "done"
                    self.completed += 1
                req.future.set_exception(exc) if not req.future.done() else None
        if not self._active:
            return True
        self._step(backend)
        return True

    # ------------------------------------------------------------------ lockstep (tensor-parallel groups)
    def _peek_command_locked(self) -> _Command | None:
        if not self._commands:
            return None
        if self._stopping:
            stop = next((c for c in self._commands if c.kind == "shutdown"), None)
            if stop is not None:
                return stop
        cmd = self._commands[0]
        if cmd.kind == "suspend" and cmd.drain and self._awake and self._active:
            return None
        return cmd

    def _plan_locked(self, cmd: _Command | None, width: int) -> StepPlan:
        """The leader's plan of this iteration (what the unlocked loop would do)."""
        if cmd is not None:
            return StepPlan(cmd.kind, drain=cmd.drain)
        room = room_for(width)
        aborts = tuple(self._pending_aborts[:room])
        admit: list[_Request] = []
        if self._awake and not self._draining:
            free = self.max_active_requests - len(self._active)
            admit = self._queue[: max(0, min(free, room))]
        kind = "step" if self._awake and not self._stopping and (self._active or admit) else "noop"
        carried = tuple(_carried(r) for r in admit if r.fed)
        return StepPlan(kind, tuple(r.request_id for r in admit), aborts, carried=carried)

    def _wait_locked(self, what: str, ready: Callable[[], bool]) -> None:
        if not self._cond.wait_for(ready, timeout=self._lockstep_wait_s):
            raise LifecycleError(
                f"lockstep: the group's leader planned {what}, which never reached this rank within "
                f"{self._lockstep_wait_s:.0f} s (requests and control calls must be the same on every rank of "
                "the tensor-parallel group)"
            )

    def _queued_check(self, request_id: int) -> Callable[[], bool]:
        return lambda: any(r.request_id == request_id for r in self._queue)

    def _loop_once_lockstep(self, lock: Lockstep) -> bool:
        """One iteration of a tensor-parallel group: agree on the leader's plan, then every rank carries it out."""
        with self._cond:
            cmd: _Command | None = None
            # the leader plans once it has something to do, or after an idle heartbeat (a noop plan keeps the
            # followers' wait inside the group's timeout); a follower goes straight to the agreement: the leader's
            # plan is what it waits for, requests only the leader was given included
            while lock.leader:
                cmd = self._peek_command_locked()
                if cmd is not None or self._pending_aborts or self._can_step_locked():
                    break
                if not self._cond.wait(timeout=LOCKSTEP_HEARTBEAT_S):
                    break
            mine = self._plan_locked(cmd, lock.width) if lock.leader else StepPlan("noop")
        plan = lock.agree(mine)
        backend = self.backend
        assert backend is not None
        admit: list[_Request] = []
        planned: _Command | None = None
        with self._cond:
            if lock.leader:
                self._pending_aborts = [r for r in self._pending_aborts if r not in plan.abort]
            else:
                for rid in plan.abort:  # the leader's caller aborted it: leave the schedule here too
                    req = self._active.pop(rid, None) or next((r for r in self._queue if r.request_id == rid), None)
                    if req is not None and req.state != "done":
                        if req in self._queue:
                            self._queue.remove(req)
                        self._mark_done_locked(req, "abort")
                        self._resolve(req)
            if plan.kind in ("suspend", "resume", "shutdown"):
                self._wait_locked(f"a {plan.kind}", lambda: any(c.kind == plan.kind for c in self._commands))
                planned = next(c for c in self._commands if c.kind == plan.kind)
                self._commands.remove(planned)
            elif plan.kind == "step":
                fed = {c.request_id: c for c in plan.carried}
                for rid in plan.admit:
                    if not lock.leader and rid in fed:  # the leader's alone: add the same request here
                        req = self._fed_request(fed[rid])
                    else:
                        self._wait_locked(f"request {rid}", self._queued_check(rid))
                        req = next(r for r in self._queue if r.request_id == rid)
                        self._queue.remove(req)
                    req.state = "running"
                    req.admitted_version = int(self._weight_version())
                    req.admitted_step = self.steps
                    self._active[req.request_id] = req
                    admit.append(req)
        for rid in plan.abort:
            backend.abort(rid)
        if planned is not None:
            return self._execute(planned, backend)
        for req in admit:
            try:
                backend.add(req.backend)
            except Exception as exc:
                with self._cond:
                    self._active.pop(req.request_id, None)
                    req.state = "done"
                    self.completed += 1
                req.future.set_exception(exc) if not req.future.done() else None
        if plan.kind == "step":  # every rank steps on the leader's word (rows this rank ended may still run)
            self._step(backend)
        return True

    def _fed_request(self, c: CarriedRequest) -> _Request:
        """A follower's record of a request the leader alone was given (nobody here waits on its future)."""
        return _Request(
            backend=BackendRequest(
                c.request_id,
                c.prompt_ids,
                c.max_tokens,
                c.temperature,
                c.top_p,
                c.top_k,
                c.seed,
                c.top_logprobs,
            ),
            priority=c.priority,
            seq=next(self._seq),
            stop_token_ids=frozenset(c.stop_token_ids),
            on_token=None,
            future=concurrent.futures.Future(),
            fed=True,
        )

    def _step(self, backend: StepBackend) -> None:
        version = int(self._weight_version())
        with self._cond:
            self._decode_in_flight = True
        try:
            outputs = backend.step()
        finally:
            with self._cond:
                self._decode_in_flight = False
                self.steps += 1
                if not self._awake:
                    self.steps_while_suspended += 1
        finished: list[_Request] = []
        for out in outputs:
            req = self._active.get(out.request_id)
            if req is None or req.state != "running":
                continue  # aborted meanwhile: its backend.abort is pending
            reason = self._take_tokens(req, out, version)
            if reason is not None:
                with self._cond:
                    if req.state != "running":
                        continue  # a caller aborted it meanwhile: it is already resolved, and only once
                    if out.finished is None:  # we ended it (stop token, on_token, length): free its slot
                        if self._lockstep is None:
                            backend.abort(req.request_id)
                        elif self._lockstep.leader:  # the whole group drops the row, in the next plan
                            self._pending_aborts.append(req.request_id)
                    self._active.pop(req.request_id, None)
                    self._mark_done_locked(req, reason)
                finished.append(req)
        for req in finished:
            self._resolve(req)
        with self._cond:
            self._cond.notify_all()

    def _take_tokens(self, req: _Request, out: StepOutput, version: int) -> str | None:
        """Append one step's tokens to ``req``; the finish reason if the request ends with them."""
        lps = list(out.logprobs) + [0.0] * (len(out.token_ids) - len(out.logprobs))
        want_top = req.backend.top_logprobs > 0
        tops = list(out.top_logprobs) + [()] * (len(out.token_ids) - len(out.top_logprobs))
        for tok, lp, top in zip(out.token_ids, lps, tops):
            if len(req.token_ids) >= req.backend.max_tokens:
                return "length"
            req.token_ids.append(int(tok))
            req.logprobs.append(float(lp))
            req.versions.append(version)
            if want_top:
                req.tops.append(tuple((int(t), float(v)) for t, v in top[: req.backend.top_logprobs]))
            if int(tok) in req.stop_token_ids:
                return "stop"
            if req.on_token is not None:
                try:
                    if want_top:
                        keep = req.on_token(int(tok), float(lp), version, req.tops[-1])
                    else:
                        keep = req.on_token(int(tok), float(lp), version)
                except Exception as exc:
                    log.warning("on_token of request %d raised %r; the request is aborted", req.request_id, exc)
                    return "abort"
                if keep is False:
                    return "stop"
        if out.finished is not None:
            return out.finished
        if len(req.token_ids) >= req.backend.max_tokens:
            return "length"
        return None

    def _execute(self, cmd: _Command, backend: StepBackend) -> bool:
        try:
            if cmd.kind == "suspend":
                if self._awake:
                    dt = backend.suspend()
                    with self._cond:
                        self._awake = False
                        self._draining = False
                    self.timings.append(("suspend", float(dt or 0.0)))
                    log.debug("engine suspended with %d request(s) parked", len(self._active))
            elif cmd.kind == "resume":
                if not self._awake:
                    dt = backend.resume()
                    with self._cond:
                        self._awake = True
                        self._draining = False
                        self._cond.notify_all()
                    self.timings.append(("resume", float(dt or 0.0)))
            elif cmd.kind == "shutdown":
                self._abort_everything()
                try:
                    backend.shutdown()
                finally:
                    with self._cond:
                        self._awake = False
                        self._stopped = True
                    self._fail_commands(EngineStopped("engine shut down"))
                cmd.done.set_result(None)
                return False
        except BaseException as exc:
            cmd.done.set_exception(exc)
            return True
        cmd.done.set_result(None)
        return True

    def _abort_everything(self) -> None:
        with self._cond:
            left = [*self._queue, *self._active.values()]
            self._queue.clear()
            self._active.clear()
            for req in left:
                self._mark_done_locked(req, "abort")
        for req in left:
            self._resolve(req)

    def _fail_commands(self, exc: BaseException) -> None:
        with self._cond:
            cmds = list(self._commands)
            self._commands.clear()
        for c in cmds:  # a suspend or shutdown is satisfied by a stopped engine; a resume is not
            if not c.done.done():
                c.done.set_exception(exc) if c.kind == "resume" else c.done.set_result(None)

    def _fail_everything(self, exc: BaseException) -> None:
        with self._cond:
            self._stopped = True
            self._awake = False
            left = [*self._queue, *self._active.values()]
            self._queue.clear()
            self._active.clear()
            for req in left:
                req.state = "done"
                self.completed += 1
            self._cond.notify_all()
        for req in left:
            if not req.future.done():
                req.future.set_exception(exc)
        self._fail_commands(exc)

    # ------------------------------------------------------------------ completions
    def _mark_done_locked(self, req: _Request, reason: str) -> None:
        req.state = "done"
        req.finish_reason = reason
        req.completion = self._completion_of(req, reason)
        self.completed += 1

    def _completion_of(self, req: _Request, reason: str) -> TokenCompletion:
        if req.completion is not None:
            return req.completion
        toks = tuple(req.token_ids)
        return TokenCompletion(
            request_id=req.request_id,
            prompt_ids=req.backend.prompt_ids,
            token_ids=toks,
            logprobs=tuple(req.logprobs),
            weight_versions=tuple(req.versions),
            text=self._detokenize(toks),
            finish_reason=reason,
            admitted_version=req.admitted_version,
            top_logprobs=tuple(req.tops),
        )

    @staticmethod
    def _resolve(req: _Request) -> None:
        assert req.completion is not None
        if not req.future.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                req.future.set_result(req.completion)


def _carried(req: _Request) -> CarriedRequest:
    """The wire record of a leader-only request (what a follower needs to add the same request)."""
    b = req.backend
    return CarriedRequest(
        b.request_id,
        b.prompt_ids,
        b.max_tokens,
        b.temperature,
        b.top_p,
        b.top_k,
        b.seed,
        b.top_logprobs,
        tuple(sorted(req.stop_token_ids)),
        req.priority,
    )


__all__ = [
    "DEFAULT_MAX_TOP_LOGPROBS",
    "BackendRequest",
    "ContinuousBatcher",
    "InflightPolicy",
    "Priority",
    "RequestCounts",
    "RequestHandle",
    "StepBackend",
    "StepOutput",
    "TokenCompletion",
    "TopLogprobs",
    "check_sampling",
    "check_top_logprobs",
    "parse_inflight",
    "request_seed",
]
