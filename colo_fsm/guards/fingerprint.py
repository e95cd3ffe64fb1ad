"""A small fingerprint of each rank's lifecycle state, exchanged by the handoff barrier itself.

Ranks that meet at a handoff barrier must agree on where they are: the lifecycle state, the step, the weight
version, the latched save / validate / last decisions and the shared model's mode; and each data-parallel
replica must sample from its own random stream. :data:`SPEC` declares every exchanged field with the rule it
is checked by (:class:`FieldRule`); a fingerprint barrier gathers one :class:`HandoffFingerprint` per rank
*as* the barrier (``len(SPEC)`` int64 values per rank, sent to every rank) and :func:`divergence` turns any
broken rule into a :class:`~colo_fsm.errors.HandoffDivergence` that every rank raises at once, naming the
fields, values and ranks, instead of a later hang in a collective (see
:attr:`colo_fsm.states.rules.LifecycleRule.UNIFORM_MODEL_MODE`).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from colo_fsm.errors import HandoffDivergence
from colo_fsm.guards.mode import ModeReport
from colo_fsm.states.spec import State

_STATES = [s.value for s in State]


class FieldRule(StrEnum):
    """How the ranks' values of one fingerprint field are checked."""

    UNIFORM = "uniform"  # the same on every rank
    REPLICA = "replica"  # names the rank's data-parallel replica (the key of PER_REPLICA fields; <0: none)
    PER_REPLICA = "per_replica"  # the same within one replica, different between replicas


@dataclass(frozen=True)
class FingerprintField:
    """One exchanged field: its name (an attribute of :class:`HandoffFingerprint`), rule and meaning."""

    name: str
    rule: FieldRule
    meaning: str
    key: str | None = None  # PER_REPLICA: the REPLICA field that groups the ranks


SPEC: tuple[FingerprintField, ...] = (
    FingerprintField("state", FieldRule.UNIFORM, "the lifecycle state"),
    FingerprintField("step", FieldRule.UNIFORM, "the training step index"),
    FingerprintField("weight_version", FieldRule.UNIFORM, "the weight version"),
    FingerprintField("save", FieldRule.UNIFORM, "this step saves a checkpoint (latched)"),
    FingerprintField("validate", FieldRule.UNIFORM, "this step validates (latched)"),
    FingerprintField("last", FieldRule.UNIFORM, "this step is the run's last (latched)"),
    FingerprintField("mode_digest", FieldRule.UNIFORM, "digest of the shared model's mode report"),
    FingerprintField("dp_rank", FieldRule.REPLICA, "the engine's data-parallel rank (-1: no sampling stream)"),
    FingerprintField("sampling_seed", FieldRule.PER_REPLICA, "the engine's sampling stream", key="dp_rank"),
)
"""Every exchanged field, in wire order, with its rule: the one declaration the wire form and the check read."""

FIELDS = tuple(f.name for f in SPEC)
"""The exchanged field names, in wire order."""


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
    dp_rank: int = -1
    sampling_seed: int = 0
    mode: ModeReport | None = field(default=None, compare=False)

    def to_ints(self) -> list[int]:
        """The wire form: one integer per :data:`SPEC` field (the state as its index in ``State``, -1 unknown)."""
        values = _GET(self)
        return [_STATE_CODES.get(v, -1) if i == _STATE_AT else int(v) for i, v in enumerate(values)]

    @classmethod
    def from_ints(cls, values: list[int]) -> HandoffFingerprint:
        """Inverse of :meth:`to_ints` (without the in-process mode record)."""
        return cls(**{name: _decode(name, int(v)) for name, v in zip(FIELDS, values, strict=True)})

    def values(self) -> dict[str, Any]:
        """The exchanged fields by name."""
        return {f: getattr(self, f) for f in FIELDS}


_BOOLS = frozenset(f.name for f in dataclasses.fields(HandoffFingerprint) if f.type == "bool")
_WIRE = tuple(f.name for f in dataclasses.fields(HandoffFingerprint) if f.name != "mode")
if _WIRE != FIELDS:  # the declaration and the dataclass must list the same fields in the same order
    raise ImportError(f"HandoffFingerprint fields {_WIRE} differ from the declared SPEC {FIELDS}")


_GET = operator.attrgetter(*FIELDS)
_STATE_AT = FIELDS.index("state")
_STATE_CODES = {name: code for code, name in enumerate(_STATES)}


def _decode(name: str, value: int) -> Any:
    if name == "state":
        return _STATES[value] if 0 <= value < len(_STATES) else f"<unknown {value}>"
    return bool(value) if name in _BOOLS else value


def _table(rows: list[dict[str, Any]], names: list[str] | None = None) -> dict[str, dict[Any, list[int]]]:
    out: dict[str, dict[Any, list[int]]] = {}
    for name in names if names is not None else list(rows[0]) if rows else []:
        by_value: dict[Any, list[int]] = {}
        for rank, row in enumerate(rows):
            by_value.setdefault(row[name], []).append(rank)
        if len(by_value) > 1:
            out[name] = by_value
    return out


