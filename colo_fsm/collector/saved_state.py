"""What :meth:`~colo_fsm.collector.collector.AsyncCollector.state_dict` saves, and the checks on reading it back.

A snapshot holds the prompts to issue again on restore (those put back by deferred or taken-back rollouts, and
those of the rollouts parked in the engine: engine state is not checkpointed), each with its draw order, and the
replay buffer's finished groups. The collector takes and restores it under its own lock; this module only turns
it into JSON-able data and back, refusing a malformed one with a :class:`~colo_fsm.errors.ConfigError` that
names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from colo_fsm.collector.prompts import Prompt
from colo_fsm.errors import ConfigError

STATE_DICT_FORMAT = 2
"""Version of the snapshot (1: deferred prompts only; 2: also parked prompts and the buffer)."""

_PROMPT_LISTS = ("returned_prompts", "parked_prompts")


def snapshot(
    returned: Sequence[tuple[int, Prompt]], parked: Sequence[tuple[int, Prompt]], replay_buffer: Any
) -> dict[str, Any]:
    """The JSON-able snapshot of prompts put back (``returned``) and parked (``parked``), each ``(order,
    prompt)`` in draw order, beside the buffer's own state (``replay_buffer``)."""

    def item(order: int, p: Prompt) -> dict[str, Any]:
        return {"order": order, "prompt_id": p.prompt_id, "text": p.text, "metadata": dict(p.metadata)}

    return {
        "format": STATE_DICT_FORMAT,
        "returned_prompts": [item(o, p) for o, p in returned],
        "parked_prompts": [item(o, p) for o, p in parked],
        "replay_buffer": replay_buffer,
    }


def restored_prompts(state: Any) -> list[Prompt]:
    """The prompts of a snapshot (put back and parked together), in the order they were drawn.

    Raises :class:`~colo_fsm.errors.ConfigError` naming the field for anything that is not a snapshot of format
    1 or 2 (a missing ``order`` counts as the item's place in its list)."""
    if not isinstance(state, Mapping):
        raise ConfigError("state", state, "a mapping from AsyncCollector.state_dict()")
    if state.get("format") not in (1, STATE_DICT_FORMAT):
        raise ConfigError("state.format", state.get("format"), f"1 or {STATE_DICT_FORMAT}")
    entries: list[tuple[float, int, Prompt]] = []
    for key in _PROMPT_LISTS:
        items = state.get(key, [])
        if not isinstance(items, list | tuple):
            raise ConfigError(f"state.{key}", items, "a list of {prompt_id, text, metadata}")
        for n, it in enumerate(items):
            if not isinstance(it, Mapping):
                raise ConfigError(f"state.{key}[{n}]", it, "a mapping {prompt_id, text, metadata}")
            meta = it.get("metadata") or {}
            if not isinstance(meta, Mapping):
                raise ConfigError(f"state.{key}[{n}].metadata", meta, "a mapping")
            order = it.get("order", n)
            if isinstance(order, bool) or not isinstance(order, int | float):
                raise ConfigError(f"state.{key}[{n}].order", order, "a number")
            prompt = Prompt(it.get("prompt_id"), it.get("text"), dict(meta))  # type: ignore[arg-type]
            entries.append((float(order), len(entries), prompt))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [p for _, _, p in entries]


__all__ = ["STATE_DICT_FORMAT", "restored_prompts", "snapshot"]
