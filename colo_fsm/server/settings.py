"""Limits and policies of one OpenAI-compatible server (:class:`ServerSettings`), checked once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colo_fsm.adapters.engine.options import parse_inflight
from colo_fsm.errors import ConfigError
from colo_fsm.server.params import OnPolicy

DEFAULT_MAX_REQUEST_TOKENS = 1 << 15
"""The per-request bound in tokens when the engine does not say how much one batch holds."""
DEFAULT_MAX_WAITING_REQUESTS = 1024
DEFAULT_MAX_BODY_BYTES = 4 << 20
MAX_JSON_DEPTH = 64


def _positive(name: str, v: Any, what: str, *, optional: bool = False) -> None:
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(name, v, what + (", or None (derived from the engine)" if optional else ""))


@dataclass(frozen=True)
class ServerSettings:
    """Limits and policies of one server.

    ``max_request_tokens`` bounds what one request costs the engine, ``sum((prompt tokens + max_tokens) x n)``
    over its prompts (400 beyond it); ``max_inflight_tokens`` bounds the tokens of every HTTP request the
    engine holds at once (a request that does not fit waits up to ``request_timeout_s``, then 429 with
    Retry-After, or 503 while the engine is suspended). Both default (None) to one engine batch,
    ``max_active_requests x max_sequence_length`` of the engine (else :data:`DEFAULT_MAX_REQUEST_TOKENS`); an
    unset per-request bound is never above ``max_inflight_tokens``.
    ``max_waiting_requests`` more requests waiting for room get a 429 at once. ``max_body_bytes`` bounds a
    request body (413, checked from ``Content-Length`` and while reading). ``on_policy`` refuses requests whose
    temperature or top_p differ from the training rollouts'; ``inflight`` is what a suspend does with the
    requests the server handed to the engine: ``"park"`` (alias ``"keep"``: kept in the engine, finished after the
    resume), ``"abort"`` (the engine ends them at the suspend and resubmits prompt + tokens so far after the
    resume; the server's gate does as for park) or ``"drain"`` (alias ``"wait"``: the suspend waits for them);
    None (default) means the engine's own policy under a :class:`GatedEngine`, else park.
    """

    max_request_tokens: int | None = None
    on_policy: OnPolicy | None = None
    inflight: str | None = None
    default_max_tokens: int = 16
    max_inflight_tokens: int | None = None
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        per_req = "a positive integer (tokens one request costs the engine: (prompt + max_tokens) x n)"
        _positive("max_request_tokens", self.max_request_tokens, per_req, optional=True)
        _positive("max_inflight_tokens", self.max_inflight_tokens, "a positive integer", optional=True)
        _positive("max_waiting_requests", self.max_waiting_requests, "a positive integer")
        _positive("max_body_bytes", self.max_body_bytes, "a positive number of bytes")
        _positive("default_max_tokens", self.default_max_tokens, "a positive integer")
        if (
            self.max_request_tokens is not None
            and self.max_inflight_tokens is not None
            and self.max_request_tokens > self.max_inflight_tokens
        ):
            raise ConfigError(
                "max_request_tokens",
                self.max_request_tokens,
                f"at most max_inflight_tokens={self.max_inflight_tokens} (a request over it could never run)",
            )
        if self.inflight is not None:
            object.__setattr__(self, "inflight", parse_inflight(self.inflight).value)
        if self.on_policy is not None and not isinstance(self.on_policy, OnPolicy):
            raise ConfigError("on_policy", self.on_policy, "an OnPolicy(temperature, top_p) or None")

    @property
    def inflight_policy(self) -> str:
        """``inflight`` resolved: ``"park"`` when unset."""
        return self.inflight or "park"

    def token_limits(self, engine: Any) -> tuple[int, int]:
        """``(max_request_tokens, max_inflight_tokens)`` with the defaults resolved against ``engine``: one engine
        batch, ``max_active_requests x max_sequence_length``, when the engine tells both."""
        batch = engine_batch_tokens(engine)
        per_request = self.max_request_tokens or batch or DEFAULT_MAX_REQUEST_TOKENS
        if self.max_request_tokens is None and self.max_inflight_tokens is not None:
            per_request = min(per_request, self.max_inflight_tokens)  # no request may be bigger than them all
        inflight = self.max_inflight_tokens or max(per_request, batch or 0)
        return per_request, inflight


def engine_batch_tokens(engine: Any) -> int | None:
    """``max_active_requests x max_sequence_length`` of ``engine`` (its ``config`` or itself), None if unknown."""
    if engine is None:
        return None
    seq = getattr(engine, "max_sequence_length", None)
    active = getattr(getattr(engine, "config", None), "max_active_requests", None)
    if active is None:
        active = getattr(engine, "max_active_requests", None)
    if isinstance(seq, int) and isinstance(active, int) and seq > 0 and active > 0:
        return seq * active
    return None


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_REQUEST_TOKENS",
    "DEFAULT_MAX_WAITING_REQUESTS",
    "MAX_JSON_DEPTH",
    "ServerSettings",
    "engine_batch_tokens",
]
