"""One request through megatron-core's coordinator: its handle, its sampling parameters, its completion.

megatron-core 0.19.2's ``InferenceClient`` answers once per request, when it finished: the
:class:`CoordinatorHandle` resolves then with a :class:`~colo_fsm.adapters.batching.TokenCompletion` built by
:func:`build_completion` (tokens, log-probs, each token's weight version from megatron's ``policy_epoch``).
Used by :mod:`colo_fsm.adapters.megatron.coordinator`.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from colo_fsm.adapters.batching import OnToken, TokenCompletion
from colo_fsm.adapters.engine.options import check_sampling, positive_int
from colo_fsm.adapters.engine.results import FutureHandle
from colo_fsm.adapters.megatron.coordinator_inflight import Carry
from colo_fsm.adapters.megatron.coordinator_states import as_list, state_name, token_versions
from colo_fsm.errors import ConfigError, RequestTooLarge
from colo_fsm.log import get_logger

log = get_logger(__name__)


class CoordinatorHandle(FutureHandle):
    """One submitted request: ``future`` resolves to a :class:`~colo_fsm.adapters.batching.TokenCompletion`.

    ``cancel()`` resolves it at once with finish "abort" (and the tokens an ``inflight="abort"`` suspend carried
    over, if any); megatron-core 0.19.2 has no per-request abort, so the engine still decodes the request to its
    end and the reply is dropped. ``max_tokens`` and ``sampling`` (temperature, top-p, top-k) are kept for a
    resubmission; ``carry`` holds what earlier attempts produced (:mod:`~.coordinator_inflight`).
    """

    def __init__(
        self,
        request_id: int,
        prompt_ids: tuple[int, ...],
        *,
        on_token: OnToken | None,
        stop_token_ids: frozenset[int],
        admitted_version: int,
        max_tokens: int = 1,
        sampling: tuple[float, float, int] = (0.0, 1.0, 0),
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.on_token = on_token
        self.stop_token_ids = stop_token_ids
        self.admitted_version = admitted_version
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.carry = Carry()
        self.in_engine = False  # sent to megatron and not answered yet
        self.server = False  # a Priority.SERVER request: holds a slot of the server share while in the engine
        self.future: concurrent.futures.Future[TokenCompletion] = concurrent.futures.Future()

    @property
    def attempt_prompt(self) -> tuple[int, ...]:
        """What the next attempt prefills: the prompt plus every token carried over from ended attempts."""
        return self.prompt_ids + tuple(self.carry.token_ids)

    @property
    def tokens_left(self) -> int:
        """``max_tokens`` minus the tokens carried over."""
        return self.max_tokens - len(self.carry.token_ids)

    def _aborted(self) -> TokenCompletion:
        c = self.carry
        return TokenCompletion(
            self.request_id,
            self.prompt_ids,
            tuple(c.token_ids),
            tuple(c.logprobs),
            tuple(c.versions),
            "",
            "abort",
            self.admitted_version,
            resubmissions=c.attempts,
        )

    def cancel(self) -> bool:
        """Resolve with finish "abort" (False if already done); the engine finishes the request on its own."""
        try:
            self.future.set_result(self._aborted())
        except concurrent.futures.InvalidStateError:
            return False
        return True


def settle(fut: concurrent.futures.Future[Any], *, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` with ``result`` or ``exc``, unless its caller cancelled it meanwhile."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled by its caller meanwhile


def check_prompt(prompt_ids: Sequence[int]) -> tuple[int, ...]:
    """``prompt_ids`` as a tuple of token ids; anything else raises :class:`~colo_fsm.errors.ConfigError`."""
    if isinstance(prompt_ids, str | bytes) or not isinstance(prompt_ids, Sequence) or not prompt_ids:
        raise ConfigError("prompt_ids", prompt_ids, "a non-empty sequence of token ids")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prompt_ids):
        raise ConfigError("prompt_ids", list(prompt_ids)[:8], "non-negative integer token ids")
    return tuple(int(t) for t in prompt_ids)


def check_request(
    prompt_ids: Sequence[int],
    *,
    max_tokens: Any,
    sampling: tuple[Any, Any, Any, Any],
    top_logprobs: Any,
    logprobs_mode: Any,
    config: Any,
    max_sequence_length: int,
) -> tuple[int, ...]:
    """A request the coordinator engine can send, its prompt as token ids: ``sampling`` (temperature, top-p, top-k,
    seed) as every engine takes them, no ``top_logprobs``, ``logprobs_mode`` None or the engine's own
    (``config.logprobs_mode``), prompt + ``max_tokens`` within ``max_sequence_length``. Anything else raises
    :class:`~colo_fsm.errors.ConfigError` (:class:`~colo_fsm.errors.RequestTooLarge` for the length) naming it."""
    ids = check_prompt(prompt_ids)
    positive_int("max_tokens", max_tokens)
    check_sampling(*sampling)
    if top_logprobs:
        raise ConfigError("top_logprobs", top_logprobs, "0 (the coordinator engine records no alternatives)")
    if logprobs_mode is not None and logprobs_mode != config.logprobs_mode:
        raise ConfigError(
            "logprobs_mode",
            logprobs_mode,
            f"{config.logprobs_mode!r}: megatron-core sets it once for every request (CoordinatorConfig)",
        )
    if len(ids) + max_tokens > max_sequence_length:
        raise RequestTooLarge("prompt+max_tokens", len(ids) + max_tokens, max_sequence_length, "max_sequence_length")
    return ids


def sampling_params(max_tokens: int, temperature: float, top_p: float, top_k: int, eod: int) -> Any:
    """megatron-core ``SamplingParams``: greedy as top-k 1, top-p 1.0 as megatron's "off" (0.0), log-probs of the
    generated tokens only (prompt log-probs cannot be computed with only the last token's logits materialized,
    and megatron asserts on it inside its engine loop)."""
    from megatron.core.inference.sampling_params import SamplingParams

    greedy = temperature == 0
    return SamplingParams(
        temperature=1.0 if greedy else float(temperature),
        top_k=1 if greedy else int(top_k),
        top_p=0.0 if greedy or top_p >= 1.0 else float(top_p),
        num_tokens_to_generate=int(max_tokens),
        termination_id=int(eod),
        return_log_probs=True,
        skip_prompt_log_probs=True,
    )


class ServerShare:
    """Bounds the ``Priority.SERVER`` requests (HTTP traffic) in megatron's engine at once to ``slots``; the rest
    wait here, first come first served, and go to the engine as earlier ones finish. megatron-core schedules
    first come, first served with no priorities: this keeps the trainer's rollouts their share of the engine."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.in_engine = 0
        self.waiting: deque[Callable[[], None]] = deque()
        self.held = 0  # requests that ever waited here (a count for benchmarks and tests)
        self._lock = threading.Lock()

    def admit(self, send: Callable[[], None]) -> None:
        """Call ``send()`` now if a slot is free, else when one frees up."""
        with self._lock:
            go = self.in_engine < self.slots
            if go:
                self.in_engine += 1
            else:
                self.waiting.append(send)
                self.held += 1
        if go:
            send()

    def release(self) -> None:
        """One SERVER request left the engine: its slot goes to the next waiting one, if any."""
        with self._lock:
            nxt = self.waiting.popleft() if self.waiting else None
            if nxt is None:
                self.in_engine = max(0, self.in_engine - 1)
        if nxt is not None:
            nxt()


