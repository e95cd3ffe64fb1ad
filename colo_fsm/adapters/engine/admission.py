"""Admission: the queue of submitted requests and which of them join the engine at each step boundary.

Requests are validated when submitted (:meth:`Admission.submit`), queued in ``(priority, arrival)`` order and
admitted between decode steps while the engine is awake, at most ``max_active_requests`` at a time.

Within a priority the queue is ordered by ``(turn, arrival)`` (:func:`~colo_fsm.adapters.engine.results.queue_order`): a caller that submits
several requests for one client numbers them ``turn=0, 1, ...`` (the HTTP server does, for the ``n`` choices of a
request), so a client's k-th request waits only behind the others' first k: a 3-token request is not queued
behind the 63 remaining choices of an ``n=64`` one, and the large one still gets a slot in every round. Lone
requests (turn 0, every rollout) keep their arrival order.

The server's share: :attr:`~colo_fsm.adapters.engine.options.Priority.SERVER` requests (HTTP traffic) hold at
most ``server_slots`` (``server_share`` of ``max_active_requests``, rounded up) of the active requests at any
time, whatever is queued, so the trainer's rollouts always find ``max_active_requests - server_slots`` slots that
no flood of HTTP requests can take. Server work beyond its share waits queued (nothing is dropped);
``server_share=1`` lifts the cap.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Sequence

from colo_fsm.adapters.engine.cancellation import Cancellation
from colo_fsm.adapters.engine.options import (
    LogprobsMode,
    Priority,
    check_sampling,
    check_top_logprobs,
    parse_logprobs_mode,
    positive_int,
)
from colo_fsm.adapters.engine.protocol import BackendRequest, StepBackend
from colo_fsm.adapters.engine.results import EngineRequest, OnToken, RequestCounts, RequestHandle, queue_order
from colo_fsm.errors import ConfigError, EngineStopped, RequestTooLarge


class Admission(Cancellation):
    """The engine loop's queue and admission (a part of :class:`~colo_fsm.adapters.engine.ContinuousBatcher`;
    a request's future is tied to the cancel path when it is submitted)."""

    _ids: itertools.count[int]
    _feed_ids: itertools.count[int]  # leader-only requests (feed=True): ids of their own (lockstep.FEED_ID_BASE up)
    _seq: itertools.count[int]

    def counts(self, priority: Priority | int | None = None) -> RequestCounts:
        """Queued, running and parked requests right now (only those of ``priority`` when given)."""
        with self._cond:
            if priority is None:
                queued, n = len(self._queue), len(self._active)
            else:
                queued = sum(1 for r in self._queue if r.priority == priority)
                n = sum(1 for r in self._active.values() if r.priority == priority)
            return RequestCounts(queued, n if self._awake else 0, 0 if self._awake else n)

    def counts_nowait(self, priority: Priority | int | None = None) -> RequestCounts:
        """:meth:`counts` without taking the loop's lock, for readers that must never wait on the engine (an HTTP
        server's ``/health`` and ``/metrics``): the queue and the active set are each copied in one step (a single
        C-level copy under CPython's GIL), so a reading may straddle one step boundary, never fail."""
        queue = list(self._queue)
        active = list(self._active.values())
        awake = self._awake
        if priority is not None:
            queue = [r for r in queue if r.priority == priority]
            active = [r for r in active if r.priority == priority]
        n = len(active)
        return RequestCounts(len(queue), n if awake else 0, 0 if awake else n)

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
        logprobs_mode: LogprobsMode | str | None = None,
        feed: bool = False,
        turn: int = 0,
    ) -> RequestHandle:
        """Queue one request; it is admitted at the next step boundary (after resume if suspended).

        ``turn`` (>= 0) is its place among one caller's requests: within a priority, requests are admitted by
        turn, then arrival (round-robin across callers; see the module's docstring).

        ``feed=True`` (tensor-parallel leader only): this rank alone submits the request and the lockstep carries
        it to the group's other ranks (an HTTP request of the group's one server); a follower raises
        :class:`ConfigError`. Without a lockstep the request simply runs here (a group of one).

        ``top_logprobs`` (0 to ``max_top_logprobs``) records that many most likely alternatives per generated
        token (:attr:`TokenCompletion.top_logprobs`; also passed to ``on_token`` as a fourth argument). Raises
        :class:`EngineStopped` after shutdown, :class:`RequestTooLarge` when prompt + ``max_tokens`` exceeds the
        sequence length, :class:`ConfigError` for a bad value. ``logprobs_mode`` (None: the engine's) picks the
        distribution the returned log-probs come from: "raw" (the model's untempered softmax) or "processed"
        (after temperature, top-k and top-p: the distribution the token was sampled from).
        """
        if self.stopped:
            raise EngineStopped("request submitted after the engine was shut down")
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise ConfigError("prompt_ids", list(prompt_ids), "at least one token")
        positive_int("max_tokens", max_tokens)
        check_sampling(temperature, top_p, top_k, seed)
        check_top_logprobs(top_logprobs, self.max_top_logprobs)
        mode = self.logprobs_mode if logprobs_mode is None else parse_logprobs_mode(logprobs_mode)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError("priority", priority, "a Priority (TRAINING or SERVER)")
        if not isinstance(feed, bool):
            raise ConfigError("feed", feed, "True or False")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise ConfigError("turn", turn, "an integer >= 0 (the request's place among its caller's requests)")
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
        req = EngineRequest(
            backend=BackendRequest(
                next(self._feed_ids if feed else self._ids),
                prompt,
                max_tokens,
                float(temperature),
                float(top_p),
                top_k,
                seed,
                top_logprobs,
                mode.value,
            ),
            priority=int(priority),
            seq=next(self._seq),
            stop_token_ids=frozenset(int(t) for t in stop_token_ids),
            on_token=on_token,
            future=concurrent.futures.Future(),
            fed=feed,
            turn=turn,
        )
        with self._cond:
            if self.stopped:
                raise EngineStopped("request submitted after the engine was shut down")
            self._queue.append(req)
            self._queue.sort(key=queue_order)
            self._cond.notify_all()
        req.future.add_done_callback(self._on_future_done(req.request_id))
        return RequestHandle(self, req)

    def _admissible_locked(self, room: int | None = None) -> list[EngineRequest]:
        """The queued requests admitted at this boundary, in order (none while suspended or draining): training
        first, server requests only up to the server's share of the engine."""
        if not self._awake or self._draining:
            return []
        free = self.max_active_requests - len(self._active)
        if room is not None:
            free = min(free, room)
        server_free = self.server_slots - sum(1 for r in self._active.values() if r.priority >= Priority.SERVER)
        out: list[EngineRequest] = []
        for req in self._queue:
            if len(out) >= free:
                break
            if req.priority >= Priority.SERVER:
                if server_free <= 0:
                    break  # the queue is in priority order: only server requests follow
                server_free -= 1
            out.append(req)
        return out

    def _admit_locked(self, req: EngineRequest) -> None:
        """Move ``req`` from the queue into the active set (stamped with this boundary's version and step)."""
        self._queue.remove(req)
        req.state = "running"
        if req.admitted_step is None:  # its first admission (a resubmission keeps the first one's)
            req.admitted_version = int(self._weight_version())
            req.admitted_step = self.steps
        if req.attempt:  # a resubmission (inflight="abort"): prompt + its tokens so far are prefilled again
            self.reprefills += 1
            self.reprefill_tokens += len(req.backend.prompt_ids)
        self._active[req.backend_id] = req

    def _add_to_backend(self, backend: StepBackend, admitted: Sequence[EngineRequest]) -> None:
        """``backend.add`` each admitted request; one the backend refuses fails alone (its future gets the error)."""
        for req in admitted:
            try:
                backend.add(req.backend)
            except Exception as exc:  # this request cannot run; the others are not disturbed
                with self._cond:
                    self._active.pop(req.backend_id, None)
                    req.state = "done"
                    self.completed += 1
                req.future.set_exception(exc) if not req.future.done() else None


__all__ = ["Admission"]
