"""What the engine loop asks of an engine: the :class:`StepBackend` protocol and the values it trades."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
    logprobs_mode: str = "raw"  # "raw": log-probs of the untempered distribution; "processed": of the one sampled


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


__all__ = ["BackendRequest", "StepBackend", "StepOutput", "TopLogprobs"]
