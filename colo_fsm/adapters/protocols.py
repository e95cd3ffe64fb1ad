"""The three things the lifecycle drives: a generation engine, a trainer and a collector.

Each protocol is a handful of methods; write your own adapter for another engine by implementing them. The
machine calls them only from actions, always in the order the lifecycle spec declares.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from colo_fsm.guards.mode import ReportsModelMode


@runtime_checkable
class GenerationEngine(Protocol):
    """A colocated generation engine: built once, suspended for every training step, resumed after.

    ``reads_weights_in_place`` is True when generation reads the trainer's parameters directly (the same
    model object), so a weight sync is only an offload plus a version bump. Asynchronous colocated training
    is refused for an engine that must refit weights across worlds.

    Optionally an engine also reports the shared model's mode (:class:`ReportsModelMode`: ``model_mode()``
    returning a :class:`~colo_fsm.guards.mode.ModeReport`); the lifecycle then refuses a training step on a
    model still in an inference mode and puts a digest of the report into every handoff barrier's fingerprint.
    Engines that report nothing are not checked.
    """

    reads_weights_in_place: bool

    def bring_up(self) -> None:
        """Build the engine (and its HTTP server when asked). Called exactly once per run."""

    def suspend(self) -> None:
        """Stop decoding and release or keep the KV cache per the engine's mode; no decode in flight after."""

    def resume(self) -> None:
        """Resume decoding. Called only after this rank drained its device and every rank met the barrier."""

    def shutdown(self) -> None:
        """Tear the engine down. Called only on the way to Stopped."""

    def server_base_urls(self) -> Sequence[str]:
        """Base URLs of the OpenAI-compatible servers, one per data-parallel rank (empty if none)."""


@dataclass(frozen=True)
class StepResult:
    """What a training step reports: its metrics and how many samples it consumed."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    consumed_samples: int = 0


@runtime_checkable
class Trainer(Protocol):
    """The training side of the same model.

    Optional methods the machine calls when present: ``finalize_checkpoint()`` (wait until an asynchronous
    save's collectives have all completed; a spec with a finalize action calls it before any wake) and
    ``teardown()`` (called in ``stop`` after the engine is shut down).
    """

    def train_step(self, batch: Any) -> StepResult | Mapping[str, float]:
        """Run one optimizer step on ``batch``; return a :class:`StepResult` or a mapping of metrics (a
        ``consumed_samples`` key, if any, is taken as such). The machine bumps the weight version after it
        returns; any other return value is a typed error."""

    def offload_buffers(self) -> None:
        """Free training-only memory (gradient buffers, optimizer state where configured) before generation."""

    def restore_buffers(self) -> None:
        """Bring training-only memory back before the next training step."""

    def save_checkpoint(self, step: int, weight_version: int, extra_state: Mapping[str, Any]) -> None:
        """Write a distributed checkpoint. Runs world-wide collectives; the engine is suspended throughout."""


@runtime_checkable
class Collector(Protocol):
    """The asynchronous producer of trajectories.

    ``resume`` may take a ``weight_version`` keyword: the machine then hands it the current weight version on
    every resume. An optional ``teardown()`` is called in ``stop``, and an optional ``take_back(unused)`` before
    it, from any state: the collector takes back the batch the loop drew and did not train (``stop(unused=...)``)
    and the prompts of its rollouts in flight, which the teardown aborts, to issue them again after a restart
    (:meth:`colo_fsm.collector.AsyncCollector.take_back`).
    """

    def pause(self) -> None:
        """Stop issuing new rollouts and return at once (park, the default): rollouts already submitted stay
        parked in the engine through the handoff and finish after it, under the new weights. A collector set
        to drain (strictly on-policy) returns only when no rollout request of it is being served."""

    def resume(self) -> None:
        """Start issuing rollouts again."""


def takes_weight_version(resume: Callable[..., Any]) -> bool:
    """Whether a collector's ``resume`` accepts a ``weight_version`` keyword (or ``**kwargs``)."""
    try:
        params = inspect.signature(resume).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "weight_version" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)


@dataclass(frozen=True)
class Completion:
    """One generated continuation: the text, its token ids and the weight version(s) that produced it.

    ``weight_version`` is the oldest version that produced a token (a trajectory's age counts from it);
    ``weight_versions`` and ``logprobs`` are per token when the engine records them (empty otherwise).
    """

    text: str
    token_ids: tuple[int, ...]
    weight_version: int
    finish_reason: str = "length"
    weight_versions: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()

    @property
    def version_span(self) -> int:
        """Newest minus oldest version among the tokens (0 when unknown or a single version)."""
        return max(self.weight_versions) - min(self.weight_versions) if self.weight_versions else 0


@runtime_checkable
class TextGenerator(Protocol):
    """Text in, text out, on the colocated engine: what the OpenAI-compatible server and the collector call.

    Calls are made only while the engine is awake; the caller (server, collector) waits while it is
    suspended.
    """

    def generate(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> list[Completion]:
        """Generate one completion per prompt."""


__all__ = [
    "Collector",
    "Completion",
    "GenerationEngine",
    "ReportsModelMode",
    "StepResult",
    "TextGenerator",
    "Trainer",
    "takes_weight_version",
]
