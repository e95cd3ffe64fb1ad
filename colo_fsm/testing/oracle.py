"""The oracle of each step's decisions: what the rules say the step latches (independently of the machine), and
where the spec's declared effects say the step rests, checked after every step that ran through."""

from __future__ import annotations

from colo_fsm.guards.decision import CheckpointDecision
from colo_fsm.states.spec import Fact, Role, State
from colo_fsm.states.walk import walk_step
from colo_fsm.testing.machine_state import MachineState
from colo_fsm.testing.programs import StepRecord


class StepOracle(MachineState):
    """Decides, at the moment a step latches, what it should latch and do (``DECIDE_ONCE``), and checks the step
    when it ends: saved iff decided, exactly once, resting where the spec says."""

    def _latched(self, step: int, wv: int, at: int) -> None:
        """Oracle of the step's decisions, compared with what the machine latched."""
        lc = self.lc
        assert lc is not None
        if lc.checkpoint_decision.peek(step) is None:
            return  # the latch never ran (a fault before it)
        cfg = self.cfg
        user = self.user_decisions
        if user["checkpoint"]:
            save = bool(lc.checkpoint_decision.peek(step))
            deadline = isinstance(lc.checkpoint_decision, CheckpointDecision) and lc.checkpoint_decision.stops_run(step)
        else:
            periodic = cfg.checkpoint_every is not None and (step + 1) % cfg.checkpoint_every == 0
            deadline = self.deadline_at is not None and not self.deadline_fired and self.clock() >= self.deadline_at
            self.deadline_fired = self.deadline_fired or deadline
            save = periodic or deadline
        last = (cfg.num_steps is not None and step + 1 >= cfg.num_steps) or deadline
        if user["validation"]:
            validate = bool(lc.validation_decision.peek(step))
        else:
            validate = cfg.validate_every is not None and (step + 1) % cfg.validate_every == 0
        validate = validate or (last and cfg.val_at_end)
        rec = StepRecord(
            step=step,
            save=save,
            validate=validate,
            last=last,
            event_index=at,
            wv_before=wv,
            early_stop=lc.early_stop is not None and not user["early_stop"] and cfg.early_stop_at == step + 1,
        )
        self.steps.append(rec)
        got = (lc.facts[Fact.SAVE_THIS_STEP], lc.facts[Fact.VALIDATE_THIS_STEP], lc.facts[Fact.LAST_STEP])
        stops = lc.early_stop is not None and lc.facts[Fact.STOP_EARLY]  # latched after validation: save-and-stop
        want = (rec.save or (stops and lc.saves_on_early_stop), rec.validate, rec.last or stops)
        assert got == want, f"step {step}: latched save/validate/last={got}, the rules say {want}"
        if rec.last:
            self.last_latched_at = at

    def _expected_rest(self, rec: StepRecord, *, inline: bool) -> State:
        """Where the spec says the step rests, walked over the declared effects with the oracle's decisions."""
        lc = self.lc
        assert lc is not None
        spec = lc.spec
        stop_latched = rec.early_stop
        if self.user_decisions["early_stop"] and lc.early_stop is not None:
            stop_latched = bool(lc.early_stop.peek(rec.step + 1))  # asked with the steps trained, as the validator
        decisions = {
            Fact.SAVE_THIS_STEP: rec.save,
            Fact.VALIDATE_THIS_STEP: rec.validate,
            Fact.LAST_STEP: rec.last,
            Fact.STOP_EARLY: stop_latched,
        }
        return walk_step(spec, decisions, through_validation=inline, save_on_stop=lc.saves_on_early_stop)

    def _step_outcome(self, rec: StepRecord, *, inline: bool) -> None:
        """After a step that ran through: it saved iff decided, once, and rests where the spec says.

        A step resting in a validation-only state is checked again when it leaves it (its early-stop latch and
        save, in a validate-before-save spec, come after the validation).
        """
        lc = self.lc
        assert lc is not None
        spec = lc.spec
        expected = self._expected_rest(rec, inline=inline)
        assert lc.state is expected, (
            f"step {rec.step} (save={rec.save} validate={rec.validate} last={rec.last} early_stop={rec.early_stop}) "
            f"rests in {lc.state.value}; the spec's declared effects say {expected.value}"
        )
        wv = rec.wv_before + 1
        assert lc.weight_version == wv, f"step {rec.step}: weight version {lc.weight_version}, expected {wv}"
        if spec.state(lc.state).validates:
            return  # the step is not over yet
        rec.done = True
        events = self.log.events[rec.event_index :]
        saves = [e.detail for e in events if e.name == "trainer.save_checkpoint" and e.phase == "ok"]
        stops = lc.facts.get(Fact.STOP_EARLY, False) if lc.early_stop is not None else False
        validated = any(spec.state(e.state).validates for e in events)
        if rec.early_stop and validated and spec.with_role(Role.LATCH_STOP):
            assert stops, f"step {rec.step}: the early-stop decision said stop after validation, the machine did not"
        want = [(rec.step + 1, wv)] if rec.save or (stops and lc.saves_on_early_stop) else []
        assert saves == want, (
            f"step {rec.step}: the latched decisions said save={rec.save} early_stop={stops}, saves made: {saves} "
            f"(expected {want}: decided once, saved exactly once; an early stop saves and ends the run)"
        )
        if stops:
            assert spec.state(lc.state).final, f"step {rec.step}: an early stop latched, the run rests in {lc.state}"
        if saves and spec.validate_before_save and rec.validate:
            first_save = next(e.index for e in events if e.name == "trainer.save_checkpoint")
            woke = any(spec.state(e.state).validates for e in events if e.index < first_save)
            assert woke, f"step {rec.step}: saved before its validation (this spec validates before the save)"
        if saves and spec.with_role(Role.FINALIZE):
            last_save = max(e.index for e in events if e.name == "trainer.save_checkpoint")
            finalized = any(e.name == "trainer.finalize_checkpoint" and e.index > last_save for e in events)
            assert finalized, f"step {rec.step}: the async save was never finalized (every collective before a wake)"

    def _pending_step(self) -> StepRecord | None:
        return self.steps[-1] if self.steps and not self.steps[-1].done else None


__all__ = ["StepOracle"]
