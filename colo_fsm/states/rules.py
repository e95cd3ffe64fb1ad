"""The lifecycle rules every part of colo-fsm respects, as data.

Each :class:`LifecycleRule` is one non-negotiable statement about a colocated engine and trainer. Mutants
name the rule they break, the hypothesis machine's invariants and the exhaustive checker's violations name
the rule they check, and ``docs/lifecycle.md`` lists them (generated from :data:`RULES`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


class LifecycleRule(StrEnum):
    """A lifecycle rule. The value is a short, stable key; :attr:`statement` is the rule in one line."""

    BUILD_ONCE = "build-once"
    ONE_COMMUNICATOR = "one-communicator"
    CHECKPOINT_SUSPENDS = "checkpoint-suspends"
    DECIDE_ONCE = "decide-once"
    WEIGHT_VERSIONS = "weight-versions"
    BOUNDED_INFLIGHT = "bounded-inflight"
    PARALLELISM_MATCHES = "parallelism-matches"
    WALL_CLOCK_THROUGHPUT = "wall-clock-throughput"
    DUAL_MODE_OPT_IN = "dual-mode-opt-in"
    PARK_NOT_DRAIN = "park-not-drain"
    UNIFORM_MODEL_MODE = "uniform-model-mode"
    MEMORY_BUDGET = "memory-budget"
    STEP_ORDER_IS_DATA = "step-order-is-data"

    @property
    def number(self) -> int:
        """The rule's position (1-based) in :data:`RULES`, for tables."""
        return list(LifecycleRule).index(self) + 1

    @property
    def heading(self) -> str:
        """A few words naming the rule."""
        return _HEADINGS[self]

    @property
    def statement(self) -> str:
        """The rule in one line."""
        return _STATEMENTS[self]

    def tag(self, text: str) -> str:
        """``text`` marked as about this rule (``"[build-once] text"``); :func:`rule_in` reads the mark back."""
        return f"[{self.value}] {text}"

    @classmethod
    def of(cls, ref: LifecycleRule | str | int) -> LifecycleRule:
        """The rule ``ref`` names: a member, its value (``"build-once"``), its name (``"BUILD_ONCE"``), its
        :attr:`number`, or a text starting with one of these and a colon (``"2: drain before the barrier"``)."""
        if isinstance(ref, LifecycleRule):
            return ref
        if isinstance(ref, int) and not isinstance(ref, bool):
            if 1 <= ref <= len(RULES):
                return RULES[ref - 1]
        elif isinstance(ref, str):
            key = ref.split(":", 1)[0].strip()
            if key.isdigit():
                return cls.of(int(key))
            for rule in cls:
                if key in (rule.value, rule.name):
                    return rule
        from colo_fsm.errors import ConfigError

        raise ConfigError("rule", ref, f"a LifecycleRule, its value, its name or its number 1..{len(RULES)}")


_HEADINGS: dict[LifecycleRule, str] = {
    LifecycleRule.BUILD_ONCE: "Build once",
    LifecycleRule.ONE_COMMUNICATOR: "One communicator, never interleaved",
    LifecycleRule.CHECKPOINT_SUSPENDS: "Checkpoints suspend everything",
    LifecycleRule.DECIDE_ONCE: "Decide once (latch)",
    LifecycleRule.WEIGHT_VERSIONS: "Weight versions",
    LifecycleRule.BOUNDED_INFLIGHT: "Bounded in-flight work",
    LifecycleRule.PARALLELISM_MATCHES: "Parallelism must match",
    LifecycleRule.WALL_CLOCK_THROUGHPUT: "Throughput against wall-clock",
    LifecycleRule.DUAL_MODE_OPT_IN: "Dual-mode model is opt-in",
    LifecycleRule.PARK_NOT_DRAIN: "Park, don't drain",
    LifecycleRule.UNIFORM_MODEL_MODE: "Uniform model mode at every handoff",
    LifecycleRule.MEMORY_BUDGET: "Memory budget before build",
    LifecycleRule.STEP_ORDER_IS_DATA: "Step orders are variants of one spec",
}

