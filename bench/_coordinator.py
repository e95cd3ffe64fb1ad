"""The engine paths the benchmarks can run (``--engine``), kept out of each benchmark's own file.

* ``batcher``: colo-fsm's :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (its continuous batcher
  over megatron-core's dynamic engine on a GPU, the batched CPU loop otherwise);
* ``coordinator``: megatron-core's coordinator mode through
  :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine` (GPU only; pyzmq and msgpack). Park is
  megatron's own pause/suspend; drain is the collector waiting for its rollouts before the pause; sync is
  unchanged. megatron-core 0.19.2 samples every request from one generator, so a per-request seed is not
  applied on this path (counted by the engine).

:func:`add_engine_flag` adds ``--engine`` to a benchmark's parser; :func:`build_engine` builds the chosen one;
:func:`engine_row` is what a benchmark records about it (the per-step host cost is derived from the decode
steps the engine reports and the wall-clock it was busy).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

ENGINES = ("batcher", "coordinator")


def add_engine_flag(ap: argparse.ArgumentParser) -> None:
    """``--engine batcher|coordinator`` (default batcher)."""
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="batcher",
        help="batcher: colo-fsm's MegatronEngine; coordinator: megatron-core's coordinator mode (GPU, pyzmq, msgpack)",
    )


def check_engine_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--engine coordinator`` where it cannot run (no GPU, no pyzmq/msgpack), naming why."""
    if getattr(args, "engine", "batcher") != "coordinator":
        return
    if getattr(args, "device", "cuda") != "cuda":
        ap.error("--engine coordinator needs --device cuda (megatron-core's dynamic engine runs on a GPU)")
    from colo_fsm.adapters.megatron.coordinator import coordinator_dependencies

    ok, why = coordinator_dependencies()
    if not ok:
        ap.error(f"--engine coordinator: {why}")


class EodOutsideTokenizer:
    """A character tokenizer whose end-of-document id lies outside the vocabulary (each request stops at its
    drawn length), picklable: megatron's coordinator process receives the tokenizer."""

    def __init__(self, alphabet: str) -> None:
        from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

        self.base = CharTokenizer(alphabet)

    @property
    def eod(self) -> int:
        return int(self.base.vocab_size)

    @property
    def vocab_size(self) -> int:
        return int(self.base.vocab_size)

    @property
    def pad(self) -> int:
        return int(self.base.pad)

    @property
    def bos(self) -> int:
        return int(self.base.bos)

    def tokenize(self, text: str) -> list[int]:
        return self.base.tokenize(text)

    def detokenize(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return self.base.detokenize(ids, skip_special_tokens)

    def offsets(self, ids: Any, text: str) -> list[int]:
        return self.base.offsets(ids, text)


def build_engine(
    kind: str,
    model: Any,
    tokenizer: Any,
    *,
    mode: str,
    weight_version: Callable[[], int],
    max_sequence_length: int,
    max_active_requests: int,
    buffer_gb: float,
    cuda_graphs: int | None,
) -> Any:
    """The engine of ``kind`` over ``model`` for one bench mode (park, drain or sync)."""
    if kind == "coordinator":
        from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine

        alphabet = getattr(getattr(tokenizer, "_base", tokenizer), "alphabet", None)
        tok = EodOutsideTokenizer(alphabet) if alphabet is not None else tokenizer
        return CoordinatorEngine(
            model,
            tok,
            CoordinatorConfig(
                kv_cache_mode="persist",
                buffer_size_gb=buffer_gb,
                max_requests=max_active_requests,
                num_cuda_graphs=cuda_graphs,
            ),
            weight_version=weight_version,
            max_sequence_length=max_sequence_length,
        )
    from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine

    return MegatronEngine(
        model,
        tokenizer,
        GenerationConfig(
            inflight="drain" if mode == "drain" else "park",
            max_active_requests=max_active_requests,
            backend="auto",
            num_cuda_graphs=cuda_graphs,
            buffer_size_gb=buffer_gb,
        ),
        weight_version=weight_version,
        max_sequence_length=max_sequence_length,
    )


def engine_row(engine: Any, *, busy_s: float, decode_steps: int) -> dict[str, Any]:
    """What a benchmark records about the engine: its path, and the wall-clock per engine step while busy
    (``step_wall_ms``: forward plus every host cost of a step, the engine's bookkeeping included)."""
    row: dict[str, Any] = {
        "engine": "coordinator" if getattr(engine, "backend_name", "") == "coordinator" else "batcher",
        "engine_backend": getattr(engine, "backend_name", "?"),
        "step_wall_ms": 1e3 * busy_s / decode_steps if decode_steps else float("nan"),
    }
    for k in ("seeds_not_applied", "cancelled_still_decoding"):
        if hasattr(engine, k):
            row[k] = int(getattr(engine, k))
    timings = getattr(engine, "timing_summary", None)
    if callable(timings):
        row.update({f"engine_{k}": v for k, v in timings().items()})
    return row


__all__ = ["ENGINES", "EodOutsideTokenizer", "add_engine_flag", "build_engine", "check_engine_args", "engine_row"]
