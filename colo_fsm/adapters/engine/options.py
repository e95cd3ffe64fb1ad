"""The engine loop's options and request checks: admission priority, in-flight policy, sampling values, seeds."""

from __future__ import annotations

import math
from enum import IntEnum, StrEnum
from typing import Any

from colo_fsm.errors import ConfigError

DEFAULT_MAX_TOP_LOGPROBS = 20
"""The default bound of ``top_logprobs`` per request (OpenAI's own limit)."""

DEFAULT_SERVER_SHARE = 0.5
"""The default share of ``max_active_requests`` that :attr:`Priority.SERVER` requests may hold at once."""


class Priority(IntEnum):
    """Admission order between decode steps: lower value is admitted first."""

    TRAINING = 0  # the trainer's own rollouts and validation
    SERVER = 1  # HTTP traffic


class InflightPolicy(StrEnum):
    """What a suspend does with admitted requests (vLLM's and SGLang's pause modes: keep / wait / abort).

    The values are colo-fsm's names; :func:`parse_inflight` also takes the pause-mode names ``"keep"`` (= park)
    and ``"wait"`` (= drain).
    """

    PARK = "park"  # "keep": stop at a decode-step boundary, requests kept in the engine (default)
    DRAIN = "drain"  # "wait": close admission and wait until every admitted request finished (strictly on-policy)
    ABORT = "abort"  # end the requests in the engine at the suspend; resubmit prompt + tokens so far after the resume


class LogprobsMode(StrEnum):
    """Which distribution a token's returned log-prob (and its ``top_logprobs`` alternatives) is taken from
    (vLLM's ``logprobs_mode`` names, without the ``_logprobs`` suffix)."""

    RAW = "raw"  # the model's own softmax, before temperature / top-k / top-p (vLLM's default; colo-fsm's default)
    PROCESSED = "processed"  # after temperature, top-k and top-p: the distribution the token was sampled from


LOGPROBS_MODE_CHOICES = "'raw' (the untempered model distribution) or 'processed' (the distribution sampled)"


def parse_logprobs_mode(value: Any) -> LogprobsMode:
    """``value`` as a :class:`LogprobsMode`; anything else raises :class:`ConfigError` naming ``logprobs_mode``."""
    raw = value.value if isinstance(value, StrEnum) else value
    try:
        return LogprobsMode(raw.strip().lower() if isinstance(raw, str) else raw)
    except ValueError:
        raise ConfigError("logprobs_mode", value, LOGPROBS_MODE_CHOICES) from None


INFLIGHT_ALIASES = {"keep": InflightPolicy.PARK, "wait": InflightPolicy.DRAIN}
"""The pause-mode names users know from vLLM and SGLang, and the policy each one is."""

INFLIGHT_CHOICES = "one of 'park' (alias 'keep', default), 'drain' (alias 'wait'), 'abort'"


def parse_inflight(value: Any) -> InflightPolicy:
    """``value`` as an :class:`InflightPolicy` (aliases: ``"keep"``, ``"wait"``); anything else raises
    :class:`ConfigError` naming the field ``inflight`` and the choices."""
    raw = value.value if isinstance(value, StrEnum) else value
    if not isinstance(raw, str):
        raise ConfigError("inflight", value, INFLIGHT_CHOICES)
    name = raw.strip().lower()
    if name in INFLIGHT_ALIASES:
        return INFLIGHT_ALIASES[name]
    try:
        return InflightPolicy(name)
    except ValueError:
        raise ConfigError("inflight", value, INFLIGHT_CHOICES) from None


def check_share(value: Any, name: str = "server_share") -> float:
    """``value`` as a share in (0, 1]; anything else raises :class:`ConfigError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < float(value) <= 1.0:
        raise ConfigError(name, value, "a number in (0, 1] (the share of max_active_requests; 1: no cap)")
    return float(value)


def share_slots(share: float, max_active_requests: int) -> int:
    """The active requests a ``share`` of ``max_active_requests`` allows (rounded up, at least 1)."""
    return max(1, min(max_active_requests, math.ceil(share * max_active_requests - 1e-9)))


def request_seed(seed: int | None, index: int) -> int | None:
    """The seed of the ``index``-th request of a call seeded ``seed``: distinct per request and per call seed."""
    if seed is None:
        return None
    return (int(seed) * 0x9E3779B1 + (index + 1) * 0x85EBCA77) % (2**63)


def positive_int(name: str, value: Any, what: str = "a positive integer") -> int:
    """``value`` if it is an int >= 1 (not a bool); else :class:`ConfigError` naming ``name``."""
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


__all__ = [
    "DEFAULT_MAX_TOP_LOGPROBS",
    "DEFAULT_SERVER_SHARE",
    "INFLIGHT_ALIASES",
    "INFLIGHT_CHOICES",
    "LOGPROBS_MODE_CHOICES",
    "InflightPolicy",
    "LogprobsMode",
    "Priority",
    "check_sampling",
    "check_share",
    "check_top_logprobs",
    "parse_inflight",
    "parse_logprobs_mode",
    "positive_int",
    "request_seed",
    "share_slots",
]
