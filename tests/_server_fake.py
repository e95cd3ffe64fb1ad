"""A tiny request-level engine implementing the engine contract (submit / suspend parks / resume), for the
server's unit tests only: a token-step loop over every active request on its own thread, deterministic tokens
(the prompt reversed, then end-of-document), suspend and resume that can take real time. ``hold_at`` stops the loop
once at a chosen token, so a test can order a suspend against a running request instead of timing it."""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.errors import LifecycleError


@dataclass(frozen=True)
class FakeCompletion:
    request_id: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    text: str
    finish_reason: str

    @property
    def weight_version(self) -> int:
        return min(self.weight_versions) if self.weight_versions else 0


class FakeHandle:
    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.future: concurrent.futures.Future[FakeCompletion] = concurrent.futures.Future()
        self.cancel_requested = False

    def cancel(self) -> bool:
        self.cancel_requested = True
        return True

    def done(self) -> bool:
        return self.future.done()


@dataclass
class _Req:
    handle: FakeHandle
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int | None
    stop_ids: tuple[int, ...]
    priority: int
    on_token: Callable[[int, float, int], bool | None] | None
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)


HOLD_BOUND_S = 60.0  # a hold never released (a test that failed before releasing it) lets the loop go after this


@dataclass
class Hold:
    """A one-shot stop of the step loop (:meth:`FakeEngine.hold_at`): ``reached`` is set when the loop stops,
    setting ``release`` lets it go on. As a context manager it sets ``release`` on the way out, so a test that fails
    while holding leaves no thread waiting on it (put it inside a thread pool's ``with``, which joins after)."""

    tokens: int
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()


