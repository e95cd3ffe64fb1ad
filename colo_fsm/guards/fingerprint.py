"""A small fingerprint of each rank's lifecycle state, exchanged by the handoff barrier itself.

Ranks that meet at a handoff barrier must agree on where they are: the lifecycle state, the step, the weight
version, the latched save / validate / last decisions and the shared model's mode. A fingerprint barrier
all-gathers one :class:`HandoffFingerprint` per rank *as* the barrier (one collective, seven int64 values per
rank) and :func:`divergence` turns any disagreement into a :class:`~colo_fsm.errors.HandoffDivergence` that
every rank raises at once, naming the fields, values and ranks, instead of a later hang in a collective
(see :attr:`colo_fsm.states.rules.LifecycleRule.UNIFORM_MODEL_MODE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from colo_fsm.errors import HandoffDivergence
from colo_fsm.guards.mode import ModeReport
from colo_fsm.states.spec import State

_STATES = [s.value for s in State]
FIELDS = ("state", "step", "weight_version", "save", "validate", "last", "mode_digest")
"""The exchanged fields, in wire order."""


@dataclass(frozen=True)
class HandoffFingerprint:
    """One rank's view at a handoff barrier. ``mode`` travels only in-process; its digest always travels."""

    state: str
    step: int
    weight_version: int
    save: bool = False
    validate: bool = False
    last: bool = False
    mode_digest: int = 0
    mode: ModeReport | None = field(default=None, compare=False)

    def to_ints(self) -> list[int]:
        """The wire form: seven integers (the state as its index in :class:`~colo_fsm.states.spec.State`)."""
        code = _STATES.index(self.state) if self.state in _STATES else -1
        return [
            code,
            int(self.step),
            int(self.weight_version),
            int(self.save),
            int(self.validate),
            int(self.last),
            int(self.mode_digest),
        ]

    @classmethod
    def from_ints(cls, values: list[int]) -> HandoffFingerprint:
        """Inverse of :meth:`to_ints` (without the in-process mode record)."""
        code, step, version, save, validate, last, digest = (int(v) for v in values)
        state = _STATES[code] if 0 <= code < len(_STATES) else f"<unknown {code}>"
        return cls(state, step, version, bool(save), bool(validate), bool(last), digest)

    def values(self) -> dict[str, Any]:
        """The exchanged fields by name."""
        return {f: getattr(self, f) for f in FIELDS}


def _table(rows: list[dict[str, Any]]) -> dict[str, dict[Any, list[int]]]:
    out: dict[str, dict[Any, list[int]]] = {}
    for name in rows[0] if rows else ():
        by_value: dict[Any, list[int]] = {}
        for rank, row in enumerate(rows):
            by_value.setdefault(row[name], []).append(rank)
        if len(by_value) > 1:
            out[name] = by_value
    return out


def differing_fields(fps: list[HandoffFingerprint]) -> dict[str, dict[Any, list[int]]]:
    """``{field: {value: [ranks]}}`` for every exchanged field on which the ranks (list index) disagree."""
    return _table([fp.values() for fp in fps])


def differing_mode(modes: list[dict[str, Any] | None]) -> dict[str, dict[Any, list[int]]]:
    """``{mode field: {value: [ranks]}}`` over the ranks' current mode records (None: reported nothing)."""
    rows = [m if m is not None else {} for m in modes]
    keys = sorted({k for r in rows for k in r})
    return _table([{k: r.get(k, "<none>") for k in keys} for r in rows])


def divergence(
    fps: list[HandoffFingerprint],
    *,
    rank: int,
    modes: list[dict[str, Any] | None] | None = None,
) -> HandoffDivergence | None:
    """The error every rank raises when the gathered fingerprints disagree, or None when they all agree."""
    fields = differing_fields(fps)
    if not fields:
        return None
    mine = fps[rank]
    return HandoffDivergence(
        fields,
        mode=differing_mode(modes) if modes is not None and "mode_digest" in fields else None,
        state=mine.state,
        rank=rank,
        weight_version=mine.weight_version,
    )


def mode_record(fp: HandoffFingerprint | None) -> dict[str, Any] | None:
    """The current-mode dict a rank exchanges on a digest mismatch (None when its engine reports nothing)."""
    return fp.mode.current.as_dict() if fp is not None and fp.mode is not None else None


__all__ = ["FIELDS", "HandoffFingerprint", "differing_fields", "differing_mode", "divergence", "mode_record"]