def build_completion(
    handle: CoordinatorHandle, req: Any, *, eod: int, detokenize: Callable[[list[int]], str], sent: Sequence[int]
) -> TokenCompletion:
    """The :class:`TokenCompletion` of a finished megatron request: the tokens carried over from attempts an
    ``inflight="abort"`` suspend ended, then this reply's; log-probs; per-token weight versions (from
    ``policy_epoch``, checked against the epochs ``sent``); cut at the first stop token id or where the handle's
    ``on_token`` returned False (called for each token in order)."""
    c = handle.carry
    toks = [int(t) for t in as_list(req.generated_tokens)]
    lps = [float(x) for x in as_list(getattr(req, "generated_log_probs", None))]
    lps = (lps + [math.nan] * len(toks))[: len(toks)]
    versions = list(
        token_versions(req.policy_epoch, len(handle.attempt_prompt), len(toks), sent=sent, request_id=handle.request_id)
    )
    toks, lps, versions = c.token_ids + toks, c.logprobs + lps, c.versions + versions
    status = state_name(getattr(req, "status", "")) or ""
    finish = "abort" if status.endswith("FAILED") else ""
    if finish:
        log.warning("megatron-core failed request %d: %s", handle.request_id, getattr(req, "events", ""))
    cut = len(toks)
    for i, t in enumerate(toks):
        if t in handle.stop_token_ids:
            cut, finish = i + 1, "stop"
            break
    if handle.on_token is not None:
        for i in range(cut):
            if handle.on_token(toks[i], lps[i], versions[i]) is False:
                cut, finish = i + 1, "stop"
                break
    toks, lps, versions = toks[:cut], lps[:cut], versions[:cut]
    if not finish:
        finish = "stop" if toks and toks[-1] == int(eod) else "length"
    return TokenCompletion(
        handle.request_id,
        handle.prompt_ids,
        tuple(toks),
        tuple(lps),
        tuple(versions),
        detokenize(toks),
        finish,
        handle.admitted_version,
        resubmissions=c.attempts,
    )


def resolve(
    handle: CoordinatorHandle,
    reply: concurrent.futures.Future[Any],
    *,
    eod: int,
    detokenize: Callable[[list[int]], str],
    sent: Sequence[int],
) -> bool:
    """Resolve ``handle`` from megatron's ``reply``: its completion (:func:`build_completion`), the reply's error,
    or finish "abort" where megatron cancelled it (at its shutdown). False where the caller had cancelled the
    request already, so megatron decoded it to the end for nothing (the reply is dropped)."""
    if handle.future.done():
        return False
    if reply.cancelled():
        handle.cancel()
        return True
    exc = reply.exception()
    if exc is not None:
        settle(handle.future, exc=exc)
        return True
    try:
        completion = build_completion(handle, reply.result(), eod=eod, detokenize=detokenize, sent=sent)
    except Exception as err:
        settle(handle.future, exc=err)
    else:
        settle(handle.future, result=completion)
    return True


__all__ = [
    "CoordinatorHandle",
    "ServerShare",
    "as_list",
    "build_completion",
    "check_prompt",
    "check_request",
    "resolve",
    "sampling_params",
    "settle",
    "state_name",
]
