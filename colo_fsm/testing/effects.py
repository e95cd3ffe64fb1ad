"""What the engine *does*, time-stamped against what the lifecycle holds it in (never what the engine says).

An engine's report of its condition (``condition``, ``engine_state()``, a probe, its request counts) is what it
*says*. This module watches what it *does*, through a channel a lying engine cannot fake: the tokens and
completions of requests the kit itself submits, and the decode steps counted while each activity of the kit runs.
Everything lands in the program's :class:`~colo_fsm.testing.watch.EventLog`, one total order with the
lifecycle's own calls, so each token is stamped against what the lifecycle did at that moment:

* :class:`Windows`: what the lifecycle holds the engine in, read from its own calls as the proxies journal them.
  It holds the engine *suspended* from the return of its ``suspend()`` to its next ``resume()`` call, *torn
  down* from the return of ``shutdown()``, and a *training step* runs from the call of ``train_step()`` to its
  return. No token may arrive in either.
* :class:`DecodeLedger`: the engine's decode-step count, charged by cause (:class:`Cause`: rollout, validation,
  server, or the engine's own loop) to the window it moved in, at every event and every activity boundary, so
  a validator's decode step is charged to Validating, where it ran, never to the state a step ends in.
* :class:`KitRequests`: the kit's own requests to your engine: ``submit(prompt_ids, max_tokens=...,
  on_token=...)`` when your engine takes an ``on_token`` callback (each token is stamped as it arrives), else
  ``generate(prompts, max_tokens=...)`` on a thread of the kit (a completion whose request was submitted while
  the engine was held suspended, and returned with tokens before the lifecycle resumed it, was decoded while
  suspended).
"""

from __future__ import annotations

import contextlib
import inspect
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from colo_fsm.states.spec import EngineCondition
from colo_fsm.testing.watch import Event, EventLog

E = EngineCondition


class Cause(StrEnum):
    """Why the engine decoded: who asked for the work."""

    ROLLOUT = "rollout"  # your collector's rollouts, and your engine's loop serving them (the kit's decode ticks)
    VALIDATION = "validation"  # inside a validator call
    SERVER = "server"  # a request the kit submits as an external client (an agent, a gym) would
    ENGINE = "engine"  # none of the kit's: the engine's own loop, or inside one of the lifecycle's calls


_CAUSES = frozenset(c.value for c in Cause)

SILENT = frozenset({E.SUSPENDED, E.TORN_DOWN})
"""What the lifecycle may hold the engine in while no token may arrive."""


@dataclass
class Window:
    """What the lifecycle holds the engine in at one moment: ``held`` since ``since`` (the event of the call
    that began it), ``hold`` its number; ``training``: the ``train_step`` call event while a step trains."""

    held: EngineCondition
    hold: int = 0
    since: Event | None = None
    training: Event | None = None
    train: int = 0

    @property
    def silent(self) -> bool:
        """No token may arrive now (suspended, torn down, or a training step running)."""
        return self.held in SILENT or self.training is not None


class Windows:
    """Tracks :class:`Window` from the lifecycle's calls as the proxies journal them (a listener of the log)."""

    _HOLDS = {
        ("engine.bring_up", "ok"): E.AWAKE,
        ("engine.resume", "call"): E.AWAKE,  # from the call: the engine may decode as soon as it wakes
        ("engine.suspend", "ok"): E.SUSPENDED,  # from the return: a suspend may finish the step in flight
        ("engine.shutdown", "ok"): E.TORN_DOWN,
    }

    def __init__(self, initial: EngineCondition) -> None:
        self.now = Window(initial)

    def see(self, ev: Event) -> None:
        """Move the window on one event of the lifecycle's calls."""
        held = self._HOLDS.get((ev.name, ev.phase))
        now = self.now
        if held is not None and not (held is E.SUSPENDED and now.held is E.TORN_DOWN) and held is not now.held:
            self.now = Window(held, now.hold + 1, ev, now.training, now.train)
        elif ev.name == "trainer.train_step":
            if ev.phase == "call":
                self.now = Window(now.held, now.hold, now.since, ev, now.train + 1)
            else:
                self.now = Window(now.held, now.hold, now.since, None, now.train)


@dataclass(frozen=True)
class EffectViolation:
    """One thing the engine did in a window where it must be silent, as a bug report reads it."""

    kind: str  # "during_training" or "while_suspended"
    text: str
    at: int  # the event index where it showed
    since: int | None  # the event that opened the window (the suspend's return, the train_step call)


