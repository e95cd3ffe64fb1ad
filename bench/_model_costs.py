"""What a step costs in ``bench/handoff_model.py``'s virtual time (one job: the prices, not the simulation): an
engine step from a GPU run's graph-decode table, the host's time around it, the time a long context adds, training
and abort's re-prefill per token, each fitted to committed H200 runs and named for where it comes from."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colo_fsm.errors import ConfigError

HOST_MS = 1.06
"""Host time per engine step outside megatron's step: park's, measured at the 8,192 cut (``reasoning-8k``)."""
HOST_LINE = (0.10, 9.7)
"""The host time per engine step as a line in the requests running, ``(ms, us per request)``: the 16 park, drain and
sync runs of the 202M GPT on the direct path before the first ``max_age`` 4 run (22 to 115 requests per engine
step, each within 0.3 ms of it; ``tests/test_handoff_model.py`` fits it again from those files). The model's
default is the fixed :data:`HOST_MS`; ``--host-ms 0.10 --host-us-per-request 9.7`` prices the host by this line."""
TRAIN_US_PER_TOKEN = 12.8
"""Training time per trained token (prompt + output): park's Training time at the 8,192 cut over its tokens."""
REPREFILL_US_PER_TOKEN = 3.6
"""Abort's re-prefill per token: in ``reasoning-8k`` at ``6bd92a8``, abort's eager (prefill) engine steps took 1.47 s
more than park's over the measured window, which re-prefilled what the warm-up's and the first two measured
handoffs ended (407,815 tokens by this model; the run's 4 handoffs re-prefilled 451,383, the model's 452,235)."""
KV_NS_PER_TOKEN = 30.0
"""What a decode step costs for each context token a running request holds above the step table's context: megatron's
graph decode at ``ca6c37b`` (``reasoning-32k-graph-contexts``) took 1.21, 2.31 and 4.45 ms more per step from 4,096
tokens than from 1,715 at batches 16, 32 and 64, 31.7, 30.3 and 29.2 ns per request-token (the 202M GPT's keys and
values are 64 KiB a token: about 2.2 TB/s read). Charging nothing below the table's context is an assumption, not a
finding: from 832 to 1,715 tokens the same run's batches 32 and 64 moved under 5 ns per request-token and batch 16
fell, but batches 128 and 256 rose 17 and 21 ns, and a price that also credited the tokens below would return the
model to the table's figures. The default is 0, the table alone; ``--kv-ns-per-token 30`` prices the long contexts
so. ``fb85515``'s rows (``reasoning-32k-graph-contexts`` on another machine) do not bear the assumption out: from 832
to 1,715 tokens its batches 16-256 rose 24-43 ns per request-token, as from 1,715 to 16,000 (21-28 ns), a step
linear in its context, and so do a third machine's (``b1d9af0``, ``reasoning-graph-contexts``: 26-30 below the mean,
21-30 above); ``--kv-credit-below`` prices the model so (:attr:`Timing.kv_credit_below`)."""


COSTS = {
    "host_ms": "milliseconds",
    "host_us_per_request": "microseconds",
    "train_us_per_token": "microseconds",
    "reprefill_us_per_token": "microseconds",
    "kv_ns_per_token": "nanoseconds",
}
"""The costs a :class:`Timing` takes (fixed, per request running for ``host_us_per_request``, per context token above
the table's for ``kv_ns_per_token``), and their units."""


def cost_refusal(name: str, value: float) -> str | None:
    """What a fixed cost (one of :data:`COSTS`) must be, where ``value`` is not that; None where it is."""
    return None if math.isfinite(value) and value >= 0 else f"a finite, non-negative number of {COSTS[name]}"


def credit_refusal(kv_ns_per_token: float, kv_credit_below: object) -> str | None:
    """What ``kv_credit_below`` must be beside ``kv_ns_per_token``, where it is not that; None where it is: a
    credit needs a price to credit at, never ignored."""
    if kv_credit_below is False or (kv_credit_below is True and kv_ns_per_token):
        return None
    return "True with a kv_ns_per_token above 0 (a price to credit at), or False"


