"""Which weight versions a trajectory group came from.

A rollout parked in the engine through a training step finishes under newer weights than it started with
(``LifecycleRule.WEIGHT_VERSIONS``): its group carries the *oldest* version any of its tokens came from (its age is
counted from it) and the newest. Engines that record a version per token (colo-fsm's do) make that exact:
:func:`samples_versions`. For samples that do not, :func:`rollout_versions` bounds the samples' own stamps by what the
collector read at the rollout's start and end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from colo_fsm.adapters.protocols import Completion


def completion_versions(sample: Completion) -> tuple[int, int]:
    """``(oldest, newest)`` weight version of one completion's tokens (its ``weight_version`` when it has none)."""
    vs = tuple(sample.weight_versions)
    if not vs:
        return sample.weight_version, sample.weight_version
    return min(min(vs), sample.weight_version), max(vs)


def samples_versions(samples: Iterable[Completion]) -> tuple[int, int] | None:
    """``(oldest, newest)`` weight version over completions that report per-token versions; None if none does."""
    pairs = [completion_versions(s) for s in samples if s.weight_versions]
    if not pairs:
        return None
    return min(p[0] for p in pairs), max(p[1] for p in pairs)


def rollout_versions(
    samples: Sequence[Completion], version: int, end_version: int, *, paused_at_end: bool = False
) -> tuple[int, int]:
    """``(oldest, newest)`` weight version a rollout's ``samples`` came from, for a rollout that read ``version``
    at its start and ``end_version`` at its end.

    Samples that report per-token weight versions (the engine's record) are the truth: oldest and newest come
    from them. Otherwise the oldest is the oldest sample's stamp and the newest the version read at the
    rollout's end, both kept within the versions read at its start and end (a rollout's own tag outside them is
    replaced), with one exception: where the rollout ended while the collector was paused (``paused_at_end``),
    the window reaches one version past the end's read, as far as the samples say. The spec resumes the engine
    before the collector, so a collector told its version only at its resume (the Ray collector actor) sees
    parked rollouts finish under weights it has not heard of yet, and a rollout parked before any of its
    requests reached the engine is generated wholly under them (its oldest is the new version too).
    """
    spanned = samples_versions(samples)
    if spanned is not None:
        return spanned
    lo, hi = min(version, end_version), max(version, end_version)
    stamps = [s.weight_version for s in samples]
    top = hi + 1 if paused_at_end else hi  # the version the engine may have resumed with, unheard of
    return min(max(min(stamps), lo), top), max(hi, min(max(stamps), top))


__all__ = ["completion_versions", "rollout_versions", "samples_versions"]
