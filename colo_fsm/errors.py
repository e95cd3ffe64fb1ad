"""Typed errors of colo-fsm.

Every error names what went wrong in terms a user can act on: the field and value for bad input, the state,
trigger, rank and weight version for lifecycle failures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ColoFsmError(Exception):
    """Base class of every error colo-fsm raises on purpose."""


class ConfigError(ColoFsmError, ValueError):
    """A configuration field or argument has a value colo-fsm cannot use.

    The message names the field, the value it got and what was expected.
    """

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}={value!r}: expected {expected}")


class LifecycleError(ColoFsmError):
    """An error tied to a point of the lifecycle: carries state, rank and weight version."""

    def __init__(
        self,
        message: str,
        *,
        state: str | None = None,
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.state = state
        self.rank = rank
        self.weight_version = weight_version
        self.message = message  # without the [state=..., rank=..., weight_version=...] suffix
        where = ", ".join(
            f"{k}={v}"
            for k, v in (("state", state), ("rank", rank), ("weight_version", weight_version))
            if v is not None
        )
        super().__init__(f"{message} [{where}]" if where else message)


class InvalidTransition(LifecycleError):
    """A trigger was fired from a state that has no transition for it."""

    def __init__(
        self,
        trigger: str,
        state: str,
        *,
        allowed: tuple[str, ...] = (),
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.trigger = trigger
        self.allowed = allowed
        hint = f"; triggers valid in {state}: {', '.join(allowed)}" if allowed else ""
        super().__init__(
            f"trigger {trigger!r} is not valid in state {state}{hint}",
            state=state,
            rank=rank,
            weight_version=weight_version,
        )


class GuardRejected(LifecycleError):
    """A trigger is valid in the current state, but no transition's guards allowed it."""

    def __init__(
        self,
        trigger: str,
        state: str,
        *,
        failed: tuple[str, ...],
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.trigger = trigger
        self.failed = failed
        super().__init__(
            f"trigger {trigger!r} from {state} refused: guard(s) not satisfied: {', '.join(failed)}",
            state=state,
            rank=rank,
            weight_version=weight_version,
        )


class ActionFailed(LifecycleError):
    """An action raised while the machine ran a transition; the machine is now Failed.

    ``__cause__`` holds the original exception; ``action`` and ``trigger`` say where it happened.
    """

    def __init__(
        self,
        action: str,
        trigger: str,
        cause: BaseException,
        *,
        state: str,
        rank: int | None,
        weight_version: int | None,
    ) -> None:
        self.action = action
        self.trigger = trigger
        self.cause = cause
        detail = cause.message if isinstance(cause, LifecycleError) else str(cause)
        super().__init__(
            f"action {action!r} of trigger {trigger!r} failed: {type(cause).__name__}: {detail}",
            state=state,
            rank=rank,
            weight_version=weight_version,
        )


class BarrierTimeout(LifecycleError, TimeoutError):
    """Not every rank reached a handoff barrier within its timeout."""

    def __init__(
        self,
        timeout_s: float,
        *,
        state: str | None,
        rank: int | None,
        weight_version: int | None = None,
        detail: str = "",
    ) -> None:
        self.timeout_s = timeout_s
        extra = f": {detail}" if detail else ""
        super().__init__(
            f"barrier timed out after {timeout_s:g}s waiting for the other ranks{extra}",
            state=state,
            rank=rank,
            weight_version=weight_version,
        )


class DrainError(LifecycleError):
    """Draining the rank's own device failed or named an impossible device."""


class ModelModeError(LifecycleError):
    """A training step would run on a model still in an inference mode; names each field and its value.

    ``fields`` is a list of ``(field, current value, value training needs)``.
    """

    def __init__(
        self,
        fields: list[tuple[str, Any, Any]],
        *,
        state: str | None = None,
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.fields = list(fields)
        what = "; ".join(f"{f}={cur!r} (training needs {want!r})" for f, cur, want in self.fields)
        super().__init__(
            f"refusing to train on a model still in inference mode: {what} "
            "(the engine's suspend must restore every rank to the training mode)",
            state=state,
            rank=rank,
            weight_version=weight_version,
        )


class HandoffDivergence(LifecycleError):
    """The ranks met at a handoff barrier in different states; raised on every rank within that barrier.

    ``fields`` maps each differing fingerprint field to ``{value: [ranks holding it]}``; ``mode`` (when the
    mode digests differ and the ranks exchanged their mode records) maps each differing mode field likewise;
    ``notes`` say what a field's rule expected where it is not plain equality (e.g. one sampling stream per
    data-parallel rank).
    """

    def __init__(
        self,
        fields: dict[str, dict[Any, list[int]]],
        *,
        mode: dict[str, dict[Any, list[int]]] | None = None,
        notes: list[str] | None = None,
        state: str | None = None,
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.fields = fields
        self.mode = mode or {}
        self.notes = list(notes or [])

        def fmt(table: dict[str, dict[Any, list[int]]]) -> str:
            return "; ".join(
                f"{name}: " + ", ".join(f"{value!r} on ranks {ranks}" for value, ranks in by_value.items())
                for name, by_value in table.items()
            )

        detail = fmt(fields)
        if self.mode:
            detail += f"; model mode: {fmt(self.mode)}"
        if self.notes:
            detail += "; " + "; ".join(self.notes)
        super().__init__(
            f"ranks diverged at the handoff barrier: {detail}", state=state, rank=rank, weight_version=weight_version
        )


class MemoryBudgetExceeded(ColoFsmError):
    """The KV buffer plus the training peak plus the margin do not fit the device; lists the numbers and options."""

    def __init__(self, breakdown: dict[str, float], capacity_gib: float, options: list[str]) -> None:
        self.breakdown = dict(breakdown)
        self.capacity_gib = capacity_gib
        self.options = list(options)
        total = breakdown.get("total_gib", 0.0)
        parts = ", ".join(f"{k}={v:.2f}" for k, v in breakdown.items() if k != "total_gib")
        super().__init__(
            f"memory budget: {total:.2f} GiB needed > {capacity_gib:.2f} GiB on the device ({parts}); "
            f"options: {'; '.join(options)}"
        )


class ParallelismMismatch(ColoFsmError, ValueError):
    """A generation-side parallelism setting differs from the training model it must inherit."""

    def __init__(self, field: str, training: int, generation: int) -> None:
        self.field = field
        self.training = training
        self.generation = generation
        super().__init__(
            f"{field}: generation asks for {generation} but the colocated engine inherits the training "
            f"model's {field}={training}; set the generation {field} to {training} or leave it unset"
        )


class EngineRebuild(LifecycleError):
    """The colocated engine was asked to come up a second time; it is built exactly once."""


class EngineStopped(LifecycleError):
    """A request or control call reached the engine after it was shut down."""


class EngineLoopDied(EngineStopped):
    """The engine's own loop (a background task or thread) ended; every request still waiting on it fails with this.

    ``detail`` says how it ended (the exception, or "exited"). Nothing will answer those requests any more:
    without this error they would wait forever.
    """

    def __init__(self, detail: str, *, pending: int = 0, state: str | None = None, rank: int | None = None) -> None:
        self.detail = detail
        self.pending = pending
        super().__init__(
            f"the engine loop ended ({detail}); {pending} pending request(s) failed instead of waiting forever",
            state=state,
            rank=rank,
        )


class EngineStateMismatch(LifecycleError):
    """The engine reports a condition other than the one the lifecycle state declares (at ``start``, or before or
    after an action: e.g. a training step while the engine runs, a suspend that left it awake).

    Names the lifecycle state and the engine condition it expects, and the engine's report (its native state,
    e.g. megatron-core's ``RUNNING``, or the ``condition`` it reports). The one error for this guarantee
    (:mod:`colo_fsm.guards.engine_state`); ``ConditionMismatch`` is another name for it.
    """

    def __init__(
        self,
        *,
        lifecycle_state: str,
        expected: str,
        engine: str,
        engine_state: str,
        engine_condition: str,
        accepted: tuple[str, ...] = (),
        when: str = "",
        hint: str = "",
        rank: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        self.lifecycle_state = lifecycle_state
        self.expected = expected
        self.engine = engine
        self.engine_state = engine_state
        self.engine_condition = engine_condition
        self.accepted = tuple(accepted)
        self.when = when
        self.hint = hint
        want = f" ({engine} state {' or '.join(self.accepted)})" if self.accepted else ""
        at = f" {when}" if when else ""
        got = engine_state if engine_state == engine_condition else f"{engine_state} ({engine_condition})"
        fix = f": {hint}" if hint else ""
        super().__init__(
            f"engine state mismatch{at}: lifecycle state {lifecycle_state} expects the engine {expected}{want}, "
            f"but {engine} reports {got}{fix}",
            state=lifecycle_state,
            rank=rank,
            weight_version=weight_version,
        )


ConditionMismatch = EngineStateMismatch
"""Another name for :class:`EngineStateMismatch` (kept for code written against the first engine-up release)."""


class RequestTooLarge(ConfigError):
    """A generation request asks for more than the engine can hold; names the value and the limit."""

    def __init__(self, field: str, value: int, limit: int, detail: str = "") -> None:
        self.limit = limit
        super().__init__(field, value, f"at most {limit}" + (f" ({detail})" if detail else ""))


class UnsupportedEngine(ColoFsmError):
    """The engine cannot run colocated asynchronous training (e.g. it must refit weights across worlds)."""


class ServerUnavailable(ColoFsmError):
    """The engine stayed suspended longer than a request may wait."""

    def __init__(self, waited_s: float, state: str) -> None:
        self.waited_s = waited_s
        self.state = state
        super().__init__(f"engine suspended ({state}) for longer than {waited_s:g}s; retry later")


class WaitTimeout(ColoFsmError, TimeoutError):
    """Something colo-fsm waits for (fresh trajectories, a pause, in-flight requests) did not happen in time."""

    def __init__(self, what: str, timeout_s: float, detail: str = "") -> None:
        self.what = what
        self.timeout_s = timeout_s
        extra = f": {detail}" if detail else ""
        super().__init__(f"timed out after {timeout_s:g}s waiting for {what}{extra}")


class RolloutFailed(ColoFsmError):
    """The collector's rollout function kept failing; collection stopped. ``__cause__`` is the last error."""

    def __init__(self, failures: int, cause: BaseException) -> None:
        self.failures = failures
        self.cause = cause
        super().__init__(f"rollout failed {failures} time(s) in a row; last: {type(cause).__name__}: {cause}")


class RolloutDeferred(ColoFsmError):
    """Raised by a rollout function to say "I was not started; try me again later" (not a failure).

    A rollout that finds the collector paused (:meth:`colo_fsm.collector.AsyncCollector.should_defer`) before
    it starts its engine work raises this instead of generating. The collector gives the buffer place back,
    puts the prompt back at the front of its queue and counts it in ``CollectorStats.deferred``; a pause thus
    waits only for rollouts that really are generating, not for those queued behind them.
    """

    def __init__(self, reason: str = "the collector is paused") -> None:
        self.reason = reason
        super().__init__(f"rollout deferred: {reason}")


class UsageError(ColoFsmError):
    """A command-line mistake; printed as one line, exit code 2."""


class BadRequest(ColoFsmError):
    """A request the server refuses with a 400 (or the subclass's ``status``) naming the field."""

    status = 400

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(f"{param}: {message}")


class PayloadTooLarge(BadRequest):
    """A request body over the server's ``max_body_bytes`` (HTTP 413), refused before it is read whole."""

    status = 413

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__("body", f"{size} bytes or more exceeds the body limit {limit} bytes (max_body_bytes)")


class UnsupportedMediaType(BadRequest):
    """A request body sent without a JSON content type (HTTP 415)."""

    status = 415

    def __init__(self, content_type: str | None) -> None:
        self.content_type = content_type
        got = repr(content_type[:60]) if content_type else "none"
        super().__init__("content-type", f"expected application/json, got {got}")


class UploadTimeout(BadRequest, TimeoutError):
    """A request body that did not arrive whole within the server's ``upload_timeout_s`` (HTTP 408, the
    connection closed): a stalled or too-slow upload."""

    status = 408

    def __init__(self, received: int, timeout_s: float) -> None:
        self.received = received
        self.timeout_s = timeout_s
        super().__init__(
            "body", f"not received whole within upload_timeout_s={timeout_s:g} s ({received} bytes arrived)"
        )


class ServerBusy(ColoFsmError):
    """The server's bound on HTTP work stayed full for the whole wait, or too many requests wait already
    (HTTP 429 with Retry-After); names the bound and the numbers. ``retry_after_s`` is the server's estimate
    of when the request would fit, from the observed drain rate of its token budget."""

    def __init__(self, bound: str, message: str, waited_s: float = 0.0, retry_after_s: int | None = None) -> None:
        self.bound = bound
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s
        super().__init__(f"{message} ({bound}); retry later")


GRAPHVIZ_INSTALL_HINT = (
    "install Graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or "
    "`conda install -c conda-forge graphviz`; or draw an SVG without it (`colo-fsm diagram --format svg -o x.svg`, "
    "colo_fsm.diagram.to_svg), or write the DOT source (.dot) or Mermaid (.mmd) instead"
)
"""How to get Graphviz's ``dot``, for error messages."""


class GraphvizNotFound(ColoFsmError, RuntimeError):
    """Rendering a picture needs Graphviz's ``dot`` binary, and it is not installed."""

    def __init__(self, binary: str = "dot") -> None:
        self.binary = binary
        super().__init__(
            f"rendering a picture needs Graphviz's {binary!r} binary, not found on PATH; {GRAPHVIZ_INSTALL_HINT}"
        )


class RenderError(ColoFsmError, RuntimeError):
    """Graphviz ran but could not render the diagram."""


class TraceFileError(ConfigError):
    """A trace file is missing, unreadable or holds a line that is not a trace record; names file and line."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__("trace", where, problem)
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.args = (f"{where}: {problem}",)

    def __str__(self) -> str:
        return str(self.args[0])


class SpecError(ConfigError):
    """The lifecycle spec breaks a structural rule; the message names the transition and the rule."""

    def __init__(self, where: str, rule: str) -> None:
        super().__init__(where, "(spec)", rule)


class SpecCheckFailed(SpecError):
    """The exhaustive checker found a violation in a spec the static rules accept (the testing kit refuses such a
    spec before running any program); the message names the spec, the scenario and the violation."""

    def __init__(self, spec: str, violation: str, detail: str = "") -> None:
        ColoFsmError.__init__(self, f"spec {spec}: {violation}" + (f"\n{detail}" if detail else ""))
        self.field, self.value, self.expected = f"spec {spec}", "(spec)", violation
        self.spec = spec
        self.violation = violation


class LifecycleViolation(ColoFsmError, AssertionError):
    """The testing kit found a program of your adapters that breaks a lifecycle rule. The message is the bug
    report: the rule, your adapter's class and method and what it did, the calls around it, and the shrunk
    program that shows it; ``original`` is the kit's own failure (its traceback, for debugging the kit)."""

    def __init__(self, report: str, original: BaseException | None = None) -> None:
        super().__init__(report)
        self.original = original


class ServerStopping(ColoFsmError):
    """The engine was shut down under a request (HTTP 503 without Retry-After)."""


class ClientGone(ColoFsmError):
    """The client disconnected (closed, reset or timed out on its side); its request was cancelled in the engine.

    ``stage`` says where the exchange was: ``"upload"`` (its body was being read), ``"queue"`` (waiting for the
    token budget or for a suspended engine), ``"generation"`` (a non-streamed request in the engine) or
    ``"stream"`` (a streamed answer being sent). A client outcome, never a server error.
    """

    def __init__(self, stage: str = "generation", detail: str = "client disconnected") -> None:
        self.stage = stage
        super().__init__(f"{detail} during {stage}")


class RanksDidNotStop(ColoFsmError):
    """A multi-rank run's ranks did not stop within the bound after a signal (or a second signal came): they
    were killed, so the run's last step may not be saved."""


class ServingTopologyError(ConfigError):
    """Serving cannot route requests with this model-parallel layout; refused at bring-up, on every rank.

    The message names the rank, the field, its value and what would route (one server per tensor-parallel
    group, on its first rank, fed to the group's other ranks through the lockstep).
    """


__all__ = [
    "GRAPHVIZ_INSTALL_HINT",
    "ActionFailed",
    "BadRequest",
    "BarrierTimeout",
    "ClientGone",
    "ColoFsmError",
    "ConditionMismatch",
    "ConfigError",
    "DrainError",
    "EngineLoopDied",
    "EngineRebuild",
    "EngineStateMismatch",
    "EngineStopped",
    "GraphvizNotFound",
    "GuardRejected",
    "HandoffDivergence",
    "InvalidTransition",
    "LifecycleError",
    "LifecycleViolation",
    "MemoryBudgetExceeded",
    "ModelModeError",
    "ParallelismMismatch",
    "PayloadTooLarge",
    "RanksDidNotStop",
    "RenderError",
    "RequestTooLarge",
    "RolloutDeferred",
    "RolloutFailed",
    "ServerBusy",
    "ServerStopping",
    "ServerUnavailable",
    "ServingTopologyError",
    "SpecCheckFailed",
    "SpecError",
    "TraceFileError",
    "UnsupportedEngine",
    "UnsupportedMediaType",
    "UploadTimeout",
    "UsageError",
    "WaitTimeout",
]