def _per_replica(fps: list[HandoffFingerprint], spec: FingerprintField) -> tuple[dict[Any, list[int]], list[str]]:
    """``({value: [ranks]}, notes)`` for a PER_REPLICA field: one value per replica, no value in two replicas."""
    key_name = spec.key or ""
    replicas: dict[int, dict[Any, list[int]]] = {}
    for rank, fp in enumerate(fps):
        key = int(getattr(fp, key_name))
        if key >= 0:  # ranks whose engine reports no replica are not checked
            replicas.setdefault(key, {}).setdefault(getattr(fp, spec.name), []).append(rank)
    bad: dict[Any, list[int]] = {}
    notes: list[str] = []
    for key, by_value in sorted(replicas.items()):
        if len(by_value) > 1:
            notes.append(f"{spec.name} differs within {spec.key} {key} (its ranks must share one {spec.meaning})")
            for value, ranks in by_value.items():
                bad.setdefault(value, []).extend(ranks)
    owners: dict[Any, list[int]] = {}
    for key, by_value in sorted(replicas.items()):
        for value in by_value:
            owners.setdefault(value, []).append(key)
    for value, keys in owners.items():
        if len(keys) > 1:
            ranks = sorted(r for k in keys for r in replicas[k][value])
            notes.append(
                f"{spec.name}: {spec.key} {keys} (ranks {ranks}) share {spec.meaning} {value!r}; "
                f"each {spec.key} must have its own"
            )
            bad[value] = sorted(set(bad.get(value, [])) | set(ranks))
    return bad, notes


def differing_fields(fps: list[HandoffFingerprint]) -> dict[str, dict[Any, list[int]]]:
    """``{field: {value: [ranks]}}`` for every field whose rule the ranks (list index) break."""
    return _check(fps)[0]


def _check(fps: list[HandoffFingerprint]) -> tuple[dict[str, dict[Any, list[int]]], list[str]]:
    uniform = [f.name for f in SPEC if f.rule is FieldRule.UNIFORM]
    fields = _table([fp.values() for fp in fps], uniform)
    notes: list[str] = []
    for spec in SPEC:
        if spec.rule is FieldRule.PER_REPLICA:
            bad, why = _per_replica(fps, spec)
            if bad:
                fields[spec.name] = bad
                notes.extend(why)
    return fields, notes


def differing_mode(modes: list[dict[str, Any] | None]) -> dict[str, dict[Any, list[int]]]:
    """``{mode field: {value: [ranks]}}`` over the ranks' current mode records (None: reported nothing)."""
    rows = [m if m is not None else {} for m in modes]
    keys = sorted({k for r in rows for k in r})
    return _table([{k: r.get(k, "<none>") for k in keys} for r in rows])


_UNIFORM_AT = tuple(i for i, f in enumerate(SPEC) if f.rule is FieldRule.UNIFORM)
_PER_REPLICA_AT = tuple((FIELDS.index(f.key or ""), i) for i, f in enumerate(SPEC) if f.rule is FieldRule.PER_REPLICA)


def rows_pass(rows: list[list[int]]) -> bool:
    """Whether the ranks' wire rows (:meth:`HandoffFingerprint.to_ints`) keep every rule of :data:`SPEC`.

    The barrier's fast path: a few integer comparisons, no decoding; :func:`divergence` names what broke.
    """
    first = rows[0]
    for row in rows[1:]:
        for i in _UNIFORM_AT:
            if row[i] != first[i]:
                return False
    for key_at, value_at in _PER_REPLICA_AT:
        value_of: dict[int, int] = {}
        key_of: dict[int, int] = {}
        for row in rows:
            key, value = row[key_at], row[value_at]
            if key < 0:
                continue
            if value_of.setdefault(key, value) != value or key_of.setdefault(value, key) != key:
                return False
    return True


def divergence(
    fps: list[HandoffFingerprint],
    *,
    rank: int,
    modes: list[dict[str, Any] | None] | None = None,
) -> HandoffDivergence | None:
    """The error every rank raises when the gathered fingerprints break a rule, or None when they pass."""
    if rows_pass([fp.to_ints() for fp in fps]):
        return None
    fields, notes = _check(fps)
    if not fields:
        return None
    mine = fps[rank]
    return HandoffDivergence(
        fields,
        mode=differing_mode(modes) if modes is not None and "mode_digest" in fields else None,
        notes=notes,
        state=mine.state,
        rank=rank,
        weight_version=mine.weight_version,
    )


def mode_record(fp: HandoffFingerprint | None) -> dict[str, Any] | None:
    """The current-mode dict a rank exchanges on a digest mismatch (None when its engine reports nothing)."""
    return fp.mode.current.as_dict() if fp is not None and fp.mode is not None else None


__all__ = [
    "FIELDS",
    "SPEC",
    "FieldRule",
    "FingerprintField",
    "HandoffFingerprint",
    "differing_fields",
    "differing_mode",
    "divergence",
    "mode_record",
    "rows_pass",
]
