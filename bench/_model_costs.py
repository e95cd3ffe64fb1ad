"""What a step costs in ``bench/handoff_model.py``'s virtual time (one job: the prices, not the simulation): an
engine step from a GPU run's graph-decode table, the host's time around it, the time a long context adds, training
and abort's re-prefill per token, each fitted to committed H200 runs and named for where it comes from."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

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

    def step_s(self, batch: float) -> float:
        """One engine step at ``batch`` running requests: the table, linear between rows and along the nearest
        two rows past its ends, never below half its smallest row; plus the host cost (``host_ms``, and
        ``host_us_per_request`` for each request running)."""
        xs = [b for b, _ in self.table]
        ys = [ms for _, ms in self.table]
        if len(xs) == 1:
            ms = ys[0]
        else:
            k = min(max(bisect.bisect_left(xs, batch), 1), len(xs) - 1)
            (x0, y0), (x1, y1) = self.table[k - 1], self.table[k]
            ms = y0 + (y1 - y0) * (batch - x0) / (x1 - x0)
        return (max(ms, self._floor_ms()) + self._host_ms(batch)) / 1000.0

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
