"""The kit judges what the engine does, not what it says: decodes counted by their cause and charged where they ran,
and tokens time-stamped against the lifecycle's own windows (item 1 of issue 27)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from colo_fsm.adapters.protocols import Completion
from colo_fsm.errors import LifecycleViolation
from colo_fsm.guards.decision import LatchedDecision, ValidationDecision
from colo_fsm.states import NEMO_RL, State
from colo_fsm.states.spec import EngineCondition
from colo_fsm.testing.effects import Cause, Effects, is_parked
from colo_fsm.testing.lifecycle_machine import (
    KitHandle,
    RunConfig,
    check_lifecycle,
    lifecycle_machine,
    lifecycle_test_case,
    recording_fakes,
    stats_snapshot,
)
from colo_fsm.testing.profiles import CI_PROFILE, DEV_PROFILE, lifecycle_settings
from colo_fsm.testing.watch import Conditions, EventLog
from tests.support.liars import LyingNemoEngine, docs_shaped, lying_toy_engine, nemo_shaped

S = State


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("colo_fsm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


def _config(**changes: Any) -> RunConfig:
    base: dict[str, Any] = dict(
        num_steps=1,
        start_step=0,
        start_weight_version=0,
        checkpoint_every=None,
        must_save_by_s=None,
        validate_every=1,
        inline_validator=True,
        max_trajectory_age_steps=2,
        num_prompts_per_step=1,
        samples_per_group=1,
        actor_max_concurrency=16,
        control_headroom=0,
    )
    base.update(changes)
    return RunConfig(**base)


class DecodingValidator:
    """A validation that decodes on the engine, as a real one does (its decode step runs in Validating)."""

    def __init__(self, handle: KitHandle) -> None:
        self.handle = handle

    def __call__(self, step: int, weight_version: int) -> dict[str, float]:
        engine = self.handle.extra["engine"]
        engine.submit(1)
        engine.decode_step()
        return {"reward": 1.0}


def _engine_in_extra(handle: KitHandle) -> Any:
    ad = recording_fakes()
    handle.extra["engine"] = ad.engine
    return ad


def test_a_validation_decode_is_not_charged_to_the_state_the_step_ends_in():
    """One kit step runs Validating -> Checkpointing -> Done (NeMo-RL's last step: validate, save, done); the
    validator's decode step ran in Validating, where the engine is awake for it, never in Done."""
    machine_cls = lifecycle_machine(
        _engine_in_extra,
        spec=NEMO_RL,
        validator_factory=DecodingValidator,
        validation_factory=lambda: ValidationDecision(1),
        checkpoint_factory=lambda: LatchedDecision("checkpoint", lambda step: True),
    )
    m = machine_cls()
    try:
        m.setup(_config(), autostart=1, first_fault=None)
        m.whole_step()
        assert m.lc is not None and m.lc.state is S.DONE and m.ad is not None and m.ad.engine.decode_steps == 1
        m.no_decode_while_parked()
    finally:
        m.teardown()


# ------------------------------------------------------------------------------- windows, forced interleavings
NAMES = {
    "engine": "ScriptedEngine",
    "suspend": "ScriptedEngine.suspend",
    "shutdown": "ScriptedEngine.shutdown",
    "decode_step": "ScriptedEngine.decode_step",
    "train_step": "ScriptedTrainer.train_step",
}


class ScriptedEngine:
    """An engine whose tokens the test delivers by hand, at the point of the lifecycle's calls it chooses."""

    def __init__(self) -> None:
        self.on_token: list[Any] = []

    def submit(self, prompt_ids: Any, *, max_tokens: int, on_token: Any = None) -> int:
        self.on_token.append(on_token)
        return len(self.on_token) - 1

    def deliver(self, request: int = 0) -> None:
        self.on_token[request](7, 0.0, 1)


def _effects(engine: Any, initial: EngineCondition = EngineCondition.AWAKE) -> tuple[EventLog, Effects]:
    log = EventLog(lambda: "Draining", Conditions())
    return log, Effects.watch(log, initial, engine, names=NAMES)


def test_a_token_is_judged_by_when_it_arrives_against_the_lifecycles_own_calls():
    """Tokens inside suspend() (the step it finishes) are fine; after it returns and until the next resume()
    call they are not; during train_step they break one-communicator; from the resume call on they are fine."""
    engine = ScriptedEngine()
    log, fx = _effects(engine)
    assert fx.requests.send(Cause.SERVER, 4) is not None
    engine.deliver()  # awake
    log.add("engine", "suspend", "call")
    engine.deliver()  # the step a suspend waits for
    assert not fx.requests.violations
    log.add("engine", "suspend", "ok")
    engine.deliver()  # held suspended: the lie shows
    log.add("trainer", "train_step", "call")
    engine.deliver()  # during training
    log.add("trainer", "train_step", "ok")
    log.add("engine", "resume", "call")
    engine.deliver()  # woken
    kinds = [v.kind for v in fx.requests.violations]
    assert kinds == ["while_suspended", "during_training"], fx.requests.violations
    first, second = fx.requests.violations
    assert first.since == second.since - 2 and first.at == 5 and second.at == 7
    assert "ScriptedEngine.suspend() returned at event 4" in first.text and "before the lifecycle resumed" in first.text
    assert "during ScriptedTrainer.train_step (event 6)" in second.text


def test_a_token_after_shutdown_is_judged_and_none_is_sent_to_a_torn_down_engine():
    engine = ScriptedEngine()
    log, fx = _effects(engine)
    fx.requests.send(Cause.SERVER, 4)
    log.add("engine", "shutdown", "call")
    log.add("engine", "shutdown", "ok")
    engine.deliver()
    assert len(fx.requests.violations) == 1, fx.requests.violations
    assert "ScriptedEngine.shutdown() returned" in fx.requests.violations[0].text
    assert fx.requests.send(Cause.SERVER, 4) is None  # nothing is sent to a torn-down engine


class GatedGenerator:
    """A ``generate`` engine whose requests return only when the test releases them (one gate per request)."""

    def __init__(self) -> None:
        self.gates: list[threading.Event] = []
        self.entered: list[threading.Event] = []

    def prepare(self) -> int:
        self.gates.append(threading.Event())
        self.entered.append(threading.Event())
        return len(self.gates) - 1

    def generate(self, prompts: Any, *, max_tokens: int, temperature: float = 0.0, seed: Any = None) -> Any:
        n = int(threading.current_thread().name.rsplit("-", 1)[1])
        self.entered[n].set()
        self.gates[n].wait()  # parked until the test (or the engine's shutdown) releases it; a daemon thread
        return [Completion("x", (1, 2), 0)]


WAIT_S = 30.0  # a bound on waiting for an event the test itself sets (a busy machine), never a timing figure


def _done(fx: Effects, n: int) -> None:
    thread = fx.requests.requests[n].thread
    assert thread is not None
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_completion_counts_only_if_its_whole_request_lay_in_one_silent_window():
    engine = GatedGenerator()
    log, fx = _effects(engine)
    assert fx.requests.channel is not None and fx.requests.channel.kind == "generate"
    engine.prepare()
    fx.requests.send(Cause.SERVER, 2)  # submitted awake ...
    assert engine.entered[0].wait(WAIT_S)
    log.add("engine", "suspend", "ok")
    engine.gates[0].set()  # ... returns while suspended: its tokens may predate the suspend
    _done(fx, 0)
    engine.prepare()
    fx.requests.send(Cause.SERVER, 2)  # submitted while suspended, returns before any resume: decoded suspended
    engine.gates[1].set()
    _done(fx, 1)
    engine.prepare()
    fx.requests.send(Cause.SERVER, 2)  # submitted while suspended, returns after the resume call: parked, fine
    assert engine.entered[2].wait(WAIT_S)
    log.add("engine", "resume", "call")
    engine.gates[2].set()
    _done(fx, 2)
    assert len(fx.requests.violations) == 1, fx.requests.violations  # the second request only
    v = fx.requests.violations[0]
    assert v.kind == "while_suspended" and "GatedGenerator.generate returned 2 token(s)" in v.text
    assert f"submitted at event {fx.requests.requests[1].submitted.index}" in v.text


def test_a_request_thread_blocked_in_a_threading_wait_counts_as_parked():
    """How the kit's wait for a ``generate`` request ends: its thread blocks in a threading wait (parked), or it
    returns. A thread still running Python code is neither."""
    gate, running, stop = threading.Event(), threading.Event(), threading.Event()

    def spin() -> None:
        running.set()
        while not stop.is_set():
            pass

    parked = threading.Thread(target=gate.wait, daemon=True)
    busy = threading.Thread(target=spin, daemon=True)
    parked.start()
    busy.start()
    assert running.wait(WAIT_S)
    deadline = threading.Event()
    for _ in range(int(WAIT_S / 0.001)):  # the parked thread reaches its wait (a bounded poll, no timing asserted)
        if is_parked(parked):
            break
        deadline.wait(0.001)
    try:
        assert is_parked(parked), "a thread blocked in Event.wait is a parked request"
        assert not is_parked(busy), "a thread running Python code is not parked"
    finally:
        gate.set()
        stop.set()
    parked.join(WAIT_S)
    busy.join(WAIT_S)
    assert not is_parked(parked), "a thread that ended is not parked"


def test_a_parked_generate_request_is_released_at_the_end_of_a_program():
    engine = GatedGenerator()
    _log, fx = _effects(engine, EngineCondition.SUSPENDED)
    engine.prepare()
    req = fx.requests.send(Cause.SERVER, 2)
    assert req is not None and engine.entered[0].wait(WAIT_S)
    fx.requests.settle(WAIT_S)  # ends once the request parks
    assert not req.done
    assert fx.requests.close(engine.gates[0].set) == 1  # the engine's shutdown releases the parked request
    assert req.thread is not None
    req.thread.join(WAIT_S)
    assert req.done and not req.thread.is_alive()


def test_the_decode_ledger_charges_each_step_to_its_cause_where_it_ran():
    steps = [0]
    log = EventLog(lambda: "Validating", Conditions())
    fx = Effects.watch(log, EngineCondition.AWAKE, object(), names=NAMES, decode_probe=lambda: steps[0])
    with fx.activity(Cause.VALIDATION, lambda: "Validating", lambda: len(log)):
        steps[0] += 1  # the validator's decode step, with the engine awake for it
    log.add("engine", "suspend", "ok")
    with fx.activity(Cause.ROLLOUT, lambda: "Draining", lambda: len(log)):
        steps[0] += 2  # a rollout decoding on a suspended engine
    assert fx.ledger.by_cause == {(Cause.VALIDATION, "Validating"): 1, (Cause.ROLLOUT, "Draining"): 2}
    assert len(fx.ledger.violations) == 1, fx.ledger.violations  # the rollout's steps, not the validation's
    v = fx.ledger.violations[0]
    assert "ran 2 decode step(s) (rollout)" in v.text and "ScriptedEngine.suspend() returned at event 0" in v.text


# ------------------------------------------------------------------------------- the kit over adapters that lie
REPORT_LINES = 40


def _violation(factory: Any, **attrs: Any) -> LifecycleViolation:
    """The kit's report on ``factory``'s adapters under the default profile (it must find a violation)."""
    with pytest.raises(LifecycleViolation) as info:
        check_lifecycle(factory, profile=CI_PROFILE, **attrs)
    return info.value


def test_the_kit_finds_the_docs_toy_engine_serving_while_it_says_suspended():
    """The docs' own toy adapters (docs/embedding.md), their engine's suspend() a lie: found by what it does."""
    report = str(_violation(docs_shaped(lying_toy_engine())))
    first = report.splitlines()[0]
    assert first.startswith("[one-communicator] LyingToyEngine.suspend() returned at event"), first
    assert "LyingToyEngine.generate returned" in first and "WatchedEngine" not in report
    assert len(report.splitlines()) <= REPORT_LINES, report


def test_the_kit_finds_a_nemo_shaped_engine_that_lies_in_every_report():
    """Its condition says suspended and its request counts say parked: only the tokens show it serving."""
    report = str(_violation(nemo_shaped(LyingNemoEngine), spec=NEMO_RL))
    first = report.splitlines()[0]
    assert first.startswith("[one-communicator] LyingNemoEngine.suspend() returned at event"), first
    assert "LyingNemoEngine.decode_step delivered a token" in first and "WatchedEngine" not in report
    assert len(report.splitlines()) <= REPORT_LINES, report


def test_the_honest_shapes_pass_with_validation_decoding_on_the_engine():
    """No false alarm: the docs' engine parks the kit's requests, the NeMo-shaped one parks and resumes them, and
    the validations (the kit's, decoding on the engine) run in Validating."""
    quick = lifecycle_settings(DEV_PROFILE)
    before = stats_snapshot()
    check_lifecycle(docs_shaped(), settings=quick, inject_faults=False)  # no fault ends a program early
    check_lifecycle(nemo_shaped(), settings=quick, spec=NEMO_RL, inject_faults=False)
    after = stats_snapshot()
    assert after.get("kit_requests", 0) > before.get("kit_requests", 0)


def test_the_test_case_class_reports_the_same_way():
    case = lifecycle_test_case(nemo_shaped(LyingNemoEngine), profile=DEV_PROFILE, spec=NEMO_RL)
    with pytest.raises(LifecycleViolation, match=r"LyingNemoEngine\.suspend\(\) returned"):
        case("runTest").runTest()


def _directed(factory: Any, program: Any, **attrs: Any) -> str:
    """Run one program by hand (``program(machine)``) and return what the kit's checks say after it."""
    m = lifecycle_machine(factory, inject_faults=False, **attrs)()
    try:
        m.setup(_config(num_steps=3, validate_every=None), autostart=1, first_fault=None)
        program(m)
        with pytest.raises(AssertionError) as info:
            m.lifecycle_rules()
        return str(info.value)
    finally:
        m.teardown()


def test_a_request_arriving_while_the_trainer_runs_is_served_by_the_liar_during_training():
    def program(m: Any) -> None:
        m.whole_step()  # a server request arrives while the trainer runs

    text = _directed(nemo_shaped(LyingNemoEngine), program, spec=NEMO_RL)
    assert text.startswith("[one-communicator] LyingNemoEngine.suspend() returned"), text
    assert "LyingNemoEngine.decode_step delivered a token to a server request" in text
    assert "during NemoShapedTrainer.train_step" in text


def test_a_request_to_the_docs_liar_in_a_handoff_returns_before_the_resume():
    def program(m: Any) -> None:
        m.begin_step()
        m.disturb(("request", 1))
        (req,) = m.effects.requests.requests
        req.thread.join(WAIT_S)  # the liar's generate returns at once; a parking engine's would not
        assert req.done

    text = _directed(docs_shaped(lying_toy_engine()), program)
    assert text.startswith("[one-communicator] LyingToyEngine.suspend() returned"), text
    assert (
        "LyingToyEngine.generate returned 1 token(s)" in text and "in Draining, before the lifecycle resumed it" in text
    )


def test_a_lifecycle_call_that_never_comes_to_rest_is_refused():
    """A spec whose automatic transitions loop for ever (the kit runs mutants with the spec gate off) fails the
    program once one lifecycle call has made more adapter calls than any step makes, instead of looping."""
    log = EventLog(lambda: "Validating", Conditions())
    log.call_budget = 3
    for _ in range(3):
        log.add("validator", "validate", "call")
    log.add("server", "token", "ok", probe=False)  # what adapters produce is not a call of the lifecycle
    with pytest.raises(AssertionError, match=r"more than 3 calls in one of its own calls .* never comes to rest"):
        log.add("trainer", "save_checkpoint", "call")
