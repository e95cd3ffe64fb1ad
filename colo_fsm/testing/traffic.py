"""The kit's traffic to your engine inside a program: the inline validator (yours, or the kit's, which decodes a
request on your engine), server requests during a training step, and each activity's decode steps charged to its
cause (:mod:`colo_fsm.testing.effects`)."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from colo_fsm.testing.effects import Cause
from colo_fsm.testing.machine_state import MachineState


class KitTraffic(MachineState):
    """What the kit asks of your engine while the lifecycle runs (never through the lifecycle)."""

    def _validator(self, step: int, weight_version: int) -> Any:
        """The inline validator: yours, or the kit's, which decodes a request on your engine as a real one does
        (its decode steps counted as validation, in Validating where the engine is awake for it)."""
        self.log.add("validator", "validate", "call", (step, weight_version))
        self.faults.check("validator", "validate")
        self.validations += 1
        with self._activity(Cause.VALIDATION):
            user = self.user_validator
            if user is not None:
                who = getattr(user, "__qualname__", None) or type(user).__qualname__
                with self.effects.requests.delivering(f"your validator {who}"):
                    return user(step, weight_version)
            requests = self.effects.requests
            if requests.send(Cause.VALIDATION, 2) is not None and requests.step_driven:
                for _ in range(2):
                    requests.tick()
            return {"accuracy": 1.0}

    def _activity(self, cause: Cause) -> contextlib.AbstractContextManager[None]:
        """Decode steps inside the block are charged to ``cause``."""
        return self.effects.activity(cause, self._state_name, lambda: len(self.log))

    def _requests_during_training(self) -> None:
        """Inside every training step: a server request arrives and your engine's loop gets its chance to serve it
        (a step of its ``decode_step``, or, for an engine with a loop of its own, until the request parks)."""
        requests = self.effects.requests
        try:
            with self._activity(Cause.SERVER):
                requests.send(Cause.SERVER, 4)
                if requests.step_driven:
                    requests.tick()
                else:
                    requests.settle(requests.wait_s())
        except Exception as exc:  # your decode_step raised: reported as such, not as the trainer's failure
            self.log.add("server", "tick", "error", repr(exc), probe=False)
            raise AssertionError(f"{self.effects.names['decode_step']} raised during a training step: {exc!r}") from exc

    def _shutdown_engine(self) -> None:
        """Your engine's own ``shutdown()`` at the end of a program that did not stop it (releases requests the
        kit left parked in it)."""
        if self.ad is not None:
            out = self.ad.engine.shutdown()
            if inspect.isawaitable(out):
                self.runner(out)


__all__ = ["KitTraffic"]
