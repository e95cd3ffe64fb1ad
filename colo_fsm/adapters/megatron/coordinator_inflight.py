"""What a suspend does with the requests in flight on megatron-core's coordinator path: park, drain or abort.

megatron-core 0.19.2's coordinator mode keeps every request in its engine across pause -> suspend -> resume ->
unpause: that is *park*, and it needs nothing here. *Drain* waits, before the pause, until every request this
engine submitted has been answered. *Abort* is the peers' colocated-async way. megatron-core 0.19.2 has no
per-request abort, so the requests running in megatron's engine are ended through the engine's own stop-word hook:
on megatron's loop their ids go into ``stop_word_finished_request_ids`` (:func:`end_running`), the next engine step
finishes them with the tokens they have (appending none), and their replies come back through the coordinator as
usual. The adapter waits for those replies, then pauses and suspends. Each ended request is resubmitted after the
resume as prompt + the tokens it had, with the rest of its ``max_tokens``; its caller gets one completion with
every token, each stamped with the weight version that produced it. Requests still waiting in megatron's queue
hold no KV cache and are not ended: they start after the resume.

Used by :mod:`colo_fsm.adapters.megatron.coordinator`; :class:`Carry` is what one ended request keeps between its
attempts, :class:`EndedRequests` the engine's book of its abort-mode handoffs.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from colo_fsm.adapters.engine.results import InflightStats
from colo_fsm.adapters.megatron.coordinator_states import as_list, state_name, token_versions


@dataclass
class Carry:
    """The tokens a request had when a suspend ended it (every attempt so far), and how often it was ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    attempts: int = 0  # times ended at a suspend and resubmitted


async def end_running(engine: Any) -> int:
    """On megatron's loop: mark every request running in megatron's engine (the context's active and
    memory-paused rows, not its waiting queue) finished through the stop-word hook; returns how many."""
    ctx = engine.context
    rows = ctx.request_ids[: ctx.total_request_count]
    ids = [int(i) for i in (rows.tolist() if hasattr(rows, "tolist") else rows)]
    engine.stop_word_finished_request_ids.update(ids)
    return len(ids)


def ended_early(record: Any, *, max_tokens: int, eod: int) -> bool:
    """True for the reply of a request the stop-word hook ended: fewer tokens than it asked for, not at
    end-of-document, not failed (a request that finished on its own ends at its length or at end-of-document)."""
    toks = record.generated_tokens
    n = len(toks) if toks is not None else 0
    status = state_name(getattr(record, "status", "")) or ""
    if status.endswith("FAILED") or n >= max_tokens:
        return False
    return n == 0 or int(toks[-1]) != int(eod)


def carry_over(carry: Carry, record: Any, *, prompt_len: int, sent: Any, request_id: int) -> int:
    """Add an ended attempt's tokens, log-probs and per-token weight versions to ``carry``; returns the tokens of
    KV cache the attempt held (its prompt + its tokens), which the resubmission prefills again."""
    toks = [int(t) for t in as_list(record.generated_tokens)]
    lps = [float(x) for x in as_list(getattr(record, "generated_log_probs", None))]
    lps = (lps + [float("nan")] * len(toks))[: len(toks)]
    carry.versions += token_versions(record.policy_epoch, prompt_len, len(toks), sent=sent, request_id=request_id)
    carry.token_ids += toks
    carry.logprobs += lps
    carry.attempts += 1
    return prompt_len + len(toks)


class Resubmittable(Protocol):
    """What :class:`EndedRequests` reads of a request it holds (the engine's ``CoordinatorHandle``)."""

    @property
    def request_id(self) -> int: ...

    @property
    def tokens_left(self) -> int: ...

    @property
    def attempt_prompt(self) -> tuple[int, ...]: ...

    @property
    def future(self) -> concurrent.futures.Future[Any]: ...


class EndedRequests[H: Resubmittable]:
    """The abort-mode handoffs' book, read and written under the engine's lock.

    A suspend :meth:`start`s one with the ids running in megatron's engine; each of their replies is
    :meth:`replied`; an ended attempt is :meth:`hold`-ed until the resume :meth:`release`-s them all for
    resubmission (one whose reply comes after the resume is resubmitted at once). :meth:`stats` is what the
    aborts cost so far (:class:`~colo_fsm.adapters.batching.InflightStats`).
    """

    def __init__(self) -> None:
        self.ending: set[int] = set()  # ids in megatron's engine when the suspend ended them, reply not handled
        self.replies = 0  # replies of those since the suspend
        self.holding = False  # a handoff is under way: ended requests wait for the resume
        self._held: list[H] = []  # ended at a suspend, sent again after the resume
        self._stats = [0, 0, 0, 0]  # ended, discarded tokens, re-prefills, re-prefilled tokens

    def start(self, request_ids: Iterable[int]) -> None:
        """A suspend ends ``request_ids`` (those running in megatron's engine): count their replies from 0."""
        self.ending = set(request_ids)
        self.replies = 0
        self.holding = True

    def replied(self, request_id: int) -> None:
        """A reply came for ``request_id`` (counted if the suspend ended it)."""
        if request_id in self.ending:
            self.ending.discard(request_id)
            self.replies += 1

    def all_replied(self, ended: int) -> bool:
        """True once ``ended`` replies came, or none of the ended requests is still out."""
        return self.replies >= ended or not self.ending

    def ended(self, handle: H, reply: concurrent.futures.Future[Any], *, eod: int) -> bool:
        """True where ``reply`` (a finished future) is that of ``handle``'s attempt a suspend ended
        (:func:`ended_early`, against the handle's ``tokens_left``) and the request is still wanted: its tokens are
        carried over to a resubmission."""
        return (
            handle.request_id in self.ending
            and not handle.future.done()
            and not reply.cancelled()
            and reply.exception() is None
            and ended_early(reply.result(), max_tokens=handle.tokens_left, eod=eod)
        )

    def hold(self, handle: H, discarded_tokens: int) -> bool:
        """An ended attempt that held ``discarded_tokens`` of KV: keep ``handle`` for the resume. True where the
        resume already came (the caller resubmits at once)."""
        self._stats[0] += 1
        self._stats[1] += discarded_tokens
        self._held.append(handle)
        return not self.holding

    def release(self) -> list[H]:
        """The resume came: every held request, each not cancelled meanwhile counted as a re-prefill of its
        prompt + carried tokens."""
        self.holding = False
        again, self._held = self._held, []
        for h in again:
            if not h.future.done():
                self._stats[2] += 1
                self._stats[3] += len(h.attempt_prompt)
        return again

    def stats(self) -> InflightStats:
        """Requests ended, KV tokens discarded, re-prefills and the tokens they prefilled again."""
        return InflightStats(*self._stats)


__all__ = ["Carry", "EndedRequests", "Resubmittable", "carry_over", "end_running", "ended_early"]