def describe(window: Window, doing: str, state: str, names: dict[str, str]) -> tuple[str, str, int | None]:
    """(kind, the bug report's sentence, where the window opened) for something the engine did (``doing``) in a
    silent ``window``: what the lifecycle held it in and since which call, then what it did anyway."""
    lead = ""
    since = window.since.index if window.since is not None else None
    if window.held is E.SUSPENDED:
        lead = f"{names['suspend']}() returned at event {since} (the lifecycle holds the engine suspended), yet "
    elif window.held is E.TORN_DOWN:
        lead = f"{names['shutdown']}() returned at event {since} (the lifecycle tore the engine down), yet "
    if window.training is not None:
        where = f"during {names['train_step']} (event {window.training.index})"
        return "during_training", f"{lead}{doing} {where}", window.training.index
    return "while_suspended", f"{lead}{doing} in {state}, before the lifecycle resumed it", since


class DecodeLedger:
    """Your engine's decode steps (``decode_probe``), charged by :class:`Cause` to the window they ran in.

    Read at every event of the log (before the event moves the window) and at every activity boundary of the
    kit, so each step is charged where it ran. A step charged while the lifecycle holds the engine suspended or
    torn down is a violation (:attr:`violations`), whatever its cause.
    """

    def __init__(self, probe: Callable[[], int] | None, windows: Windows, names: dict[str, str]) -> None:
        self._probe = probe
        self._windows = windows
        self._names = names
        self._seen = int(probe()) if probe is not None else 0
        self.cause = Cause.ENGINE
        self.by_cause: dict[tuple[Cause, str], int] = {}
        self.violations: list[EffectViolation] = []
        self._lock = threading.Lock()

    def settle(self, state: str, at: int) -> None:
        """Charge the decode steps since the last reading to the current cause and window (in ``state``)."""
        if self._probe is None:
            return
        with self._lock:
            now = int(self._probe())
            delta, self._seen = now - self._seen, now
        if delta <= 0:
            return
        key = (self.cause, state)
        self.by_cause[key] = self.by_cause.get(key, 0) + delta
        window = self._windows.now
        if window.held in SILENT:
            doing = f"{self._names['engine']} ran {delta} decode step(s) ({self.cause.value})"
            kind, text, since = describe(window, doing, state, self._names)
            self.violations.append(EffectViolation(kind, text, at, since))

    def see(self, ev: Event) -> None:
        """A listener of the log: settle before ``ev`` moves the window."""
        self.settle(ev.state, ev.index)


@dataclass
class KitRequest:
    """One request the kit submitted to your engine."""

    number: int
    cause: Cause
    submitted: Event
    window: Window  # what the lifecycle held the engine in when it was submitted
    t_submit: float
    tokens: int = 0
    done: bool = False
    thread: threading.Thread | None = None


@dataclass
class _Channel:
    kind: str  # "submit" (on_token) or "generate"
    call: Callable[..., Any]
    source: str  # YourEngine.method that delivers tokens


def request_channel(engine: Any) -> _Channel | None:
    """How the kit sends requests to ``engine``: ``submit`` with an ``on_token`` callback, else ``generate``
    (the TextGenerator protocol); None when it has neither (or only ``async def`` ones)."""
    name = type(engine).__name__
    submit = getattr(engine, "submit", None)
    if callable(submit) and not inspect.iscoroutinefunction(submit) and _takes(submit, "on_token"):
        return _Channel("submit", submit, f"{name}.submit")
    generate = getattr(engine, "generate", None)
    if callable(generate) and not inspect.iscoroutinefunction(generate) and _takes(generate, "max_tokens"):
        return _Channel("generate", generate, f"{name}.generate")
    return None


def is_parked(thread: threading.Thread | None) -> bool:
    """Whether ``thread`` is blocked in a ``threading`` wait (a Condition, Event, Queue or Future wait): how a
    request parked in a suspended engine looks from outside."""
    if thread is None or thread.ident is None:
        return False
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__


THREAD_PREFIX = "colo-fsm-kit-request-"


def _live_request_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX))


def _takes(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in params)


