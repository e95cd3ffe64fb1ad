"""An example of an engine the lifecycle must refuse: a vLLM-style engine that refits weights across worlds.

It holds its *own copy* of the weights and needs an explicit transfer after every training step, so with
asynchronous colocated training it would decode from weights being overwritten. ``reads_weights_in_place``
is False, and :class:`~colo_fsm.machine.lifecycle.Lifecycle` raises
:class:`~colo_fsm.errors.UnsupportedEngine` for it unless ``async_training=False``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any


class RefitEngine:
    """A generation engine over a deep copy of the model; :meth:`refit` copies the trainer's weights in."""

    reads_weights_in_place = False

    def __init__(self, model: Any) -> None:
        self.source = model
        self.copy: Any = None
        self.refits = 0

    def bring_up(self) -> None:
        """Build the engine's own copy of the weights."""
        self.copy = copy.deepcopy(self.source)

    def refit(self) -> None:
        """Copy the trainer's current weights into the engine (the transfer a colocated engine avoids)."""
        self.copy.load_state_dict(self.source.state_dict())
        self.refits += 1

    def suspend(self) -> None:
        """Nothing to release in this example."""

    def resume(self) -> None:
        """Nothing to restore in this example."""

    def shutdown(self) -> None:
        """Drop the copy."""
        self.copy = None

    def server_base_urls(self) -> Sequence[str]:
        """No servers."""
        return []


__all__ = ["RefitEngine"]
