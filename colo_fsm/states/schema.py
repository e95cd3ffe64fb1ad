"""What a lifecycle is declared with: states, actions (with their effects) and transitions, and the ``stop``
every lifecycle derives from every state that lacks one.

:mod:`colo_fsm.states.spec` declares colo-fsm's own lifecycle with these types; a variant
(:mod:`colo_fsm.states.presets`) is a change to it, passed through :func:`with_stops` again. The words
(states, facts, roles, conditions) live in :mod:`colo_fsm.states.vocabulary`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from colo_fsm.states.vocabulary import (
    Collective,
    CollectorCondition,
    EngineCondition,
    Fact,
    RequestCondition,
    Role,
    State,
)


@dataclass(frozen=True)
class StateSpec:
    """One state and the conditions every adapter must be in while the machine is there."""

    state: State
    description: str
    engine: EngineCondition
    collector: CollectorCondition
    resting: bool = False  # the machine waits here for a user trigger
    terminal: bool = False
    final: bool = False  # the run is over here: no further training step can start
    requests: RequestCondition = RequestCondition.NONE  # what the engine does with the requests it holds
    serves_requests: bool = False  # the server admits new requests here
    validates: bool = False  # the validator runs here (a validation-only wake)
    ends_step: bool = False  # a training step that reaches this state is over

    @property
    def runs_rollouts(self) -> bool:
        """Whether the collector issues rollouts here."""
        return self.collector is CollectorCondition.RUNNING


@dataclass(frozen=True)
class ActionSpec:
    """An effect the machine can run, with its declared effects.

    ``role`` says what the runtime does; ``calls`` is the adapter call it makes (``(component, method)``);
    ``sets``/``clears`` are facts it makes True/False; ``decides`` are facts a latch evaluates once (True or
    False); ``upgrades`` are facts a latch sets True when its decision is True; ``issues`` names collective work
    the action puts on the device (which also clears ``handoff_complete``); ``engine``, ``collector`` and
    ``requests`` are the conditions after it.
    """

    name: str
    description: str
    issues: Collective | None = None
    engine: EngineCondition | None = None  # engine condition after the action
    collector: CollectorCondition | None = None  # collector condition after the action
    role: Role | None = None
    calls: tuple[str, str] | None = None
    sets: tuple[Fact, ...] = ()
    clears: tuple[Fact, ...] = ()
    decides: tuple[Fact, ...] = ()
    upgrades: tuple[Fact, ...] = ()
    requests: RequestCondition | None = None  # request condition after the action

    def cleared(self) -> tuple[Fact, ...]:
        """Every fact this action makes False: the declared ones, plus handoff_complete when it issues work."""
        extra = (Fact.HANDOFF_COMPLETE,) if self.issues is not None and Fact.HANDOFF_COMPLETE not in self.clears else ()
        return (*self.clears, *extra)

    def writes(self) -> tuple[Fact, ...]:
        """Every fact this action can make True."""
        return tuple(dict.fromkeys((*self.sets, *self.decides, *self.upgrades)))


@dataclass(frozen=True)
class TransitionSpec:
    """One edge of the lifecycle."""

    trigger: str
    source: State
    dest: State
    actions: tuple[str, ...] = ()
    when: tuple[Fact, ...] = ()
    unless: tuple[Fact, ...] = ()
    automatic: bool = False
    description: str = ""

    def enabled(self, facts: dict[Fact, bool] | dict[str, bool]) -> bool:
        """Whether this transition's guards hold for ``facts`` (missing facts read False)."""
        return all(facts.get(f, False) for f in self.when) and not any(facts.get(f, False) for f in self.unless)

    def guard_text(self) -> str:
        """Guards as a short expression, e.g. ``save_this_step and not last_step``."""
        parts = [str(f) for f in self.when] + [f"not {f}" for f in self.unless]
        return " and ".join(parts)


