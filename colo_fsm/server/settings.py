"""Limits and policies of one OpenAI-compatible server (:class:`ServerSettings`), checked once."""

from __future__ import annotations

from dataclasses import dataclass

from colo_fsm.errors import ConfigError
from colo_fsm.server.params import OnPolicy

DEFAULT_MAX_REQUEST_TOKENS = 1 << 15


@dataclass(frozen=True)
class ServerSettings:
    """Limits and policies of one server.

    ``max_request_tokens`` bounds ``prompts x n x max_tokens`` per request (400 beyond it, so one request cannot
    hold the engine long enough to starve training); ``on_policy`` refuses requests whose temperature or top_p
    differ from the training rollouts'; ``inflight`` is ``"park"`` (a suspend parks admitted requests in the
    engine) or ``"drain"`` (a suspend waits for them).
    """

    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    on_policy: OnPolicy | None = None
    inflight: str = "park"
    default_max_tokens: int = 16

    def __post_init__(self) -> None:
        v = self.max_request_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError("max_request_tokens", v, "a positive integer (prompts x n x max_tokens per request)")
        if self.inflight not in ("park", "drain"):
            raise ConfigError("inflight", self.inflight, "'park' or 'drain'")
        if self.on_policy is not None and not isinstance(self.on_policy, OnPolicy):
            raise ConfigError("on_policy", self.on_policy, "an OnPolicy(temperature, top_p) or None")


__all__ = ["DEFAULT_MAX_REQUEST_TOKENS", "ServerSettings"]