@dataclass
class Timing:
    """What a step costs in the model: an engine step from a table of (batch, ms) at ``kv_from`` tokens of context
    (plus ``kv_ns_per_token`` for each context token a running request holds above it), training per token, abort's
    re-prefill per token."""

    table: list[tuple[int, float]]
    host_ms: float = HOST_MS
    host_us_per_request: float = 0.0  # host time that grows with the requests running (0: the fixed HOST_MS alone)
    train_us_per_token: float = TRAIN_US_PER_TOKEN
    reprefill_us_per_token: float = REPREFILL_US_PER_TOKEN
    kv_ns_per_token: float = 0.0  # a long context's extra read per token above kv_from (0: the table alone)
    kv_from: int = 0  # the context the table was taken at (the workload's mean decode context)
    kv_credit_below: bool = False  # credit each token below kv_from at kv_ns_per_token too (a step linear in context)
    graphs: tuple[int, ...] = ()  # captured decode-only graph sizes: a step runs the smallest holding it (): none
    padded_row: str = "fixed"  # with graphs: "fixed" (a padded row costs the graph's fixed work) or "full"
    pad_row_ms: float | None = None  # "fixed": the ms a padded row saves, one request's attention at the context

    def __post_init__(self) -> None:
        if not self.table or any(b <= 0 or ms <= 0 for b, ms in self.table):
            raise ConfigError("table", self.table, "one or more (batch > 0, ms > 0) rows")
        self.table = sorted(self.table)
        batches = [b for b, _ in self.table]
        if len(set(batches)) != len(batches):
            raise ConfigError("table", self.table, "one row per batch size")
        for name in COSTS:
            if why := cost_refusal(name, getattr(self, name)):
                raise ConfigError(name, getattr(self, name), why)
        if isinstance(self.kv_from, bool) or not isinstance(self.kv_from, int) or self.kv_from < 0:
            raise ConfigError("kv_from", self.kv_from, "a context in tokens, 0 or more")
        if self.kv_ns_per_token and not self.kv_from:
            raise ConfigError("kv_from", self.kv_from, "the table's context in tokens, where kv_ns_per_token is set")
        if why := credit_refusal(self.kv_ns_per_token, self.kv_credit_below):
            raise ConfigError("kv_credit_below", self.kv_credit_below, why)
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in self.graphs) or list(
            self.graphs
        ) != sorted(set(self.graphs)):
            raise ConfigError("graphs", self.graphs, "captured batch sizes: positive integers, ascending, no repeats")
        if self.padded_row not in PADDED_ROWS:
            raise ConfigError("padded_row", self.padded_row, f"one of {PADDED_ROWS}")
        if self.graphs and self.padded_row == "fixed" and self.pad_row_ms is None:
            raise ConfigError("pad_row_ms", None, "the ms a padded row saves, where it costs 'fixed'")
        if self.pad_row_ms is not None and not (math.isfinite(self.pad_row_ms) and self.pad_row_ms >= 0):
            raise ConfigError("pad_row_ms", self.pad_row_ms, "a finite, non-negative number of milliseconds")

    def step_s(self, batch: float) -> float:
        """One engine step at ``batch`` running requests: the table, linear between rows and along the nearest
        two rows past its ends, never below half its smallest row (with ``graphs``, priced on the captured graph
        that holds the step: :meth:`padded_ms`); plus the host cost (``host_ms``, and ``host_us_per_request`` for
        each request running)."""
        ms = self.padded_ms(batch) if self.graphs else self.table_ms(batch)
        return (ms + self._host_ms(batch)) / 1000.0

    def table_ms(self, batch: float) -> float:
        """The table's step at ``batch``: linear between rows and along the nearest two past its ends, never below
        half its smallest row."""
        return max(_linear(self.table, batch), self._floor_ms())

    def padded_ms(self, batch: float) -> float:
        """The step at ``batch`` requests on the smallest captured graph that holds them (megatron pads a decode
        step to it). ``padded_row="full"``: the table's step at the graph's size (a padded row as dear as a real
        one, the upper bound); ``"fixed"``: that less what the padded rows do not do, one request's attention at the
        table's context each (``pad_row_ms``), assuming a padded row costs the graph's fixed work only. Never below
        the table's step at ``batch`` (padding free). A step larger than every graph is priced at its own batch.
        The long-context price (:meth:`kv_s`) charges the real requests only, under either."""
        graph = next((g for g in self.graphs if g >= batch), None)
        if graph is None or graph == batch:
            return self.table_ms(batch)
        at_graph = self.table_ms(graph)
        if self.padded_row == "full":
            return max(at_graph, self.table_ms(batch))
        saved = (graph - batch) * (self.pad_row_ms or 0.0)
        return min(at_graph, max(at_graph - saved, self.table_ms(batch)))

    def _floor_ms(self) -> float:
        """The least a step takes in the table: half its smallest row."""
        return self.table[0][1] * 0.5

    def _host_ms(self, batch: float) -> float:
        """The host's time per step at ``batch`` running requests: ``host_ms`` and ``host_us_per_request`` each."""
        return self.host_ms + self.host_us_per_request * batch / 1000.0

    def kv_s(self, contexts: list[int], steps: int) -> float:
        """What ``steps`` decode steps add for long contexts: each request starts at its context in ``contexts`` and
        gains a token a step, and every step charges ``kv_ns_per_token`` for each token it holds above
        ``kv_from`` and, with ``kv_credit_below``, credits as much for each token it holds below (the tokens from
        ``a`` to ``b`` on one side sum, as an arithmetic series, to their count times their mean distance)."""
        if not self.kv_ns_per_token or steps <= 0:
            return 0.0
        over = 0.0
        for c in contexts:
            a, b = max(c, self.kv_from), c + steps - 1  # the contexts at or above kv_from these steps read
            if b >= a:
                over += (b - a + 1) * ((a - self.kv_from) + (b - self.kv_from)) / 2
            a, b = c, min(c + steps - 1, self.kv_from - 1)  # those below it
            if self.kv_credit_below and b >= a:
                over -= (b - a + 1) * ((self.kv_from - a) + (self.kv_from - b)) / 2
        return over * self.kv_ns_per_token / 1e9

    def decode_s(self, batch: int, steps: int, contexts: Callable[[], list[int]]) -> float:
        """``steps`` decode steps of ``batch`` running requests: the table's step (:meth:`step_s`) plus, where a
        long context is priced, the read of the ``contexts()`` the requests hold (:meth:`kv_s`; asked for only
        then), never below the floor :meth:`step_s` keeps (half the table's smallest row, plus the host's time),
        however much ``kv_credit_below`` credits."""
        table = steps * self.step_s(batch)
        if not self.kv_ns_per_token:
            return table
        floor = steps * (self._floor_ms() + self._host_ms(batch)) / 1000.0
        return max(table + self.kv_s(contexts(), steps), floor)


