"""What a caller gets back from the engine loop: the completion, the request handle, the request counts.

:class:`EngineRequest` is the loop's mutable record of one request (owned by the engine thread once admitted);
:func:`completion_of` freezes it into the :class:`TokenCompletion` its future resolves with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from colo_fsm.adapters.engine.protocol import BackendRequest, TopLogprobs


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
    resubmissions: int = 0  # times a suspend ended it and it was re-prefilled after the resume (inflight="abort")

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


class InflightStats(NamedTuple):
    """What the in-flight policy cost so far (all zero under "park" and "drain"): requests an ``inflight="abort"``
    suspend ended, the tokens of KV cache they discarded (prompt + generated, per ended attempt), and their
    re-admissions with the tokens those prefilled again."""

    ended: int
    discarded_tokens: int
    reprefills: int
    reprefill_tokens: int


OnToken = Callable[..., "bool | None"]
"""``on_token(token_id, logprob, weight_version)``; a request submitted with ``top_logprobs > 0`` gets a fourth
argument, that token's :data:`TopLogprobs`."""


@dataclass(eq=False)
class EngineRequest:
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
    origin: BackendRequest | None = None  # the request as submitted (``backend`` changes when it is resubmitted)
    attempt: int = 0  # times it was ended at a suspend and resubmitted (``inflight="abort"``)
    turn: int = 0  # its place among its caller's requests (queue_order): 0 for a lone request

    def __post_init__(self) -> None:
        if self.origin is None:
            self.origin = self.backend

    @property
    def submitted(self) -> BackendRequest:
        """The request as its caller submitted it (prompt, total ``max_tokens``, sampling)."""
        assert self.origin is not None
        return self.origin

    @property
    def request_id(self) -> int:
        """The id the caller knows (its handle's), stable across resubmissions."""
        return self.submitted.request_id

    @property
    def backend_id(self) -> int:
        """The id the backend knows this request by now (a resubmission gets a new one)."""
        return self.backend.request_id


def queue_order(req: EngineRequest) -> tuple[int, int, int]:
    """The engine queue's sort key: priority, then turn (round-robin across one caller's requests), then arrival."""
    return (req.priority, req.turn, req.seq)


class _Owner(Protocol):
    """What a :class:`RequestHandle` needs of its engine loop."""

    def abort(self, request_id: int) -> bool: ...

    def _completion_of(self, req: EngineRequest, reason: str) -> TokenCompletion: ...


class FutureHandle:
    """What every engine's request handle offers over its ``future`` (a
    :class:`~concurrent.futures.Future` of a :class:`TokenCompletion`): :meth:`done`, :meth:`result` and
    :meth:`wait`, where a cancelled future gives the engine's "abort" completion (:meth:`_aborted`)."""

    future: concurrent.futures.Future[TokenCompletion]

    def _aborted(self) -> TokenCompletion:
        """The completion a cancelled request answers with (finish "abort")."""
        raise NotImplementedError

    def done(self) -> bool:
        """Whether the request finished (any reason), failed or was cancelled."""
        return self.future.done()

    def result(self, timeout: float | None = None) -> TokenCompletion:
        """Wait for the completion; a cancelled future gives the "abort" completion."""
        try:
            return self.future.result(timeout)
        except concurrent.futures.CancelledError:
            return self._aborted()

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
            return self._aborted()  # someone else cancelled the future


class RequestHandle(FutureHandle):
    """A submitted request: its id and future (``future.cancel()`` and :meth:`cancel` abort it in the engine)."""

    def __init__(self, batcher: _Owner, request: EngineRequest) -> None:
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

    def _aborted(self) -> TokenCompletion:
        return self._batcher._completion_of(self._request, "abort")  # the partial completion


def completion_of(req: EngineRequest, reason: str, detokenize: Callable[[Sequence[int]], str]) -> TokenCompletion:
    """``req``'s completion (its frozen one once it is done), with finish ``reason`` and its text."""
    if req.completion is not None:
        return req.completion
    toks = tuple(req.token_ids)
    return TokenCompletion(
        request_id=req.request_id,
        prompt_ids=req.submitted.prompt_ids,
        token_ids=toks,
        logprobs=tuple(req.logprobs),
        weight_versions=tuple(req.versions),
        text=detokenize(toks),
        finish_reason=reason,
        admitted_version=req.admitted_version,
        top_logprobs=tuple(req.tops),
        resubmissions=req.attempt,
    )


def resolve(req: EngineRequest) -> None:
    """Answer ``req``'s caller with its completion (once: a future already done is left alone)."""
    assert req.completion is not None
    if not req.future.done():
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            req.future.set_result(req.completion)


__all__ = [
    "EngineRequest",
    "FutureHandle",
    "InflightStats",
    "OnToken",
    "RequestCounts",
    "RequestHandle",
    "TokenCompletion",
    "completion_of",
    "queue_order",
    "resolve",
]