_STATEMENTS: dict[LifecycleRule, str] = {
    LifecycleRule.BUILD_ONCE: (
        "The engine (and its OpenAI server) comes up exactly once, before collection starts, publishes "
        "dp_openai_server_base_urls, and is torn down only at Stopped or Failed, never at a validation boundary."
    ),
    LifecycleRule.ONE_COMMUNICATOR: (
        "Decode and training collectives are never in flight together on any rank: each rank drains its own "
        "device (the one LOCAL_RANK names), all ranks meet at a barrier, and only then is the next phase signalled."
    ),
    LifecycleRule.CHECKPOINT_SUSPENDS: (
        "Engine and collector stay suspended for the whole checkpoint save, until every checkpoint collective "
        "(an async save's finalize included) has completed; the last step of a run never wakes the engine."
    ),
    LifecycleRule.DECIDE_ONCE: (
        "Whether a step saves, validates, is the last or stops early is decided once and the latched answer "
        "is reused at every site; a time-based rule fires once."
    ),
    LifecycleRule.WEIGHT_VERSIONS: (
        "Each training step bumps the weight version exactly once; trajectories carry the versions that "
        "generated them, and one older than max_trajectory_age_steps (counted from its oldest version) is "
        "counted and not trained on."
    ),
    LifecycleRule.BOUNDED_INFLIGHT: (
        "In-flight prompt groups are capped by num_prompts_per_step * max_trajectory_age_steps and by the "
        "capacity of the actor serving the calls, with headroom so control calls never queue behind rollouts."
    ),
    LifecycleRule.PARALLELISM_MATCHES: (
        "A colocated engine inherits the training model's parallelism: a TP, PP, EP or ETP mismatch raises "
        "naming both values; a context-parallel mismatch warns."
    ),
    LifecycleRule.WALL_CLOCK_THROUGHPUT: (
        "Consumed samples are logged against elapsed wall-clock time, not against the step number."
    ),
    LifecycleRule.DUAL_MODE_OPT_IN: (
        "Training an inference_optimized (dual-mode) model needs allow_inference_optimized_training, and the "
        "exporter must know the inference linear types."
    ),
    LifecycleRule.PARK_NOT_DRAIN: (
        "A handoff stops decode kernels at a step boundary, not requests: in-flight requests stay parked in "
        "the engine and continue after the step with the new weights; no handoff waits for a rollout to finish "
        "(draining stays an option), and a parked request does no decode work until the resume."
    ),
    LifecycleRule.UNIFORM_MODEL_MODE: (
        "Every inference-only mutation of the shared model is undone identically on every rank before any "
        "training forward and re-applied only on resume; the handoff barrier compares a fingerprint of each "
        "rank's mode state and names any divergence."
    ),
    LifecycleRule.MEMORY_BUDGET: (
        "Before the engine is built, KV buffer + training peak + margin is checked against device memory; an "
        "over-budget configuration is refused with the numbers and the options."
    ),
    LifecycleRule.STEP_ORDER_IS_DATA: (
        "Real loops order a step differently (validate before save, validation at start and end, early stop, "
        "async save with a finalize); each order is a variant of one declared spec, and every tool checks a "
        "user's variant from the spec itself."
    ),
}

RULES: tuple[LifecycleRule, ...] = tuple(LifecycleRule)
"""Every lifecycle rule, in order."""


def checks(rule: LifecycleRule) -> Callable[[_F], _F]:
    """Mark a check (an invariant, a property) with the rule it checks: the function gets ``lifecycle_rule``,
    and an ``AssertionError`` it raises is re-raised with the rule's value in front of the message."""

    def mark(fn: _F) -> _F:
        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except AssertionError as exc:
                raise AssertionError(rule.tag(str(exc))) from exc

        checked.lifecycle_rule = rule  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return mark


def rule_of(check: Callable[..., Any]) -> LifecycleRule | None:
    """The rule :func:`checks` marked ``check`` with, or None."""
    rule = getattr(check, "lifecycle_rule", None)
    return rule if isinstance(rule, LifecycleRule) else None


def rule_in(text: str | None) -> LifecycleRule | None:
    """The first rule a message is marked with (:meth:`LifecycleRule.tag`), or None."""
    for m in _TAG.finditer(text or ""):
        if m.group(1) in _BY_VALUE:
            return _BY_VALUE[m.group(1)]
    return None


_TAG = re.compile(r"\[([a-z-]+)\]")
_BY_VALUE = {r.value: r for r in RULES}


def rules_table() -> str:
    """The rules as a Markdown table (number, key, heading, statement): the generated block of docs/lifecycle.md."""
    rows = ["| # | rule | heading | statement |", "|---|---|---|---|"]
    rows += [f"| {r.number} | `{r.name}` | {r.heading} | {r.statement} |" for r in RULES]
    return "\n".join(rows) + "\n"


__all__ = ["RULES", "LifecycleRule", "checks", "rule_in", "rule_of", "rules_table"]
