"""Request bodies of the OpenAI-compatible server, read field by field.

Every field the server implements is checked here (type, range, ``null`` where OpenAI allows it); a field it
does not implement gets a 400 naming it unless it holds its no-op value (``presence_penalty: 0``, ``echo:
false``, ...), and an unknown field gets a 400 too: nothing is ignored silently. Messages quote at most a
short prefix of a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.errors import BadRequest

MAX_N = 64
MAX_TOKENS_LIMIT = 1 << 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
"""The default bound of ``logprobs`` (completions) / ``top_logprobs`` (chat); the engine's own bound wins."""
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
_SHORT = 40


def short(value: Any, limit: int = _SHORT) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 5 MB prompt never comes back in an error)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@dataclass(frozen=True)
class Sampling:
    """What one request asks the engine for (per choice), after validation."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token (completions: logprobs=k; chat: top_logprobs=k)
    stream: bool = False
    include_usage: bool = False
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:<id>"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def seed_for(self, choice: int) -> int | None:
        """The engine seed of choice ``choice`` (:func:`engine_seed`)."""
        return engine_seed(self.seed, choice)


def engine_seed(seed: int | None, offset: int = 0) -> int | None:
    """The seed an engine gets for the ``offset``-th sample of a request seeded ``seed``: ``seed + offset`` folded
    into [0, 2**63) (HTTP seeds may be negative or past int64; every engine takes a non-negative one); None stays
    None."""
    if seed is None:
        return None
    return (seed + offset) % (1 << 63)


_MISSING = object()

# fields OpenAI/vLLM define that this server does not implement, with the value that means "off"
_NOOP: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "repetition_penalty": lambda v: v == 1,
    "logit_bias": lambda v: v == {},
    "echo": lambda v: v is False,
    "suffix": lambda v: v == "",
    "best_of": lambda v: v == 1,
    "min_p": lambda v: v == 0,
    "min_tokens": lambda v: v == 0,
    "tools": lambda v: v == [],
    "tool_choice": lambda v: v == "none",
    "parallel_tool_calls": lambda v: isinstance(v, bool),
    "response_format": lambda v: v == {"type": "text"},
    "chat_template_kwargs": lambda v: v == {},
    "add_generation_prompt": lambda v: v is True,
    "continue_final_message": lambda v: v is False,
    "ignore_eos": lambda v: v is False,
    "skip_special_tokens": lambda v: v is True,
    "add_special_tokens": lambda v: isinstance(v, bool),
    "include_stop_str_in_output": lambda v: v is False,
    "prompt_logprobs": lambda v: v == 0,
    "reasoning_effort": lambda v: False,
    "modalities": lambda v: v == ["text"],
    "audio": lambda v: False,
    "prediction": lambda v: False,
    "service_tier": lambda v: v in ("auto", "default"),
    "store": lambda v: v is False,
    "metadata": lambda v: isinstance(v, dict),
    "truncation": lambda v: v == "disabled",
    "reasoning": lambda v: False,
    "previous_response_id": lambda v: False,
    "include": lambda v: v == [],
    "background": lambda v: v is False,
    "text": lambda v: v == {"format": {"type": "text"}},
    "top_logprobs": lambda v: v == 0,
}


class Body:
    """A JSON object being read: each ``get_*`` consumes one field; :meth:`finish` refuses what is left."""

    def __init__(self, data: Any, where: str = "") -> None:
        if not isinstance(data, dict):
            raise BadRequest(where or "body", f"expected a JSON object, got {type(data).__name__}")
        self.data = data
        self.where = where
        self._used: set[str] = set()

    def name(self, key: str) -> str:
        """The field's full name (``messages.0.role``)."""
        return f"{self.where}.{key}" if self.where else key

    def raw(self, key: str) -> Any:
        """The raw value (``None`` when absent or null), consumed."""
        self._used.add(key)
        return self.data.get(key)

    def has(self, key: str) -> bool:
        """Whether the field is present and not null."""
        return self.data.get(key) is not None

    def get_int(self, key: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
        """An integer (not a bool, not a float), within [lo, hi]; null or absent -> ``default``."""
        v = self.raw(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(self.name(key), f"expected an integer, got {short(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise BadRequest(self.name(key), f"{short(v)} is out of range [{lo}, {hi}]")
        return v

    def get_float(self, key: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
        """A finite number within [lo, hi] (or (lo, hi]); null or absent -> ``default``."""
        v = self.raw(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise BadRequest(self.name(key), f"expected a number, got {short(v)}")
        if v > hi or v < lo or (lo_open and v == lo):
            bracket = "(" if lo_open else "["
            raise BadRequest(self.name(key), f"{short(v)} is out of range {bracket}{lo:g}, {hi:g}]")
        return float(v)

    def get_bool(self, key: str, default: bool) -> bool:
        """A JSON boolean; null or absent -> ``default``."""
        v = self.raw(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise BadRequest(self.name(key), f"expected true or false, got {short(v)}")
        return v

    def get_str(self, key: str, default: str | None) -> str | None:
        """A string; null or absent -> ``default``."""
        v = self.raw(key)
        if v is None:
            return default
        if not isinstance(v, str):
            raise BadRequest(self.name(key), f"expected a string, got {short(v)}")
        return v

    def finish(self, ignore: Sequence[str] = ()) -> None:
        """Refuse every field not consumed: a known-but-unimplemented one unless it holds its no-op value."""
        for key, value in self.data.items():
            if key in self._used or key in ignore or value is None:
                continue
            noop = _NOOP.get(key)
            if noop is not None:
                try:
                    ok = bool(noop(value))
                except Exception:
                    ok = False
                if ok:
                    continue
                raise BadRequest(self.name(key), f"{short(value)} is not supported by this server")
            raise BadRequest(self.name(key), "unknown or unsupported parameter")


def _stop(body: Body) -> tuple[str, ...]:
    v = body.raw("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise BadRequest("stop", f"expected a string or a list of strings, got {short(v)}")
    if len(items) > MAX_STOP:
        raise BadRequest("stop", f"at most {MAX_STOP} stop sequences, got {len(items)}")
    if any(s == "" for s in items):
        raise BadRequest("stop", "stop sequences must not be empty")
    return tuple(items)


def _stop_ids(body: Body) -> tuple[int, ...]:
    v = body.raw("stop_token_ids")
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        raise BadRequest("stop_token_ids", f"expected a list of non-negative token ids, got {short(v)}")
    return tuple(v)


def _top(body: Body, key: str, limit: int) -> int | None:
    """``body[key]`` as a count of alternatives in [0, ``limit``] (None when absent or null)."""
    v = body.raw(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(key, f"expected an integer in [0, {limit}], got {short(v)}")
    if not 0 <= v <= limit:
        raise BadRequest(key, f"{short(v)} is out of range [0, {limit}] (this engine's max_top_logprobs is {limit})")
    return v


def read_sampling(
    body: Body,
    *,
    chat: bool,
    max_tokens_key: str = "max_tokens",
    default_max_tokens: int = 16,
    max_top_logprobs: int = MAX_TOP_LOGPROBS,
) -> Sampling:
    """The sampling fields shared by completions, chat and responses (consumed from ``body``).

    Completions take ``logprobs: k`` (the sampled token's log-prob plus its ``k`` most likely alternatives);
    chat takes ``logprobs: true`` and ``top_logprobs: k``. ``k`` is bounded by ``max_top_logprobs``.
    """
    max_tokens = body.get_int(max_tokens_key, None, 1, MAX_TOKENS_LIMIT)
    if chat:
        alias = body.get_int("max_completion_tokens", None, 1, MAX_TOKENS_LIMIT)
        max_tokens = alias if alias is not None else max_tokens
    temperature = body.get_float("temperature", 1.0, 0.0, 2.0)
    top_p = body.get_float("top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = body.get_int("top_k", 0, -1, None) or 0
    seed = body.get_int("seed", None, *SEED_RANGE)
    n = body.get_int("n", 1, 1, MAX_N) or 1
    if chat:
        logprobs = body.get_bool("logprobs", False)
        top = _top(body, "top_logprobs", max_top_logprobs)
        if top is not None and not logprobs:
            raise BadRequest("top_logprobs", "needs logprobs=true")
        top_logprobs = top or 0
    else:
        lp = _top(body, "logprobs", max_top_logprobs)
        logprobs = lp is not None
        top_logprobs = lp or 0
    stream = body.get_bool("stream", False)
    opts = body.raw("stream_options")
    include_usage = False
    if opts is not None:
        o = Body(opts, "stream_options")
        include_usage = o.get_bool("include_usage", False)
        o.get_bool("continuous_usage_stats", False) and _refuse("stream_options.continuous_usage_stats")
        o.finish()
        if not stream:
            raise BadRequest("stream_options", "only allowed with stream=true")
    tokens_as_ids = body.get_bool("return_tokens_as_token_ids", False)
    body.get_bool("return_token_ids", False)  # token ids are always returned
    body.get_str("user", None)
    return Sampling(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(0, top_k),
        seed=seed,
        n=n,
        stop=_stop(body),
        stop_token_ids=_stop_ids(body),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=include_usage,
        tokens_as_ids=tokens_as_ids,
    )


def _refuse(param: str) -> bool:
    raise BadRequest(param, "is not supported by this server")


@dataclass(frozen=True)
class OnPolicy:
    """The training rollouts' sampling: a request whose temperature or top_p differs gets a 400 naming both.

    Off-policy samples would silently bias a gym's training data; refuse them instead (``None`` = no guard).
    """

    temperature: float = 1.0
    top_p: float = 1.0

    def check(self, s: Sampling) -> None:
        """Raise :class:`BadRequest` when ``s`` samples differently from the training rollouts."""
        if not math.isclose(s.temperature, self.temperature, abs_tol=1e-9):
            raise BadRequest(
                "temperature",
                f"{s.temperature:g} differs from the training rollouts' temperature {self.temperature:g} "
                "(on-policy guard)",
            )
        if not math.isclose(s.top_p, self.top_p, abs_tol=1e-9):
            raise BadRequest(
                "top_p", f"{s.top_p:g} differs from the training rollouts' top_p {self.top_p:g} (on-policy guard)"
            )


__all__ = [
    "MAX_N",
    "MAX_TOKENS_LIMIT",
    "MAX_TOP_LOGPROBS",
    "BadRequest",
    "Body",
    "OnPolicy",
    "Sampling",
    "engine_seed",
    "read_sampling",
    "short",
]
