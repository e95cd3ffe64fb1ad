"""Prometheus metrics of one server (``GET /metrics``), through the ``prometheus-client`` library.

Each server has its own registry (two servers in one process never share series) and every series carries the
serving ``rank``, so the servers of a data-parallel run (one per replica) are told apart. Counted as they happen:

=====================================================  =========  ==============================================
series                                                  type       what
=====================================================  =========  ==============================================
``colo_fsm_http_requests_total{endpoint,outcome}``      counter    requests by how they ended (``outcomes``)
``colo_fsm_http_client_outcomes_total{stage,reason}``   counter    client churn: disconnects and upload timeouts
``colo_fsm_http_queue_wait_seconds``                    histogram  body read to handed to the engine
``colo_fsm_http_retry_after_seconds{code}``             histogram  the ``Retry-After`` given with 429 and 503
``colo_fsm_handoff_duration_seconds``                   histogram  each handoff: the gate closed until reopened
=====================================================  =========  ==============================================

Read at scrape time from what the server holds (never waiting on the engine's lock): the token budget
(``colo_fsm_http_tokens_held``, ``_limit``, ``_waiting``, ``colo_fsm_http_tokens_admitted_total``, the drain
rate), requests per stage, whether the server admits, the engine's ``queued``/``running``/``parked`` requests per
priority and its server slots, its steps from its step profile where it keeps one (megatron-core's dynamic engine,
on either path: ``colo_fsm_engine_steps_total{kind}`` and ``colo_fsm_engine_step_seconds_total{kind}`` per kind of
step, ``colo_fsm_engine_graph_steps_total{graph}`` and ``colo_fsm_engine_graph_requests_total{graph}`` per captured
decode-only graph, whose ratio to the graph's size is how full its steps ran, and
``colo_fsm_engine_step_record_errors_total``; the scrapes that could not read that profile, whose step series
they left out, in ``colo_fsm_engine_step_profile_read_errors_total``), and the lifecycle: ``colo_fsm_lifecycle_state{state}`` (1 for the state now),
``colo_fsm_lifecycle_state_seconds_total{state}``, ``colo_fsm_weight_version``, ``colo_fsm_train_steps_total``
and ``colo_fsm_train_step_rate`` (steps per second over the last minute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from colo_fsm.log import get_logger
from colo_fsm.server.client import Stage
from colo_fsm.server.lifecycle_clock import LifecycleReading
from colo_fsm.server.outcomes import API_ENDPOINTS, CLIENT_OUTCOMES, Outcome

log = get_logger(__name__)

QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HANDOFF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RETRY_AFTER_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
GENERATION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


@dataclass(frozen=True)
class ServerReading:
    """What the server holds right now, for one scrape (built by the server's context)."""

    tokens_held: int
    tokens_limit: int
    tokens_waiting: int
    requests_waiting: int
    requests_holding: int
    tokens_admitted: int
    requests_admitted: int
    drain_tokens_per_s: float
    stages: Mapping[str, int]
    admitting: bool
    engine: Mapping[str, Any] | None = None  # priority -> (queued, running, parked)
    server_slots: int | None = None
    lifecycle: LifecycleReading | None = None
    state: str | None = None  # the lifecycle state from its status, when no trace is attached
    weight_version: int | None = None
    engine_steps: Mapping[str, Any] | None = None  # the engine's step profile's totals (step_profile.totals)
    engine_step_read_errors: int | None = None  # scrapes that failed to read it (None: no step_profile method)
    extra: Mapping[str, float] = field(default_factory=dict)


class ServerMetrics:
    """One server's Prometheus registry: counters and histograms fed as things happen, plus the series read at
    scrape time from :meth:`watch`'s reading."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = str(int(rank))
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "colo_fsm_http_requests", "HTTP requests by endpoint and how they ended", ["rank", "endpoint", "outcome"],
            registry=r,
        )  # fmt: skip
        self._client = Counter(
            "colo_fsm_http_client_outcomes",
            "Client churn (never a server error): disconnects, resets, client timeouts and upload timeouts, by the "
            "stage of the exchange",
            ["rank", "endpoint", "stage", "reason"],
            registry=r,
        )
        self._queue_wait = Histogram(
            "colo_fsm_http_queue_wait_seconds",
            "Seconds from a request's body read to its hand-over to the engine (token budget, then the suspend gate)",
            ["rank"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self._retry_after = Histogram(
            "colo_fsm_http_retry_after_seconds",
            "The Retry-After given: with 429 from the budget's drain rate, with 503 from the handoffs' length",
            ["rank", "code"],
            buckets=RETRY_AFTER_BUCKETS,
            registry=r,
        )
        self._handoff = Histogram(
            "colo_fsm_handoff_duration_seconds",
            "Each handoff: the server's suspend gate closed until it opened again",
            ["rank"],
            buckets=HANDOFF_BUCKETS,
            registry=r,
        )
        for endpoint in GENERATION_ENDPOINTS:  # every series of the dashboards exists from the start
            for outcome in Outcome:
                self._requests.labels(self.rank, endpoint, outcome.value)
            for stage in Stage:
                self._client.labels(self.rank, endpoint, stage.value, "disconnected")
            self._client.labels(self.rank, endpoint, Stage.UPLOAD.value, "timed_out")
        self._queue_wait.labels(self.rank)
        self._handoff.labels(self.rank)
        for code in ("429", "503"):
            self._retry_after.labels(self.rank, code)

    # ------------------------------------------------------------------ fed as things happen
    def request_ended(self, endpoint: str, outcome: Outcome, stage: Stage | None) -> None:
        """Count one request's outcome (the :class:`~colo_fsm.server.outcomes.Outcomes` listener)."""
        if endpoint not in API_ENDPOINTS and endpoint != "/v1/models/{id}":
            endpoint = "other"
        self._requests.labels(self.rank, endpoint, outcome.value).inc()
        if outcome in CLIENT_OUTCOMES:
            reason = "timed_out" if outcome is Outcome.UPLOAD_TIMEOUT else "disconnected"
            where = stage.value if stage is not None else "unknown"
            self._client.labels(self.rank, endpoint, where, reason).inc()

    def queue_waited(self, seconds: float) -> None:
        """Observe one request's wait before the engine."""
        self._queue_wait.labels(self.rank).observe(max(0.0, seconds))

    def retry_after_given(self, code: int, seconds: int) -> None:
        """Observe a ``Retry-After`` sent with ``code``."""
        self._retry_after.labels(self.rank, str(code)).observe(seconds)

    def handoff_ended(self, seconds: float) -> None:
        """Observe one handoff's length (the gate's listener)."""
        self._handoff.labels(self.rank).observe(max(0.0, seconds))

    # ------------------------------------------------------------------ read at scrape time
    def watch(self, read: Callable[[], ServerReading]) -> None:
        """Expose the series read at scrape time from ``read()``."""
        self.registry.register(_Live(self.rank, read))

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every series, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Live(Collector):
    """The series computed from a :class:`ServerReading` at each scrape."""

    def __init__(self, rank: str, read: Callable[[], ServerReading]) -> None:
        self._rank = rank
        self._read = read

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time: nothing to check for name clashes at registration

    def collect(self) -> Iterator[Metric]:
        try:
            r = self._read()
        except Exception:  # a scrape must answer even when a source is broken: leave these series out
            log.warning("rank %s: /metrics could not read the server's state", self._rank, exc_info=True)
            return
        rank = self._rank

        def gauge(name: str, doc: str, value: float, labels: Mapping[str, str] | None = None) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=["rank", *(labels or {})])
            fam.add_metric([rank, *(labels or {}).values()], float(value))
            return fam

        yield gauge("colo_fsm_http_tokens_held", "Tokens the engine holds for admitted HTTP requests", r.tokens_held)
        yield gauge("colo_fsm_http_tokens_limit", "The token budget, max_inflight_tokens", r.tokens_limit)
        yield gauge("colo_fsm_http_tokens_waiting", "Tokens of the requests waiting for the budget", r.tokens_waiting)
        yield gauge("colo_fsm_http_requests_waiting", "Requests waiting for the token budget", r.requests_waiting)
        yield gauge("colo_fsm_http_requests_holding", "Requests holding tokens of the budget", r.requests_holding)
        yield gauge(
            "colo_fsm_http_tokens_drain_rate",
            "Tokens given back to the budget per second (last 30 s)",
            r.drain_tokens_per_s,
        )
        admitted = CounterMetricFamily("colo_fsm_http_tokens_admitted", "Tokens granted by the budget", labels=["rank"])
        admitted.add_metric([rank], float(r.tokens_admitted))
        yield admitted
        granted = CounterMetricFamily(
            "colo_fsm_http_requests_admitted", "Requests granted tokens by the budget", labels=["rank"]
        )
        granted.add_metric([rank], float(r.requests_admitted))
        yield granted
        stages = GaugeMetricFamily(
            "colo_fsm_http_requests_in_stage",
            "HTTP requests in each stage of the exchange now",
            labels=["rank", "stage"],
        )
        for stage, n in r.stages.items():
            stages.add_metric([rank, stage], float(n))
        yield stages
        yield gauge(
            "colo_fsm_http_admitting", "1 while the server hands requests to the engine", 1.0 if r.admitting else 0.0
        )
        if r.engine is not None:
            engine = GaugeMetricFamily(
                "colo_fsm_engine_requests",
                "The engine's requests by priority and state (queued, running, parked)",
                labels=["rank", "priority", "state"],
            )
            for priority, counts in r.engine.items():
                for state, n in zip(("queued", "running", "parked"), counts):
                    engine.add_metric([rank, priority, state], float(n))
            yield engine
        if r.server_slots is not None:
            yield gauge("colo_fsm_engine_server_slots", "Engine slots HTTP requests may hold at once", r.server_slots)
        if r.engine_steps is not None:
            yield from self._engine_steps(r.engine_steps)
        if r.engine_step_read_errors is not None:
            reads = CounterMetricFamily(
                "colo_fsm_engine_step_profile_read_errors",
                "Scrapes that could not read the engine's step profile (its step series were left out of them)",
                labels=["rank"],
            )
            reads.add_metric([rank], float(r.engine_step_read_errors))
            yield reads
        yield from self._lifecycle(r)

    def _engine_steps(self, t: Mapping[str, Any]) -> Iterator[Metric]:
        """Counters from the engine's step profile (:func:`~colo_fsm.adapters.megatron.step_profile.totals`)."""
        rank = self._rank

        def counter(name: str, doc: str, label: str, rows: Mapping[str, Mapping[str, Any]], key: str) -> Metric:
            fam = CounterMetricFamily(name, doc, labels=["rank", label])
            for value, row in rows.items():
                fam.add_metric([rank, value], float(row[key]))
            return fam

        kinds, graphs = t["kinds"], t["graphs"]
        yield counter("colo_fsm_engine_steps", "Engine steps by kind (decode-only or mixed, graph or eager)", "kind",
                      kinds, "steps")  # fmt: skip
        yield counter("colo_fsm_engine_step_seconds", "Wall seconds inside engine steps, by kind", "kind", kinds,
                      "seconds")  # fmt: skip
        yield counter("colo_fsm_engine_graph_steps", "Decode-only steps by the captured CUDA graph they ran (its "
                      "batch size)", "graph", graphs, "steps")  # fmt: skip
        yield counter("colo_fsm_engine_graph_requests", "Requests decoded by the decode-only steps of each captured "
                      "graph (over steps x graph size: how full they ran)", "graph", graphs, "requests")  # fmt: skip
        errors = CounterMetricFamily(
            "colo_fsm_engine_step_record_errors", "Engine steps the step profile could not record", labels=["rank"]
        )
        errors.add_metric([rank], float(t["record_errors"]))
        yield errors

    def _lifecycle(self, r: ServerReading) -> Iterator[Metric]:
        rank = self._rank
        lc = r.lifecycle
        state = lc.state if lc is not None and lc.state is not None else r.state
        names = list(lc.states) if lc is not None else []
        if state is not None and state not in names:
            names.append(state)
        if names:
            fam = GaugeMetricFamily(
                "colo_fsm_lifecycle_state", "1 for the lifecycle's state now", labels=["rank", "state"]
            )
            for name in names:
                fam.add_metric([rank, name], 1.0 if name == state else 0.0)
            yield fam
        if lc is not None and lc.records:
            secs = CounterMetricFamily(
                "colo_fsm_lifecycle_state_seconds", "Seconds spent in each lifecycle state", labels=["rank", "state"]
            )
            for name in names:
                secs.add_metric([rank, name], float(lc.seconds_in.get(name, 0.0)))
            yield secs
            steps = CounterMetricFamily("colo_fsm_train_steps", "Training steps completed", labels=["rank"])
            steps.add_metric([rank], float(lc.step))
            yield steps
            rate = GaugeMetricFamily(
                "colo_fsm_train_step_rate", "Training steps per second over the last minute", labels=["rank"]
            )
            rate.add_metric([rank], float(lc.step_rate))
            yield rate
        version = lc.weight_version if lc is not None and lc.weight_version is not None else r.weight_version
        if version is not None:
            fam = GaugeMetricFamily("colo_fsm_weight_version", "The weight version generation reads", labels=["rank"])
            fam.add_metric([rank], float(version))
            yield fam


__all__ = ["HANDOFF_BUCKETS", "QUEUE_WAIT_BUCKETS", "ServerMetrics", "ServerReading"]