class FakeEngine:
    """``submit`` while awake is what the server must do; ``asleep_submits`` counts violations."""

    reads_weights_in_place = True

    def __init__(
        self, *, step_s: float = 0.002, suspend_s: float = 0.0, resume_s: float = 0.0, max_sequence_length: int = 64
    ) -> None:
        self.tokenizer = CharTokenizer()
        self.max_sequence_length = max_sequence_length
        self.step_s = step_s
        self.suspend_s = suspend_s
        self.resume_s = resume_s
        self.awake = False
        self.version = 0
        self._cond = threading.Condition()
        self._active: list[_Req] = []
        self._next_id = 0
        self._stopped = False
        self.asleep_submits = 0
        self.submitted: list[tuple[int, int]] = []  # (request id, priority)
        self.generated: dict[int, tuple[list[int], list[float]]] = {}  # request id -> ids, logprobs
        self.tokens_while_asleep = 0
        self.cancelled: list[int] = []
        self.steps = 0
        self._hold: Hold | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fake-engine")
        self._thread.start()

    # GenerationEngine
    def bring_up(self) -> None:
        self.awake = True

    def suspend(self) -> None:
        with self._cond:  # waits for the current step: suspend at a step boundary
            self.awake = False
        time.sleep(self.suspend_s)

    def resume(self) -> None:
        time.sleep(self.resume_s)
        with self._cond:
            self.version += 1
            self.awake = True
            self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self.awake = False
            left, self._active = self._active, []
            self._cond.notify_all()
            if self._hold is not None:  # a test that failed before letting a held loop go
                self._hold.release.set()
        for r in left:
            self._finish(r, "abort")

    def server_base_urls(self) -> Sequence[str]:
        return []

    def request_counts(self) -> dict[str, int]:
        with self._cond:
            n = len(self._active)
        return {"queued": 0, "running": n if self.awake else 0, "parked": 0 if self.awake else n}

    def request_counts_nowait(self, priority: int | None = None) -> tuple[int, int, int]:
        """(queued, running, parked), of ``priority`` when given, read without the loop's lock."""
        active = [r for r in list(self._active) if priority is None or r.priority == int(priority)]
        n = len(active)
        return (0, n if self.awake else 0, 0 if self.awake else n)

    def hold_at(self, tokens: int) -> Hold:
        """Stop the step loop once, right after the step in which a request still in flight made its ``tokens``-th
        token, until the returned hold's ``release`` is set (its ``reached`` says the loop stopped). The loop waits
        outside its lock, so suspend(), resume(), submit() and shutdown() go through meanwhile; the held request
        cannot make another token, let alone finish, before the test lets it: an order, not a timing."""
        hold = Hold(tokens)
        with self._cond:
            self._hold = hold
        return hold

    # request level
    def submit(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        priority: int = 0,
        on_token: Callable[[int, float, int], bool | None] | None = None,
    ) -> FakeHandle:
        with self._cond:
            if self._stopped:
                raise LifecycleError("engine stopped")
            if not self.awake:
                self.asleep_submits += 1
            h = FakeHandle(self._next_id)
            self._next_id += 1
            r = _Req(
                h, tuple(prompt_ids), max_tokens, temperature, seed, tuple(stop_token_ids), int(priority), on_token
            )
            r.rng.seed(seed if seed is not None else h.request_id)
            self._active.append(r)
            self.submitted.append((h.request_id, int(priority)))
            self._cond.notify_all()
        return h

    def _next_token(self, r: _Req) -> int:
        pos = len(r.ids)
        if r.temperature > 0:
            return r.rng.randrange(3, self.tokenizer.vocab_size)
        body = [t for t in r.prompt if t != self.tokenizer.tokenize(">")[0]][::-1]
        return body[pos] if pos < len(body) else self.tokenizer.eod

    def _finish(self, r: _Req, reason: str) -> None:
        self.generated[r.handle.request_id] = (list(r.ids), list(r.lps))
        if r.handle.future.done():
            return
        r.handle.future.set_result(
            FakeCompletion(
                r.handle.request_id,
                r.prompt,
                tuple(r.ids),
                tuple(r.lps),
                tuple(r.vers),
                self.tokenizer.detokenize(r.ids),
                reason,
            )
        )

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not (self.awake and self._active):
                    self._cond.wait(0.05)
                if self._stopped:
                    return
                self.steps += 1
                done: list[tuple[_Req, str]] = []
                for r in sorted(self._active, key=lambda q: q.priority):
                    if r.handle.cancel_requested:
                        self.cancelled.append(r.handle.request_id)
                        done.append((r, "abort"))
                        continue
                    if not self.awake:
                        self.tokens_while_asleep += 1
                    t = self._next_token(r)
                    lp = -0.01 * (len(r.ids) + 1) - 0.001 * t
                    r.ids.append(t)
                    r.lps.append(lp)
                    r.vers.append(self.version)
                    keep = r.on_token(t, lp, self.version) if r.on_token is not None else None
                    if keep is False or t == self.tokenizer.eod or t in r.stop_ids:
                        done.append((r, "stop"))
                    elif len(r.ids) >= r.max_tokens:
                        done.append((r, "length"))
                for r, _ in done:
                    self._active.remove(r)
                hold = self._hold
                if hold is not None and (
                    hold.reached.is_set() or not any(len(r.ids) == hold.tokens for r in self._active)
                ):
                    hold = None
            for r, reason in done:
                self._finish(r, reason)
            if hold is not None:
                hold.reached.set()
                hold.release.wait(HOLD_BOUND_S)  # shutdown() and the hold's exit set it too
            time.sleep(self.step_s)


def serve_fake(engine: FakeEngine | None = None, **kw: Any) -> tuple[Any, FakeEngine]:
    """A GatedEngine serving a FakeEngine over HTTP, brought up (gate open)."""
    from colo_fsm.server import GatedEngine
    from colo_fsm.server.templates import digits_chat_template

    eng = engine or FakeEngine()
    kw.setdefault("chat_template", digits_chat_template)
    gated = GatedEngine(eng, eng, serve=True, **kw)
    gated.bring_up()
    return gated, eng
