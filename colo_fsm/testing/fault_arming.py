"""Which faults a program arms: a drawn target the current state can still call (read from the spec and the run's
decisions), disarmed once it no longer can or after :data:`~colo_fsm.testing.programs.FAULT_PATIENCE` calls, so
one fault that never comes cannot block the others."""

from __future__ import annotations

from colo_fsm.states.spec import Fact, State
from colo_fsm.states.walk import last_step_validates
from colo_fsm.testing.machine_state import MachineState
from colo_fsm.testing.programs import FAULT_PATIENCE, callable_targets
from colo_fsm.testing.stats import count
from colo_fsm.testing.watch import FAULT_TARGETS, VALIDATOR_TARGET

S = State


class FaultArming(MachineState):
    """Arms one fault at a time in a call the lifecycle can still make."""

    def _callable_targets(self) -> tuple[tuple[str, str], ...]:
        assert self.lc is not None
        cfg = self.cfg
        targets = callable_targets(self.lc.spec, self.lc.state, inline_validator=cfg.inline_validator)
        never = set()  # calls the rest of this run never makes: its decisions save or validate at no step left
        if any(self.user_decisions.values()):
            return targets
        spec = self.lc.spec
        first = self.lc.step_index
        ahead = range(first, cfg.num_steps if cfg.num_steps is not None else first + 60)
        stops_early = cfg.early_stop_at is not None and any(
            f is Fact.STOP_EARLY for a in spec.actions for f in a.decides
        )
        if (
            cfg.must_save_by_s is None
            and not stops_early
            and not (cfg.checkpoint_every and any((s + 1) % cfg.checkpoint_every == 0 for s in ahead))
        ):
            never.add(("trainer", "save_checkpoint"))
            never.add(("trainer", "finalize_checkpoint"))
        last_validates = cfg.val_at_end and last_step_validates(spec)
        not_last = ahead[:-1] if cfg.num_steps is not None and not last_validates else ahead
        at_start = cfg.val_at_start and self.lc.state in (S.CREATED, S.STARTING)
        if not at_start and not (
            (cfg.validate_every and any((s + 1) % cfg.validate_every == 0 for s in not_last))
            or (last_validates and cfg.num_steps is not None)
        ):
            never.add(VALIDATOR_TARGET)
        return tuple(t for t in targets if t not in never)

    def _arm(self, drawn: tuple[str, str]) -> None:
        """Arm ``drawn``, or (when no call of it can come any more) a target that can still be called."""
        targets = self._callable_targets()
        if not targets:
            return
        # only a call that can still happen: one that never comes would block every other fault. A drawn target
        # that cannot stands for one that can (a fixed map, so programs still shrink).
        if drawn == type(self).first_fault and drawn not in targets:
            return  # a directed run arms its call only where it can come (another one would end the program early)
        index = FAULT_TARGETS.index(drawn) if drawn in FAULT_TARGETS else len(FAULT_TARGETS)
        target = drawn if drawn in targets else targets[index % len(targets)]
        self.faults.arm(*target)
        self.fault_waited = 0
        count("faults_armed")
        count(f"armed:{target[0]}.{target[1]}")

    def _retire_fault(self) -> None:
        """After a lifecycle call: disarm a fault that did not fire and no longer can (or waited long enough)."""
        armed = self.faults.armed
        if armed is None:
            return
        self.fault_waited += 1
        patient = armed == type(self).first_fault  # a directed run's fault waits for as long as it can still fire
        if (self.fault_waited >= FAULT_PATIENCE and not patient) or armed not in self._callable_targets():
            self.faults.armed = None
            count("faults_disarmed")


__all__ = ["FaultArming"]
