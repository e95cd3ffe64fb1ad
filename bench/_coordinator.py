"""``--engine coordinator`` for the handoff benchmarks: megatron-core's coordinator mode as the engine.

:func:`coordinator_engine` has the factory signature of ``bench/_handoff.py``'s ``ENGINES`` (``--engine``):
it builds :class:`~colo_fsm.adapters.megatron.coordinator.CoordinatorEngine` over the mode's model. Park is
megatron's own pause/suspend (requests kept in the engine); drain is the collector waiting for its rollouts
before the pause (the engine has nothing to drain on its own); sync is unchanged. GPU only, with pyzmq and
msgpack. megatron-core 0.19.2 samples every request from one generator: a per-request seed is not applied on
this path (the engine counts them), so sampled outputs differ from the direct path's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class EodOutsideTokenizer:
    """A character tokenizer whose end-of-document id lies outside the vocabulary (each request stops at its
    drawn length); a plain class, so it pickles into megatron's coordinator process."""

    def __init__(self, alphabet: str) -> None:
        from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

        self.base = CharTokenizer(alphabet)

    @property
    def eod(self) -> int:
        """One past the vocabulary: never sampled."""
        return int(self.base.vocab_size)

    @property
    def vocab_size(self) -> int:
        """The base tokenizer's vocabulary size."""
        return int(self.base.vocab_size)

    @property
    def pad(self) -> int:
        """The base tokenizer's padding id."""
        return int(self.base.pad)

    @property
    def bos(self) -> int:
        """The base tokenizer's beginning-of-sequence id."""
        return int(self.base.bos)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return self.base.tokenize(text)

    def detokenize(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""
        return self.base.detokenize(ids, skip_special_tokens)

    def offsets(self, ids: Any, text: str) -> list[int]:
        """Character offset of each token in ``text``."""
        return self.base.offsets(ids, text)

    def __getattr__(self, name: str) -> Any:
        # anything else megatron's controller may read comes from the base tokenizer; never during unpickling
        # (``base`` not set yet) and never a dunder, so pickle finds no phantom __setstate__
        if name == "base" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base, name)


def coordinator_engine(
    mode: str,
    args: Any,
    shape: Any,
    model: Any,
    tokenizer: Any,
    weight_version: Callable[[], int],
    max_sequence_length: int,
) -> Any:
    """The coordinator-mode engine for one bench mode (see the module docstring)."""
    from colo_fsm.adapters.megatron.coordinator import CoordinatorConfig, CoordinatorEngine, coordinator_dependencies

    if getattr(args, "device", "cuda") != "cuda":
        raise SystemExit("--engine coordinator needs --device cuda (megatron-core's dynamic engine runs on a GPU)")
    ok, why = coordinator_dependencies()
    if not ok:
        raise SystemExit(f"--engine coordinator: {why}")
    alphabet = getattr(getattr(tokenizer, "_base", tokenizer), "alphabet", None)
    tok = EodOutsideTokenizer(alphabet) if alphabet is not None else tokenizer
    return CoordinatorEngine(
        model,
        tok,
        CoordinatorConfig(
            kv_cache_mode="persist",
            buffer_size_gb=args.buffer_gb,
            max_requests=shape.max_active_requests,
            num_cuda_graphs=args.cuda_graphs,
        ),
        weight_version=weight_version,
        max_sequence_length=max_sequence_length,
    )


__all__ = ["EodOutsideTokenizer", "coordinator_engine"]