class KitRequests:
    """The kit's requests to your engine, and what it delivered for each, stamped against the :class:`Windows`.

    A token (``on_token``) arriving while the window is silent is a violation; so is a completion with tokens
    (``generate``) whose request was submitted in a silent window and returned before that window closed (the
    same hold of the engine, or the same training step). ``tick`` lets a step-driven engine's loop run one step
    (your ``decode_step``); an engine with a loop of its own gets ``settle(wait_s)``: up to ``wait_s`` for it to
    make progress on an outstanding request (a parked request makes none, so a correct engine costs the wait).
    """

    MAX_THREADS = 64
    """Threads of the kit's ``generate`` requests alive at once, in the whole process, beyond which the kit sends
    no more (requests of engines whose shutdown does not release them stay parked for good)."""

    def __init__(
        self,
        log: EventLog,
        windows: Windows,
        engine: Any,
        *,
        names: dict[str, str],
        tick: Callable[[], Any] | None = None,
    ) -> None:
        self._log = log
        self._windows = windows
        self._engine = engine
        self._names = names
        self._tick = tick
        self.channel = request_channel(engine)
        self.requests: list[KitRequest] = []
        self.violations: list[EffectViolation] = []
        self._progress = threading.Condition()
        self._progressed = 0
        self._awake_latency: list[float] = []
        self._delivering = threading.local()
        self._windows_at: dict[int, Window] = {}  # event index -> the window when it was appended (exact)
        self.waits = 0  # settle() calls that waited, and how long in all (for the kit's counts)
        self.waited_s = 0.0
        log.listen(self.see)

    def see(self, ev: Event) -> None:
        """A listener of the log: remember the window each event of a kit request was appended in."""
        if ev.component in _CAUSES:
            self._windows_at[ev.index] = self._windows.now

    @property
    def available(self) -> bool:
        """Whether the kit can send requests to this engine."""
        return self.channel is not None and _live_request_threads() < self.MAX_THREADS

    @property
    def step_driven(self) -> bool:
        """Whether the engine decodes only when its ``decode_step`` is called (no loop of its own)."""
        return self._tick is not None and self.channel is not None and self.channel.kind == "submit"

    def wait_s(self) -> float:
        """How long the kit waits at most for your engine to serve (or park) its requests: for ``generate``,
        0.2 s (a parking engine ends the wait at once); for an engine with a loop of its own, 10x the median time
        it took to serve a request while awake (at least 2 ms, at most 50 ms; 20 ms before one was served)."""
        if self.channel is not None and self.channel.kind == "generate":
            return 0.2
        if not self._awake_latency:
            return 0.02
        return min(0.05, max(0.002, 10 * statistics.median(self._awake_latency[-32:])))

    # ------------------------------------------------------------------ sending
    def send(self, cause: Cause, max_tokens: int) -> KitRequest | None:
        """Submit one request, if the lifecycle holds the engine built (awake or suspended)."""
        window = self._windows.now
        if self.channel is None or window.held not in (E.AWAKE, E.SUSPENDED) or not self.available:
            return None
        number = len(self.requests)
        ev = self._log.add(cause.value, "submit", "call", f"request {number}", probe=False)
        req = KitRequest(number, cause, ev, self._windows_at.pop(ev.index), time.perf_counter())
        self.requests.append(req)
        if self.channel.kind == "submit":
            try:
                self.channel.call([1, 2, 3], max_tokens=max_tokens, on_token=self._on_token(req))
            except Exception as exc:
                err = self._log.add(cause.value, "submit", "error", f"request {number}: {exc!r}", probe=False)
                self._windows_at.pop(err.index, None)
                req.done = True
        else:
            req.thread = threading.Thread(
                target=self._generate, args=(req, max_tokens), name=f"{THREAD_PREFIX}{number}", daemon=True
            )
            req.thread.start()
        return req

    @contextlib.contextmanager
    def delivering(self, source: str) -> Iterator[None]:
        """Tokens delivered on this thread inside the block are named as delivered by ``source`` (the call of
        yours the kit is in: ``YourEngine.decode_step``, ``YourCollector.start_rollout``, ...)."""
        previous = getattr(self._delivering, "source", None)
        self._delivering.source = previous or source
        try:
            yield
        finally:
            self._delivering.source = previous

    def tick(self) -> None:
        """One step of a step-driven engine's loop (your ``decode_step``): the tokens it delivers are its."""
        if self._tick is None:
            return
        with self.delivering(self._names["decode_step"]):
            self._tick()

    def settle(self, wait_s: float) -> None:
        """Let your engine serve the kit's outstanding requests before the kit moves on.

        A ``generate`` request runs on a thread of the kit: wait until each has returned or parked (its thread
        blocks in a ``threading`` wait, as a parking engine's does; a correct engine parks at once, so this costs
        microseconds) or ``wait_s`` passed. An engine with a loop of its own (``on_token``): up to ``wait_s`` for
        it to deliver something.
        """
        pending = [r for r in self.requests if not r.done]
        if not pending or self.channel is None:
            return
        t0 = time.perf_counter()
        if self.channel.kind == "generate":
            deadline = t0 + wait_s
            while not all(r.done or is_parked(r.thread) for r in pending) and time.perf_counter() < deadline:
                time.sleep(0.0002)
        else:
            with self._progress:
                before = self._progressed
                self._progress.wait_for(lambda: self._progressed > before, timeout=wait_s)
        self.waits += 1
        self.waited_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ delivery
    def _on_token(self, req: KitRequest) -> Callable[..., None]:
        def on_token(*_args: Any) -> None:
            source = getattr(self._delivering, "source", None) or f"{self._names['engine']} (its own loop)"
            first = req.tokens == 0
            window = self._delivered(req, "token", 1, source)
            if first and req.window.held is E.AWAKE and window.hold == req.window.hold:
                self._awake_latency.append(time.perf_counter() - req.t_submit)

        return on_token

    def _generate(self, req: KitRequest, max_tokens: int) -> None:
        assert self.channel is not None
        try:
            out = self.channel.call([f"colo-fsm kit request {req.number}: "], max_tokens=max_tokens)
            tokens = sum(len(getattr(c, "token_ids", ()) or ()) for c in out or ())
        except Exception as exc:  # e.g. a parked request ended by shutdown: nothing was produced
            ev = self._log.add(req.cause.value, "completion", "error", f"request {req.number}: {exc!r}", probe=False)
            self._windows_at.pop(ev.index, None)
            req.done = True
            self._notify()
            return
        latency = time.perf_counter() - req.t_submit
        window = self._delivered(req, "completion", tokens, self.channel.source)
        if req.window.held is E.AWAKE and window.hold == req.window.hold:  # served without a handoff between
            self._awake_latency.append(latency)

    def _delivered(self, req: KitRequest, what: str, tokens: int, source: str) -> Window:
        ev = self._log.add(req.cause.value, what, "ok", f"request {req.number}, {source}", probe=False)
        window = self._windows_at.pop(ev.index)
        req.tokens += tokens
        if what == "completion":
            req.done = True
        if tokens and self._produced_while_silent(req, what, window):
            if what == "token":
                doing = f"{source} delivered a token to a {req.cause.value} request (event {ev.index})"
                kind, text, since = describe(window, doing, ev.state, self._names)
            else:
                doing = (
                    f"{source} returned {tokens} token(s) (event {ev.index}) for a {req.cause.value} request "
                    f"submitted at event {req.submitted.index}"
                )
                kind, text, since = describe(req.window, doing, req.submitted.state, self._names)
            self.violations.append(EffectViolation(kind, text, ev.index, since))
        self._notify()
        return window

    @staticmethod
    def _produced_while_silent(req: KitRequest, what: str, window: Window) -> bool:
        if what == "token":  # stamped as it arrived
            return window.silent
        sub = req.window  # a completion: only certain if the whole request lay inside one silent window
        if sub.training is not None and window.training is not None and sub.train == window.train:
            return True
        return sub.held in SILENT and window.hold == sub.hold

    def _notify(self) -> None:
        with self._progress:
            self._progressed += 1
            self._progress.notify_all()

    # ------------------------------------------------------------------ the end of a program
    def close(self, shutdown: Callable[[], Any] | None) -> int:
        """End a program: requests still parked in a ``generate`` are released by ``shutdown`` (your engine's,
        when the lifecycle did not tear it down; their threads end on their own, nobody waits for them). Returns
        how many were parked."""
        parked = [r for r in self.requests if r.thread is not None and not r.done]
        if parked and shutdown is not None and self._windows.now.held is not E.TORN_DOWN:
            with contextlib.suppress(Exception):
                shutdown()
        return len(parked)