@dataclass(frozen=True)
class LifecycleSpec:
    """A complete lifecycle: states, actions and transitions. Use :data:`LIFECYCLE`, or derive variants."""

    states: tuple[StateSpec, ...]
    actions: tuple[ActionSpec, ...]
    transitions: tuple[TransitionSpec, ...]
    initial: State = State.CREATED
    failed: State = State.FAILED
    fail_trigger: str = "fail"  # fired by the machine itself when an action raises, from any failable state
    validate_before_save: bool = False  # a step that validates and saves validates first (metrics go into the save)
    name: str = "lifecycle"
    _by_state: dict[State, StateSpec] = field(init=False, repr=False, compare=False)
    _by_action: dict[str, ActionSpec] = field(init=False, repr=False, compare=False)
    _outgoing: dict[State, tuple[TransitionSpec, ...]] = field(init=False, repr=False, compare=False)
    _triggers: dict[State, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_state", {s.state: s for s in self.states})
        object.__setattr__(self, "_by_action", {a.name: a for a in self.actions})
        outgoing = {s: tuple(t for t in self.transitions if t.source == s) for s in State}
        object.__setattr__(self, "_outgoing", outgoing)
        object.__setattr__(
            self, "_triggers", {s: tuple(dict.fromkeys(t.trigger for t in ts)) for s, ts in outgoing.items()}
        )

    def state(self, state: State | str) -> StateSpec:
        """The spec of one state."""
        return self._by_state[State(state)]

    def action(self, name: str) -> ActionSpec:
        """The spec of one action."""
        return self._by_action[name]

    def outgoing(self, state: State | str) -> tuple[TransitionSpec, ...]:
        """Transitions leaving ``state``, in declaration order."""
        return self._outgoing[State(state)]

    def triggers(self, state: State | str | None = None) -> tuple[str, ...]:
        """Trigger names (of one state, or of the whole machine), each once, in declaration order."""
        if state is not None:
            return self._triggers[State(state)]
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def user_triggers(self) -> tuple[str, ...]:
        """Triggers the training loop fires (every non-automatic one)."""
        return tuple(dict.fromkeys(t.trigger for t in self.transitions if not t.automatic))

    def select(self, state: State | str, trigger: str, facts: dict[Fact, bool]) -> TransitionSpec | None:
        """The transition ``trigger`` takes from ``state`` under ``facts``, or None if no guard holds."""
        for t in self.outgoing(state):
            if t.trigger == trigger and t.enabled(facts):
                return t
        return None

    def failable(self) -> tuple[State, ...]:
        """States an action failure can leave: every state but the terminal ones and Failed itself."""
        return tuple(s.state for s in self.states if not s.terminal and s.state != self.failed)

    def __iter__(self) -> Iterator[TransitionSpec]:
        return iter(self.transitions)

    def adapter_calls(self) -> dict[tuple[str, str], str]:
        """Which action each adapter call implements, read from the actions' declared ``calls``."""
        return {a.calls: a.name for a in self.actions if a.calls is not None}

    def with_role(self, *roles: Role) -> tuple[str, ...]:
        """Names of the actions whose role is one of ``roles``."""
        return tuple(a.name for a in self.actions if a.role in roles)

    def guard_facts(self) -> tuple[Fact, ...]:
        """Every fact some guard reads."""
        return tuple(dict.fromkeys(f for t in self.transitions for f in (*t.when, *t.unless)))

    def writers(self, fact: Fact) -> tuple[str, ...]:
        """Actions that can make ``fact`` True."""
        return tuple(a.name for a in self.actions if fact in a.writes())

    @property
    def engine_up_at_construction(self) -> bool:
        """Whether the initial state declares the engine awake: its adapter built it (and its server) in its
        constructor, and ``start`` adopts it instead of building it (see ``presets.engine_at_construction``)."""
        return self.state(self.initial).engine is EngineCondition.AWAKE

    def reset_facts(self) -> tuple[Fact, ...]:
        """Every fact some action clears."""
        return tuple(dict.fromkeys(f for a in self.actions for f in a.cleared()))


# ---------------------------------------------------------------------------------------------- stop from anywhere
STOP_TRIGGER = "stop"
"""The trigger that ends a run from any state (:func:`with_stops` derives one for every state that lacks it)."""

STEP_WORK: tuple[Role, ...] = (
    Role.LATCH,
    Role.RESTORE,
    Role.TRAIN,
    Role.BUMP,
    Role.SAVE,
    Role.RESUME,
    Role.RESUME_COLLECTOR,
)
"""The roles of a step's own work: a stop runs none of them (it abandons the step in progress; an async save
already started is finalized, not started)."""


def _entry(spec: LifecycleSpec) -> dict[State, tuple[bool, bool]]:
    """For each state a run reaches (guards ignored, stops left out): whether every way in leaves the handoff
    complete (own device drained, every rank met, nothing issued since) and whether some way in leaves an async
    save pending."""
    status: dict[State, tuple[bool, bool]] = {spec.initial: (True, False)}
    changed = True
    while changed:
        changed = False
        for t in spec.transitions:
            if t.trigger == STOP_TRIGGER or t.source not in status:
                continue
            handed, pending = status[t.source]
            drained = handed
            for name in t.actions:
                a = spec.action(name)
                if a.issues is not None:
                    handed = drained = False
                if a.role is Role.DRAIN:
                    drained = True
                elif a.role is Role.BARRIER:
                    handed = handed or drained
                pending = (pending or Fact.SAVE_PENDING in a.writes()) and Fact.SAVE_PENDING not in a.cleared()
            old = status.get(t.dest)
            new = (handed, pending) if old is None else (old[0] and handed, old[1] or pending)
            if new != old:
                status[t.dest] = new
                changed = True
    return status


def stop_transitions(spec: LifecycleSpec) -> tuple[TransitionSpec, ...]:
    """A ``stop`` into the terminal state from every non-terminal state of ``spec`` that has none, derived from
    the state's declared conditions and what the spec's own transitions leave on the device when they enter it:

    * the collector paused if it runs there, the engine suspended (requests parked) if it is awake;
    * an async save that may still be pending there finalized (every checkpoint collective done);
    * this rank's device drained and every rank met at the barrier, unless the state is always entered with the
      handoff complete and no traffic is served there: no rank tears down while a peer still decodes, and a stop
      that right follows a handoff meets no barrier (it would pair with a peer's next handoff barrier);
    * the collector takes back the batch and the prompts in flight (:attr:`Role.RETURN_PROMPTS`);
    * the engine torn down.

    From the failed state: no drain and no barrier (a peer may be dead); with the engine not built: the teardown
    only. No stop trains, saves or wakes anything: the step in progress is abandoned.
    """
    terminal = next((s.state for s in spec.states if s.terminal), None)
    first = {r: spec.with_role(r)[0] for r in Role if spec.with_role(r)}
    if terminal is None or Role.TEARDOWN not in first:
        return ()
    entry = _entry(spec)
    has_stop = {t.source for t in spec.transitions if t.trigger == STOP_TRIGGER}
    trains = {t.source for t in spec.transitions if any(spec.action(a).role is Role.TRAIN for a in t.actions)}
    out: list[TransitionSpec] = []
    for s in spec.states:
        if s.terminal or s.state in has_stop or (s.state not in entry and s.state != spec.failed):
            continue
        handed, pending = entry.get(s.state, (True, False))
        roles: list[Role] = []
        built = s.engine not in (EngineCondition.ABSENT, EngineCondition.TORN_DOWN)
        if s.engine is not EngineCondition.UNKNOWN and built:
            if s.runs_rollouts:
                roles.append(Role.PAUSE)
            if s.engine is EngineCondition.AWAKE:
                roles.append(Role.SUSPEND)
            if pending:
                roles.append(Role.FINALIZE)
            if pending or not handed or s.serves_requests or s.validates or s.runs_rollouts:
                roles += [Role.DRAIN, Role.BARRIER]
        if built:
            roles.append(Role.RETURN_PROMPTS)
        roles.append(Role.TEARDOWN)
        if s.engine is EngineCondition.UNKNOWN:
            why = "Local teardown after a failure (no barrier: a peer may be dead)"
        elif not built:
            why = "Stop before anything was built (nothing to tear down)"
        elif s.final:
            why = "Tear down after the last step"
        elif s.state in trains:
            why = "Stop before training: the step in progress is abandoned, not trained"
        elif s.ends_step:
            why = "Stop the run"
        else:
            why = "Stop where a step or the start is under way: nothing further is trained, saved or woken"
        if pending:
            why += "; the async save is finalized first"
        if built:
            why += "; the batch and the prompts in flight go back to the collector"
        out.append(
            TransitionSpec(
                STOP_TRIGGER,
                s.state,
                terminal,
                tuple(first[r] for r in roles if r in first),
                description=why + ".",
            )
        )
    return tuple(out)


def with_stops(spec: LifecycleSpec) -> LifecycleSpec:
    """``spec`` with a derived ``stop`` (:func:`stop_transitions`) from every non-terminal state that has none:
    a loop can end the run cleanly from any state. Every preset is built with it; a variant derived from one keeps
    its stops, and one that adds a state gets its stop by passing through here again."""
    extra = stop_transitions(spec)
    if not extra:
        return spec
    return dataclasses.replace(spec, transitions=(*spec.transitions, *extra))
