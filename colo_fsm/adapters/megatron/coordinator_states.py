"""How megatron-core's coordinator-mode ``EngineState`` maps onto the lifecycle, and per-token weight versions.

megatron-core 0.19.2 runs its own engine state machine in coordinator mode
(``megatron.core.inference.engines.dynamic_engine.EngineState``). Sleep is PAUSE -> PAUSED -> SUSPEND ->
SUSPENDED, wake is RESUME -> (RESUMED: the engine is PAUSED again, with the RESUMED event set) -> UNPAUSE ->
RUNNING; each arrow is a control signal sent through the coordinator, and each waits for expert-parallel
consensus and a world-wide barrier inside megatron. :data:`ENGINE_STATE_CONDITIONS` says which
:class:`~colo_fsm.states.spec.EngineCondition` each native state is (None: in between, never a state the
lifecycle rests the engine in); :func:`state_table` derives, from a lifecycle spec, which native states every
lifecycle state accepts (the table the docs show).

megatron-core stamps every request with ``policy_epoch``: a list of ``(token index, epoch)`` boundaries, set
through the ``SET_GENERATION_EPOCH`` control signal. A boundary ``(i, e)`` is appended when the signal arrives
and ``i`` is the index of the request's last token then (prompt and generated tokens counted together), so the
token generated at position ``p`` came from the forward at ``p - 1`` and carries the epoch of the last boundary
at or before ``p - 1`` (:func:`token_versions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from colo_fsm.errors import LifecycleError
from colo_fsm.states.spec import LIFECYCLE, EngineCondition, LifecycleSpec, State

ENGINE_STATE_CONDITIONS: dict[str, EngineCondition | None] = {
    "RUNNING": EngineCondition.AWAKE,
    "PAUSING": None,
    "PAUSED": None,
    "UNPAUSING": None,
    "SUSPENDING": None,
    "SUSPENDED": EngineCondition.SUSPENDED,
    "RESUMING": None,
    "RESUMED": None,
    "STOPPING": None,
    "STOPPED": EngineCondition.TORN_DOWN,
}
"""megatron-core ``EngineState`` name -> the lifecycle's engine condition (None: between two conditions)."""

SLEEP = (("pause", "PAUSED"), ("suspend", "SUSPENDED"))
"""The engine's own steps of a suspend: each call and the stable state it waits for (in order)."""

WAKE = (("resume", "RESUMED"), ("unpause", "RUNNING"))
"""The engine's own steps of a resume (``RESUMED`` is an event: the engine state is PAUSED again)."""


def condition_of(native: str) -> EngineCondition | None:
    """The lifecycle condition of a megatron-core ``EngineState`` name (None: in between, or unknown)."""
    return ENGINE_STATE_CONDITIONS.get(native)


def natives_by_condition() -> dict[EngineCondition, tuple[str, ...]]:
    """Every lifecycle condition and the native states that are it."""
    out: dict[EngineCondition, list[str]] = {}
    for native, cond in ENGINE_STATE_CONDITIONS.items():
        if cond is not None:
            out.setdefault(cond, []).append(native)
    return {c: tuple(ns) for c, ns in out.items()}


def state_table(spec: LifecycleSpec = LIFECYCLE) -> list[tuple[State, EngineCondition, tuple[str, ...]]]:
    """For every state of ``spec``: the engine condition it declares and the ``EngineState`` names that match
    (empty where megatron has none: not built yet, or unknown after a failure)."""
    by_cond = natives_by_condition()
    return [(s.state, s.engine, by_cond.get(s.engine, ())) for s in spec.states]


def state_name(state: Any) -> str:
    """The name of a megatron enum member (``EngineState``, ``Status``), or its string."""
    return str(getattr(state, "name", state))


def as_list(x: Any) -> list[Any]:
    """A tensor, list or None as a plain list."""
    if x is None:
        return []
    tolist = getattr(x, "tolist", None)
    return list(tolist()) if callable(tolist) else list(x)


def token_versions(
    policy_epoch: Sequence[Sequence[int]] | None,
    prompt_len: int,
    n_tokens: int,
    *,
    sent: Iterable[int] | None = None,
    request_id: object = None,
) -> tuple[int, ...]:
    """The weight version of each of ``n_tokens`` generated tokens, from megatron's ``policy_epoch`` boundaries.

    ``sent`` (the epochs this engine set) is checked: a stamp the engine never sent, a missing stamp or a
    version that goes backwards raises :class:`~colo_fsm.errors.LifecycleError` naming the request.
    """
    if n_tokens == 0:
        return ()
    if not policy_epoch:
        raise LifecycleError(
            f"request {request_id} came back without policy_epoch stamps ({n_tokens} tokens): the generation "
            "epoch was not set before it was admitted (set_generation_epoch at bring-up and at every resume)"
        )
    bounds = sorted((int(i), int(e)) for i, e in policy_epoch)
    epochs = [e for _, e in bounds]
    if any(b < a for a, b in pairwise(epochs)):
        raise LifecycleError(f"request {request_id}: policy_epoch goes backwards: {bounds}")
    if sent is not None:
        allowed = set(sent)
        stray = sorted({e for e in epochs if e not in allowed})
        if stray:
            raise LifecycleError(
                f"request {request_id}: policy_epoch stamps {stray} were never set by this engine "
                f"(epochs set: {sorted(allowed)})"
            )
    out: list[int] = []
    k = 0
    current = bounds[0][1]
    for j in range(n_tokens):
        pos = prompt_len + j - 1  # the forward that produced token j ran at this position
        while k < len(bounds) and bounds[k][0] <= pos:
            current = bounds[k][1]
            k += 1
        out.append(current)
    return tuple(out)


__all__ = [
    "ENGINE_STATE_CONDITIONS",
    "SLEEP",
    "WAKE",
    "as_list",
    "condition_of",
    "natives_by_condition",
    "state_name",
    "state_table",
    "token_versions",
]
