"""Which groups a training step takes from the replay buffer: in the order their rollouts started, or by deadline.

Every group has a deadline: the last weight version that may train on it, ``start version + max_age``.
``ReplayBuffer(order="start")`` (the default) takes the ``n`` oldest reservations and waits for all of them, so
one long rollout at the head holds the step even when younger groups are finished. That is head-of-line
blocking, and with long output tails it costs parking most of its gain.

``order="deadline"`` takes only what must go now and fills the rest with finished groups. Sorted by deadline,
the ``i``-th group (0-based) with ``k`` steps left before its deadline forces ``i + 1 - n * k`` groups into this
step: steps ``w .. w + k`` hold ``n * (k + 1)`` places, and if fewer than ``i + 1`` remain after this one, a
group goes stale. The step takes the most any group forces (the earliest deadlines), waiting for them if they
are still running, and fills its other places with the finished groups of the earliest deadlines. What is left
again forces at most ``n`` per step, so no admitted group ever goes stale: the buffer's admission keeps at most
``n * (max_age + 1)`` groups queued, which is the same bound for ``k = max_age``. (A group put without a
reservation can break it; the buffer evicts and counts such a group when it is too old, as in start order.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

ORDERS = ("start", "deadline")
"""``ReplayBuffer(order=...)``: the oldest reservations first, or what must go now plus what is finished."""


class Place(NamedTuple):
    """A place in the buffer's queue: its sequence number, the weight version its age counts from, finished."""

    seq: int
    weight_version: int
    finished: bool


def forced_count(places: Sequence[Place], n: int, weight_version: int, max_age: int) -> int:
    """How many of the earliest-deadline places this step must take so that none goes stale (at most ``n``)."""
    ordered = sorted(places, key=lambda p: (p.weight_version, p.seq))
    must = 0
    for i, p in enumerate(ordered):
        left = p.weight_version + max_age - weight_version  # steps after this one before its deadline
        must = max(must, i + 1 - n * max(0, left))
    return min(must, n)


def pick(places: Sequence[Place], n: int, weight_version: int, max_age: int, order: str) -> list[int] | None:
    """The sequence numbers of the ``n`` places a step takes now (in queue order), or None while it must wait."""
    if order == "start":
        head = list(places[:n])
        return [p.seq for p in head] if len(head) == n and all(p.finished for p in head) else None
    live = [p for p in places if p.weight_version + max_age >= weight_version]  # stale running ones: not counted
    ordered = sorted(live, key=lambda p: (p.weight_version, p.seq))
    must = forced_count(live, n, weight_version, max_age)
    forced = ordered[:must]
    if not all(p.finished for p in forced):
        return None
    fill = [p for p in ordered[must:] if p.finished][: n - must]
    if len(forced) + len(fill) < n:
        return None
    return sorted(p.seq for p in (*forced, *fill))


__all__ = ["ORDERS", "Place", "forced_count", "pick"]