def _linear(rows: list[tuple[int, float]], x: float) -> float:
    """``rows`` (ascending by their first item) at ``x``: linear between rows and along the nearest two past its
    ends (one row: that row's value)."""
    if len(rows) == 1:
        return rows[0][1]
    xs = [b for b, _ in rows]
    k = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    (x0, y0), (x1, y1) = rows[k - 1], rows[k]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Baseline:
    """A GPU run's graph decode: ms per step by batch from one decode context, and, where it ran, from a second."""

    context: int
    rows: tuple[tuple[int, float], ...]
    context2: int | None = None
    rows2: tuple[tuple[int, float], ...] = ()

    def table_at(self, context: int) -> list[tuple[int, float]]:
        """The rows at ``context`` tokens: linear in the context through the two contexts, per batch both ran
        (a decode step's attention reads the whole context); the one context's rows where only one ran."""
        if self.context2 is None or not self.rows2 or self.context2 == self.context:
            return list(self.rows)
        other = dict(self.rows2)
        f = (context - self.context) / (self.context2 - self.context)
        return [(b, ms + (other[b] - ms) * f) for b, ms in self.rows if b in other]

    def attention_at(self, context: int) -> float | None:
        """The ms one request's attention adds to a step at ``context`` tokens: the steps' rise per request-token
        between the two contexts, one slope fitted through every batch both ran (least squares through the
        origin, so the large batches, whose rise is mostly attention, weigh most; never below 0), times
        ``context``. What a row padded onto a captured graph does not cost (:meth:`Timing.padded_ms`); None with
        one context."""
        if self.context2 is None or not self.rows2 or self.context2 == self.context:
            return None
        other = dict(self.rows2)
        pairs = [(b * (self.context2 - self.context), other[b] - ms) for b, ms in self.rows if b in other]
        if not pairs:
            return None
        slope = sum(x * y for x, y in pairs) / sum(x * x for x, _ in pairs)  # ms per request-token
        return max(0.0, slope) * context


PADDED_ROWS = ("fixed", "full")
"""What a row padded onto a captured graph costs in the model: ``fixed`` the graph's fixed work only (its step less
the row's attention, read off the table's two contexts), ``full`` as much as a real request (the upper bound)."""

GRAPH_SIZINGS = ("none", "default", "linear")
"""How the model prices a decode step against megatron's captured graphs: ``none`` at its own batch (padding free,
the model's default), ``default`` on megatron-core 0.19.2's default sizing (the powers of two), ``linear`` on its
linear sizing."""


def graph_plan(sizing: str, max_requests: int, num_graphs: int = 16) -> list[Any]:
    """megatron-core's own plan of captured graphs (its ``InferenceBatchDimensions``, decode-only and with a
    prefill) for ``max_requests`` requests and ``num_graphs`` graphs at ``sizing`` ("default" or "linear"), one
    rank, at the token limits megatron derives for the bench's engine (512 graph tokens, 16,384 tokens)."""
    from megatron.core.inference.batch_dimensions_utils import CUDAGraphBatchDimensionBuilder
    from megatron.core.inference.config import CudaGraphSizingDistribution

    dims, _ = CUDAGraphBatchDimensionBuilder.generate_cuda_graph_batch_dimensions_list(
        tp_size=1,
        num_cuda_graphs=num_graphs,
        cuda_graph_max_tokens=512,
        cuda_graph_mixed_prefill_request_count=16,
        max_requests=max_requests,
        max_tokens=16384,
        max_sequence_length=8256,
        use_cuda_graphs_for_non_decode_steps=True,
        sizing_distribution=None if sizing == "default" else CudaGraphSizingDistribution.LINEAR,
    )
    return list(dims)


def decode_graph_sizes(sizing: str, max_requests: int, num_graphs: int = 16) -> tuple[int, ...]:
    """The decode-only batch sizes of :func:`graph_plan` at ``sizing`` (one of :data:`GRAPH_SIZINGS`; ``none``: no
    graph, ``()``)."""
    if sizing not in GRAPH_SIZINGS:
        raise ConfigError("graphs", sizing, f"one of {GRAPH_SIZINGS}")
    if sizing == "none":
        return ()
    plan = graph_plan(sizing, max_requests, num_graphs)
    return tuple(sorted({d.decode_req_count for d in plan if not d.prefill_req_count}))
