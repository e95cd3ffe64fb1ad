"""The lifecycle machine's checks: each checks one lifecycle rule (:class:`~colo_fsm.states.rules.LifecycleRule`)
after every step of every program, from the event log the recording proxies wrote (never from the machine's own
bookkeeping) and from what the engine did (:mod:`colo_fsm.testing.effects`), never only from what it says.

They run as one hypothesis invariant (:meth:`LifecycleInvariants.lifecycle_rules`), so a shrunk program prints one
line per step, not one per check; each check is still a method named for what it checks, marked with its rule."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis.stateful import invariant

from colo_fsm.states.rules import LifecycleRule, checks
from colo_fsm.states.spec import CollectorCondition, EngineCondition, RequestCondition, State
from colo_fsm.testing.effects import EffectViolation
from colo_fsm.testing.machine_state import MachineState
from colo_fsm.testing.report import event_lines, recent_lines
from colo_fsm.testing.watch import Event

E, C, S = EngineCondition, CollectorCondition, State


class LifecycleInvariants(MachineState):
    """Every lifecycle rule, checked after every step (each check names the rule it checks)."""

    def _who(self, ev: Event) -> str:
        """``YourClass.method`` of an adapter call (the kit's own components by their role)."""
        return f"{self.log.names.get(ev.component, ev.component)}.{ev.method}"

    def _scan(self) -> None:
        """Feed new events to the audits; violations are kept per fact."""
        events = self.log.events
        v = self.violations
        for msg in self.audit.feed(events):
            v["handoff"].append(msg)
        for ev in events[self.scan_pos :]:
            self.scan_pos += 1
            if ev.phase != "call":
                continue
            name = ev.name
            if name == "engine.bring_up":
                self.builds += 1
                if self.adopts:
                    v["build_once"].append(
                        f"event {ev.index}: {self._who(ev)} although spec {self.spec.name} adopts an engine up "
                        "at construction"
                    )
                elif self.builds > 1:
                    v["build_once"].append(f"event {ev.index}: {self._who(ev)} called {self.builds} times")
            elif name == "engine.shutdown" and ev.state != S.STOPPED.value:
                v["teardown"].append(f"event {ev.index}: {self._who(ev)} in {ev.state} (only at Stopped)")
            elif name in ("trainer.train_step", "trainer.save_checkpoint"):
                real = (ev.real_engine, ev.real_collector)
                if ev.engine is E.AWAKE or ev.collector is C.RUNNING or real[0] == "awake" or real[1] == "running":
                    fact = "checkpoint_suspends" if name.endswith("save_checkpoint") else "no_decode_during_train"
                    v[fact].append(
                        f"event {ev.index}: {self._who(ev)} in {ev.state} with engine {ev.engine.value} "
                        f"(adapter says {real[0]}) and collector {ev.collector.value} "
                        f"(adapter says {real[1]})"
                    )
            elif name in ("engine.resume", "collector.resume"):
                validation_wake = name == "engine.resume" and self.spec.state(ev.state).validates
                if self.last_latched_at is not None and ev.index > self.last_latched_at and not validation_wake:
                    v["last_step"].append(
                        f"event {ev.index}: {self._who(ev)} in {ev.state} after the last step latched (only a "
                        "validation-only wake may follow it)"
                    )
                if self.builds == 0 and not self.adopts:
                    v["build_once"].append(f"event {ev.index}: {self._who(ev)} before the engine was built")
            elif name == "validator.validate" and (ev.engine is not E.AWAKE or ev.collector is not C.PAUSED):
                v["validation_wake"].append(
                    f"event {ev.index}: validation with engine {ev.engine.value}, "
                    f"collector {ev.collector.value} (awake, paused expected)"
                )

    def _assert_fact(self, fact: str) -> None:
        if self.lc is None:
            return
        self._scan()
        if self.violations.get(fact):
            raise AssertionError(
                "\n  ".join(self.violations[fact][:3]) + "\n  recent calls:\n" + "\n".join(recent_lines(self.log))
            )

    def _assert_silent(self, found: list[EffectViolation]) -> None:
        """Raise the first thing the engine did in a window where it must be silent, with the calls since the
        window opened."""
        if not found:
            return
        first = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        start = first.since if first.since is not None else first.at - 6
        raise AssertionError(
            f"{first.text}{more}\n  the lifecycle's calls and the engine's output from event {start}:\n"
            + "\n".join(event_lines(self.log, start, first.at, limit=8))
        )

    @checks(LifecycleRule.BUILD_ONCE)
    def build_once(self) -> None:
        """The engine comes up exactly once, before collection."""
        self._assert_fact("build_once")

    @checks(LifecycleRule.BUILD_ONCE)
    def server_urls_published(self) -> None:
        """The per-rank server base URLs the engine reports are published as dp_openai_server_base_urls."""
        lc = self.lc
        if lc is None or self.engine.published is None:
            return
        assert lc.dp_openai_server_base_urls == self.engine.published, (
            f"published {lc.dp_openai_server_base_urls}, the engine reported {self.engine.published}"
        )

    @checks(LifecycleRule.BUILD_ONCE)
    def teardown_only_at_stop(self) -> None:
        """Teardown only at Stopped (never at a validation boundary)."""
        self._assert_fact("teardown")

    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def drain_own_device_then_barrier(self) -> None:
        """Drain the LOCAL_RANK device before every barrier; drain + barrier before every phase signal."""
        self._assert_fact("handoff")

    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def no_decode_during_training(self) -> None:
        """No decode in flight (engine awake / collector running) while a training step runs."""
        self._assert_fact("no_decode_during_train")

    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def checkpoint_suspends_everything(self) -> None:
        """During every save the engine is suspended and the collector paused."""
        self._assert_fact("checkpoint_suspends")

    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def last_step_never_wakes(self) -> None:
        """Nothing resumes after the last step latched."""
        self._assert_fact("last_step")

    @checks(LifecycleRule.CHECKPOINT_SUSPENDS)
    def validation_runs_awake_collector_paused(self) -> None:
        """A validation-only wake: the engine awake, the collector still paused."""
        self._assert_fact("validation_wake")

    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def engine_silent_during_training(self) -> None:
        """No token of the kit's requests arrives between the trainer's ``train_step`` call and its return (what
        the engine did, stamped against the lifecycle's own calls; whatever the engine says)."""
        self._assert_silent(self.effects.violations("during_training"))

    @checks(LifecycleRule.ONE_COMMUNICATOR)
    def engine_silent_while_suspended(self) -> None:
        """No token of the kit's requests arrives while the lifecycle holds the engine suspended (from the
        return of its ``suspend()`` to its next ``resume()``: a handoff, a save, the last step) or torn down; a
        parked request does no work until the resume."""
        self._assert_silent(self.effects.violations("while_suspended"))

    @checks(LifecycleRule.PARK_NOT_DRAIN)
    def no_decode_while_parked(self) -> None:
        """Park, don't drain: no decode step of your engine (its ``decode_probe``, counted by cause: rollout,
        validation, server, its own loop) while the lifecycle holds it suspended, each charged where it ran; and
        the engine holds its requests as the state declares (parked in a handoff, none left parked after a
        resume)."""
        lc = self.lc
        if lc is None:
            return
        self.effects.ledger.settle(lc.state.value, len(self.log))
        self._assert_silent(self.effects.ledger.violations)
        if lc.state is S.FAILED:
            return
        decl = lc.spec.state(lc.state)
        if self.ad is not None and self.ad.request_probe is not None:
            counts = self.ad.request_probe()
            running, parked = int(getattr(counts, "running", 0)), int(getattr(counts, "parked", 0))
            if decl.requests is RequestCondition.PARKED:
                assert running == 0, f"in {lc.state.value}: {running} request(s) running, the spec declares parked"
            elif decl.requests is RequestCondition.RUNNING:
                assert parked == 0, f"in {lc.state.value}: {parked} request(s) still parked after the resume"

    @checks(LifecycleRule.STEP_ORDER_IS_DATA)
    def adapter_conditions_match_spec(self) -> None:
        """The adapters' real conditions are the ones the current state declares (Failed: documented below)."""
        lc = self.lc
        if lc is None or lc.state is S.FAILED:
            return
        decl = lc.spec.state(lc.state)
        real_engine, real_collector = self._probe()
        engine_ok = {decl.engine}
        if decl.engine is E.TORN_DOWN and self.log.count("engine", "bring_up") == 0:
            engine_ok.add(E.ABSENT)  # stopped before anything was built
        tracked = self.conditions
        problems = []
        if tracked.engine not in engine_ok:
            problems.append(f"engine {tracked.engine.value} (declared {decl.engine.value})")
        if real_engine is not None and real_engine not in {c.value for c in engine_ok}:
            problems.append(f"engine reports {real_engine} (declared {decl.engine.value})")
        if lc.engine_condition is not decl.engine:
            problems.append(f"machine believes engine {lc.engine_condition.value} (declared {decl.engine.value})")
        if self.collector is not None:
            if tracked.collector is not decl.collector:
                problems.append(f"collector {tracked.collector.value} (declared {decl.collector.value})")
            if real_collector is not None and real_collector != decl.collector.value:
                problems.append(f"collector reports {real_collector} (declared {decl.collector.value})")
        assert not problems, f"in {lc.state.value}: " + "; ".join(problems)

    def failure_leaves_documented_condition(self) -> None:
        """After a failure: engine not awake and collector paused (best-effort local quiesce, no barrier)."""
        lc = self.lc
        if lc is None or lc.state is not S.FAILED:
            return
        assert lc.failure is not None, "Failed without a recorded failure"
        if lc.engine_condition is not E.UNKNOWN:
            assert self.conditions.engine is not E.AWAKE, "Failed with the engine still awake"
        if lc.collector_condition is not C.UNKNOWN and self.collector is not None:
            assert self.conditions.collector is not C.RUNNING, "Failed with the collector still running"
        assert self.faults.fired, "Failed although no fault was injected"

    @checks(LifecycleRule.DECIDE_ONCE)
    def save_decision_reused(self) -> None:
        """A second site asking the latched checkpoint decision gets the same answer."""
        lc = self.lc
        if lc is None or not self.steps:
            return
        rec = self.steps[-1]
        again = lc.checkpoint_decision.decide(rec.step)
        assert again == rec.save, (
            f"step {rec.step}: the checkpoint decision latched save={rec.save}, a second "
            f"query now says {again} (decide once, reuse everywhere)"
        )

    @checks(LifecycleRule.WEIGHT_VERSIONS)
    def weight_version_once_per_step(self) -> None:
        """Each trained step bumps the weight version exactly once."""
        lc = self.lc
        if lc is None:
            return
        trained = self.log.count("trainer", "train_step")
        assert lc.weight_version == self.cfg.start_weight_version + trained, (
            f"weight version {lc.weight_version} after {trained} training steps from {self.cfg.start_weight_version}"
        )

    @checks(LifecycleRule.WEIGHT_VERSIONS)
    def trajectories_accounted(self) -> None:
        """No trajectory lost; none older than max_trajectory_age_steps trained on (stale ones counted)."""
        if self.lc is None:
            return
        b = self.buffer
        assert b.accounted, (
            f"trajectories lost: produced {b.produced}, trained {b.trained}, stale {b.stale}, waiting {len(b.waiting)}"
        )
        assert b.max_trained_age <= b.max_age_steps, f"trained on a trajectory {b.max_trained_age} versions old"

    @checks(LifecycleRule.BOUNDED_INFLIGHT)
    def in_flight_within_actor_capacity(self) -> None:
        """In-flight groups within the age bound and the actor's capacity, headroom kept for control."""
        if self.lc is None:
            return
        cfg, n = self.cfg, len(self.in_flight)
        calls = n * cfg.samples_per_group
        assert n <= cfg.num_prompts_per_step * cfg.max_trajectory_age_steps, (
            f"{n} groups in flight exceed the age bound"
        )
        assert calls <= cfg.actor_max_concurrency - cfg.control_headroom, (
            f"{n} groups x {cfg.samples_per_group} samples = {calls} calls in flight on an actor running "
            f"{cfg.actor_max_concurrency} at once with {cfg.control_headroom} kept for control: lifecycle control "
            f"calls would queue behind rollouts (cap {self.cap.explain()})"
        )

    @checks(LifecycleRule.PARK_NOT_DRAIN)
    def requests_served_only_while_awake(self) -> None:
        """No request is decoded while the engine is suspended; a waiting request is served once it is awake."""
        if self.lc is None:
            return
        bad = [r for r in self.server.served if not r.engine_awake]
        assert not bad, f"requests served while the engine was suspended: {bad[:3]}"
        if self.conditions.engine is E.AWAKE:
            assert not self.server.pending, "requests left waiting while the engine is awake"

    def trace_consistent(self) -> None:
        """Trace records chain source->dest, follow declared transitions, and carry rank and versions."""
        lc = self.lc
        if lc is None:
            return
        records = lc.trace.records
        spec = lc.spec
        edges = {(t.trigger, t.source.value, t.dest.value) for t in spec.transitions}
        prev_dest = records[self.trace_pos - 1].dest if self.trace_pos else spec.initial.value
        prev_seq = records[self.trace_pos - 1].seq if self.trace_pos else 0
        prev_wv = records[self.trace_pos - 1].weight_version if self.trace_pos else self.cfg.start_weight_version
        for r in records[self.trace_pos :]:
            where = f"trace record {r.seq} ({r.source} -[{r.trigger}]-> {r.dest})"
            assert r.seq == prev_seq + 1, f"{where}: seq after {prev_seq}"
            assert r.source == prev_dest, f"{where}: source is not the previous record's destination {prev_dest}"
            assert r.rank == lc.rank, f"{where}: rank {r.rank}"
            assert r.t_start <= r.t_enter <= r.t_end, f"{where}: times out of order"
            assert r.weight_version >= prev_wv, f"{where}: weight version went back"
            if r.trigger == spec.fail_trigger:
                assert r.dest == spec.failed.value and not r.ok and r.error, f"{where}: a failure record"
            else:
                assert (r.trigger, r.source, r.dest) in edges, f"{where}: not a declared transition"
                assert r.ok or r.error, f"{where}: failed without an error"
            prev_dest, prev_seq, prev_wv = r.dest, r.seq, r.weight_version
        self.trace_pos = len(records)
        if records:
            assert records[-1].dest == lc.state.value, (
                f"last trace record ends in {records[-1].dest}, machine in {lc.state.value}"
            )

    def never_stuck(self) -> None:
        """The machine rests only where a user trigger can move it on (or at a terminal state / Failed)."""
        lc = self.lc
        if lc is None:
            return
        state = lc.state
        auto = [t for t in lc.spec.outgoing(state) if t.automatic and t.enabled(lc.facts)]
        assert not auto, f"resting in {state.value} with automatic transition(s) enabled: {auto}"
        if state is S.FAILED or lc.spec.state(state).terminal:
            return
        movable = [t for t in lc.spec.outgoing(state) if not t.automatic and t.enabled(lc.facts)]
        assert movable, f"stuck in {state.value}: no transition can leave it (facts {lc.status().facts})"

    def rule_checks(self) -> list[Callable[[], None]]:
        """Every check, in the order they run after each step."""
        return [
            self.build_once,
            self.server_urls_published,
            self.teardown_only_at_stop,
            self.drain_own_device_then_barrier,
            self.engine_silent_during_training,
            self.engine_silent_while_suspended,
            self.no_decode_during_training,
            self.checkpoint_suspends_everything,
            self.last_step_never_wakes,
            self.validation_runs_awake_collector_paused,
            self.no_decode_while_parked,
            self.adapter_conditions_match_spec,
            self.failure_leaves_documented_condition,
            self.save_decision_reused,
            self.weight_version_once_per_step,
            self.trajectories_accounted,
            self.in_flight_within_actor_capacity,
            self.requests_served_only_while_awake,
            self.trace_consistent,
            self.never_stuck,
        ]

    @invariant()
    def lifecycle_rules(self) -> None:
        """Every lifecycle rule after every step (the first check that fails raises, tagged with its rule)."""
        for check in self.rule_checks():
            check()


__all__ = ["LifecycleInvariants"]
