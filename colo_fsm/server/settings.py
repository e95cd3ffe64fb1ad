"""Limits and policies of one OpenAI-compatible server (:class:`ServerSettings`), checked once."""

from __future__ import annotations

import math
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
DEFAULT_MAX_REQUEST_SHARE = 0.4
"""The default share of ``max_inflight_tokens`` that one request may cost: no request can hold the whole budget,
and the two largest together leave a fifth of it to smaller requests (which then never wait for a large one to
finish)."""
DEFAULT_FAIR_WINDOW_S = 2.0
"""How long a request costing the whole budget lets cheaper ones that arrive after it go first (see
:class:`~colo_fsm.server.budget.TokenBudget`)."""
DEFAULT_UPLOAD_TIMEOUT_S = 30.0
DEFAULT_MAX_RETRY_AFTER_S = 60


def _positive(name: str, v: Any, what: str, *, optional: bool = False) -> None:
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(name, v, what + (", or None (derived from the engine)" if optional else ""))


def _seconds(name: str, v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(name, v, what)


@dataclass(frozen=True)
class ServerSettings:
    """Limits and policies of one server.

    ``max_request_tokens`` bounds what one request costs the engine, ``sum((prompt tokens + max_tokens) x n)``
    over its prompts (400 beyond it); ``max_inflight_tokens`` bounds the tokens of every HTTP request the
    engine holds at once (a request that does not fit waits up to ``request_timeout_s``, then 429 with
    Retry-After; a request waiting for a suspended engine gets 503 with Retry-After after that wait).
    ``max_inflight_tokens`` defaults (None) to one engine batch, ``max_active_requests x max_sequence_length`` of
    the engine (else :data:`DEFAULT_MAX_REQUEST_TOKENS`), ``max_request_tokens`` to ``max_request_share`` of it.
    ``max_waiting_requests`` more requests waiting for room get a 429 at once. ``max_body_bytes`` bounds a
    request body (413, checked from ``Content-Length`` and while reading). ``on_policy`` refuses requests whose
    temperature or top_p differ from the training rollouts'; ``inflight`` is what a suspend does with the
    requests the server handed to the engine: ``"park"`` (alias ``"keep"``: kept in the engine, finished after the
    resume), ``"abort"`` (the engine ends them at the suspend and resubmits prompt + tokens so far after the
    resume; the server's gate does as for park) or ``"drain"`` (alias ``"wait"``: the suspend waits for them);
    None (default) means the engine's own policy under a :class:`GatedEngine`, else park.

    Fairness: ``max_request_share`` (in (0, 1], default 0.4) caps what one request may cost as a share of
    ``max_inflight_tokens``, so no single request can hold the whole budget (an unset ``max_request_tokens``
    defaults to that cap; a set one above it is refused). Waiting requests are granted cheapest-deadline first:
    a request's deadline is its arrival plus ``fair_window_s x cost / max_inflight_tokens``, so a small request
    passes a large one that arrived less than that before it, and a large one whose deadline has passed is served
    before anything behind it (no starvation). ``upload_timeout_s`` bounds the reading of a request body (408
    after it). ``max_retry_after_s`` bounds the ``Retry-After`` the server computes (from its budget's drain
    rate for a 429, from the measured handoff length for a 503).
    """

    max_request_tokens: int | None = None
    on_policy: OnPolicy | None = None
    inflight: str | None = None
    default_max_tokens: int = 16
    max_inflight_tokens: int | None = None
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_request_share: float = DEFAULT_MAX_REQUEST_SHARE
    fair_window_s: float = DEFAULT_FAIR_WINDOW_S
    upload_timeout_s: float = DEFAULT_UPLOAD_TIMEOUT_S
    max_retry_after_s: int = DEFAULT_MAX_RETRY_AFTER_S

    def __post_init__(self) -> None:
        per_req = "a positive integer (tokens one request costs the engine: (prompt + max_tokens) x n)"
        _positive("max_request_tokens", self.max_request_tokens, per_req, optional=True)
        _positive("max_inflight_tokens", self.max_inflight_tokens, "a positive integer", optional=True)
        _positive("max_waiting_requests", self.max_waiting_requests, "a positive integer")
        _positive("max_body_bytes", self.max_body_bytes, "a positive number of bytes")
        _positive("default_max_tokens", self.default_max_tokens, "a positive integer")
        _positive("max_retry_after_s", self.max_retry_after_s, "a positive whole number of seconds")
        _seconds("fair_window_s", self.fair_window_s, "a positive number of seconds")
        _seconds("upload_timeout_s", self.upload_timeout_s, "a positive number of seconds")
        share = self.max_request_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 < float(share) <= 1.0:
            raise ConfigError(
                "max_request_share", share, "a number in (0, 1] (the share of max_inflight_tokens one request may cost)"
            )
        if self.max_request_tokens is not None and self.max_inflight_tokens is not None:
            self.token_limits(None)  # both set: a per-request bound over the share is refused now, not at bring-up
        if self.inflight is not None:
            object.__setattr__(self, "inflight", parse_inflight(self.inflight).value)
        if self.on_policy is not None and not isinstance(self.on_policy, OnPolicy):
            raise ConfigError("on_policy", self.on_policy, "an OnPolicy(temperature, top_p) or None")

    @property
    def inflight_policy(self) -> str:
        """``inflight`` resolved: ``"park"`` when unset."""
        return self.inflight or "park"

    def token_limits(self, engine: Any) -> tuple[int, int]:
        """``(max_request_tokens, max_inflight_tokens)`` with the defaults resolved against ``engine``.

        ``max_inflight_tokens`` defaults to one engine batch, ``max_active_requests x max_sequence_length``, when
        the engine tells both (else :data:`DEFAULT_MAX_REQUEST_TOKENS`, or ``max_request_tokens`` when only that is
        set); ``max_request_tokens`` to ``max_request_share`` of it. A ``max_request_tokens`` above that share is
        refused (:class:`ConfigError`): one request could hold more of the budget than the share allows.
        """
        batch = engine_batch_tokens(engine)
        inflight = self.max_inflight_tokens or max(batch or DEFAULT_MAX_REQUEST_TOKENS, self.max_request_tokens or 0)
        cap = max(1, math.floor(float(self.max_request_share) * inflight))
        if self.max_request_tokens is None:
            return cap, inflight
        if self.max_request_tokens > cap:
            raise ConfigError(
                "max_request_tokens",
                self.max_request_tokens,
                f"at most max_request_share={self.max_request_share:g} x max_inflight_tokens={inflight} = {cap} "
                "(raise max_request_share, up to 1, to let one request hold more of the budget)",
            )
        return self.max_request_tokens, inflight


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
    "DEFAULT_FAIR_WINDOW_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_REQUEST_SHARE",
    "DEFAULT_MAX_REQUEST_TOKENS",
    "DEFAULT_MAX_RETRY_AFTER_S",
    "DEFAULT_MAX_WAITING_REQUESTS",
    "DEFAULT_UPLOAD_TIMEOUT_S",
    "MAX_JSON_DEPTH",
    "ServerSettings",
    "engine_batch_tokens",
]