@dataclass
class Effects:
    """The effect check of one program: windows, decode ledger and kit requests over one event log."""

    windows: Windows
    ledger: DecodeLedger
    requests: KitRequests
    names: dict[str, str] = field(default_factory=dict)

    @classmethod
    def watch(
        cls,
        log: EventLog,
        initial: EngineCondition,
        engine: Any,
        *,
        names: dict[str, str],
        decode_probe: Callable[[], int] | None = None,
        tick: Callable[[], Any] | None = None,
    ) -> Effects:
        """Start watching ``engine`` on ``log`` (from the spec's ``initial`` engine condition)."""
        windows = Windows(initial)
        ledger = DecodeLedger(decode_probe, windows, names)
        log.listen(ledger.see)  # before the window moves: the steps since the last event ran in the old one
        log.listen(windows.see)
        return cls(windows, ledger, KitRequests(log, windows, engine, names=names, tick=tick), names)

    @contextlib.contextmanager
    def activity(self, cause: Cause, state: Callable[[], str], at: Callable[[], int]) -> Iterator[None]:
        """Charge the decode steps made inside this block to ``cause`` (those before it to the previous one)."""
        ledger = self.ledger
        ledger.settle(state(), at())
        previous, ledger.cause = ledger.cause, cause
        try:
            yield
        finally:
            ledger.settle(state(), at())
            ledger.cause = previous

    def violations(self, kind: str) -> list[EffectViolation]:
        """Tokens (``during_training``/``while_suspended``) the engine produced in a silent window."""
        return [v for v in self.requests.violations if v.kind == kind]


__all__ = [
    "SILENT",
    "Cause",
    "DecodeLedger",
    "EffectViolation",
    "Effects",
    "KitRequest",
    "KitRequests",
    "Window",
    "Windows",
    "describe",
    "is_parked",
    "request_channel",
]
