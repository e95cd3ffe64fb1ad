"""OpenAI-compatible HTTP server over the colocated engine, with a suspend gate.

* :class:`SuspendGate` -- requests wait while the engine is suspended (bounded; then 503 + Retry-After) and
  the engine is suspended only once in-flight requests finished.
* :class:`GatedEngine` -- wraps ``(engine, generator)``; is itself a ``GenerationEngine`` and ``TextGenerator``.
  ``serve=True`` starts one :class:`OpenAIServer` per data-parallel rank in ``bring_up()`` (built once) and
  gathers the base URLs (published by the lifecycle as ``dp_openai_server_base_urls``).
* :class:`OpenAIServer` / :func:`create_app` -- ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
  ``/health`` and ``/metrics`` (Prometheus) on FastAPI + uvicorn; binds ``127.0.0.1`` by default.

Under load (``docs/serving.md``): a fair token budget (:mod:`colo_fsm.server.budget`), ``Retry-After`` from what
was measured (:mod:`colo_fsm.server.retry`), client churn counted as client outcomes by stage
(:mod:`colo_fsm.server.client`, :mod:`colo_fsm.server.outcomes`), metrics (:mod:`colo_fsm.server.metrics`).
"""

from colo_fsm.server.app import ServerSettings, create_app, default_chat_template
from colo_fsm.server.gate import ClosedSpan, ServedSpan, SuspendGate, overlaps
from colo_fsm.server.params import BadRequest, OnPolicy, Sampling
from colo_fsm.server.server import LOOPBACK, GatedEngine, OpenAIServer, gather_base_urls

__all__ = [
    "LOOPBACK",
    "BadRequest",
    "ClosedSpan",
    "GatedEngine",
    "OnPolicy",
    "OpenAIServer",
    "Sampling",
    "ServedSpan",
    "ServerSettings",
    "SuspendGate",
    "create_app",
    "default_chat_template",
    "gather_base_urls",
    "overlaps",
]
