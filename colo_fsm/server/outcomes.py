"""How every HTTP request ended, counted once (:class:`Outcomes`), by an ASGI middleware (:class:`OutcomeMiddleware`).

Each request to an API endpoint gets a :class:`RequestTag`; the code that knows how it ended (an error handler, a
stream, the client watch) sets its :class:`Outcome`, and the middleware records it when the exchange is over,
from the status sent when nothing set it. ``/health`` and ``/metrics`` are not counted.

Client outcomes (``client_gone``, ``upload_timeout``) are the client's doing: counted with the stage where they
happened and their reason, logged at most at INFO, never counted as server errors. ``error`` is a server error (a
500, or a stream ended by an engine failure).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from colo_fsm.server.client import Stage

TAG_KEY = "colo_fsm_outcome"
"""Where a request's :class:`RequestTag` lives in its ASGI scope's ``state``."""

API_ENDPOINTS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/tokenize",
    "/v1/tokenize",
    "/detokenize",
    "/v1/detokenize",
    "/v1/models",
)
"""The endpoints whose requests are counted (``/v1/models/{id}`` too); any other path counts as ``other``."""
NOT_COUNTED = ("/health", "/metrics")


class Outcome(StrEnum):
    """How one request ended."""

    ANSWERED = "answered"  # 200 with the whole answer (a stream: through [DONE])
    BAD_REQUEST = "bad_request"  # 400, 404, 405, 413, 415, 422: the request is at fault
    UPLOAD_TIMEOUT = "upload_timeout"  # 408: the body did not arrive within upload_timeout_s (client outcome)
    CLIENT_GONE = "client_gone"  # the client disconnected, reset or timed out (client outcome; with its stage)
    BUSY = "busy"  # 429: over the token budget or its queue
    SUSPENDED = "suspended"  # 503 with Retry-After: the engine stayed suspended past request_timeout_s
    SHUTTING_DOWN = "shutting_down"  # 503 without Retry-After: the server is going away
    ERROR = "error"  # a server error: 500, or a stream ended by an engine failure


CLIENT_OUTCOMES = frozenset({Outcome.CLIENT_GONE, Outcome.UPLOAD_TIMEOUT})
_BY_STATUS = {200: Outcome.ANSWERED, 408: Outcome.UPLOAD_TIMEOUT, 429: Outcome.BUSY, 499: Outcome.CLIENT_GONE}


def outcome_of_status(status: int | None) -> Outcome:
    """The outcome a response status means when nothing more precise was recorded."""
    if status is None:
        return Outcome.ERROR
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status == 503:
        return Outcome.SUSPENDED
    if 400 <= status < 500:
        return Outcome.BAD_REQUEST
    return Outcome.ANSWERED if status < 400 else Outcome.ERROR


def endpoint_of(path: str) -> str | None:
    """The endpoint label of ``path`` (None for the paths not counted)."""
    if path in NOT_COUNTED:
        return None
    if path in API_ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return "other"


@dataclass
class RequestTag:
    """One request's endpoint and, once known, its outcome (the first one set wins) and the stage of a client
    outcome."""

    endpoint: str
    outcome: Outcome | None = None
    stage: Stage | None = None

    def set(self, outcome: Outcome, stage: Stage | None = None) -> None:
        """Record how the request ended, unless that is known already."""
        if self.outcome is None:
            self.outcome = outcome
            self.stage = stage


def tag_of(scope: Any) -> RequestTag | None:
    """The :class:`RequestTag` of a request (its ASGI scope, or anything with a ``scope``), if it has one."""
    scope = getattr(scope, "scope", scope)
    state = scope.get("state") if isinstance(scope, dict) else None
    tag = state.get(TAG_KEY) if isinstance(state, dict) else None
    return tag if isinstance(tag, RequestTag) else None


class Outcomes:
    """Counts of how requests ended: by outcome, by endpoint, and client outcomes by stage and reason.

    ``listener(endpoint, outcome, stage)`` (the Prometheus counters) hears every recorded request.
    """

    def __init__(self, listener: Callable[[str, Outcome, Stage | None], None] | None = None) -> None:
        self._listener = listener
        self.by_outcome: Counter[str] = Counter({o.value: 0 for o in Outcome})
        self.by_endpoint: Counter[tuple[str, str]] = Counter()
        self.client: Counter[str] = Counter({f"{s.value}": 0 for s in Stage})

    def record(self, tag: RequestTag, status: int | None) -> Outcome:
        """Count one finished request (its tag's outcome, else what ``status`` means); the outcome counted."""
        outcome = tag.outcome if tag.outcome is not None else outcome_of_status(status)
        stage = tag.stage
        if outcome is Outcome.UPLOAD_TIMEOUT:
            stage = Stage.UPLOAD
        self.by_outcome[outcome.value] += 1
        self.by_endpoint[(tag.endpoint, outcome.value)] += 1
        if outcome in CLIENT_OUTCOMES and stage is not None:
            self.client[stage.value] += 1
        if self._listener is not None:
            self._listener(tag.endpoint, outcome, stage)
        return outcome

    def counts(self) -> dict[str, Any]:
        """``{outcome: n}`` plus ``client_gone_by_stage`` (client outcomes by the stage they happened in)."""
        return {**dict(self.by_outcome), "client_by_stage": dict(self.client)}


class OutcomeMiddleware:
    """ASGI middleware: tags each API request, and records its outcome once when the exchange is over."""

    def __init__(self, app: Any, outcomes: Outcomes) -> None:
        self.app = app
        self.outcomes = outcomes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        endpoint = endpoint_of(scope.get("path", "")) if scope.get("type") == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        tag = RequestTag(endpoint)
        scope.setdefault("state", {})[TAG_KEY] = tag
        status: list[int] = []

        async def send_and_note(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except BaseException:
            tag.set(Outcome.ERROR)
            raise
        finally:
            self.outcomes.record(tag, status[0] if status else None)


__all__ = [
    "API_ENDPOINTS",
    "CLIENT_OUTCOMES",
    "TAG_KEY",
    "Outcome",
    "OutcomeMiddleware",
    "Outcomes",
    "RequestTag",
    "endpoint_of",
    "outcome_of_status",
    "tag_of",
]
