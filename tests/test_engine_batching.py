"""Continuous batching on the real CPU megatron model: concurrent requests, park/drain handoffs, priority, cancel.

Every test drives :class:`~colo_fsm.adapters.megatron.engine.MegatronEngine` (its ContinuousBatcher over the
CPU step loop) on a tiny real GPT; assertions are on counts, orders and tokens, never on wall-clock figures.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.batching import Priority, TokenCompletion
from colo_fsm.adapters.megatron.engine import GenerationConfig, MegatronEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.errors import ConfigError, EngineStopped, RequestTooLarge
from tests.support.waits import wait_until

TOK = CharTokenizer("0123456789>")
PROMPTS = ["123>", "905>", "44>", "7>", "3141>", "2718>", "60>", "8>"]
WAIT = 120  # seconds a test may wait for a future before it counts as lost (never compared with anything)


@pytest.fixture(scope="module")
def model(dist1):  # noqa: F811
    torch.manual_seed(1234)
    return tiny(TOK)


@pytest.fixture
def version():
    return {"v": 0}


def _engine(model, version=None, **cfg):
    eng = MegatronEngine(
        model, TOK, GenerationConfig(**cfg), weight_version=(lambda: version["v"]) if version else None
    )
    eng.bring_up()
    return eng


def _solo(eng, prompt, n):
    """The request run alone (greedy): what any batched run of it must reproduce."""
    return eng.generate_ids([TOK.tokenize(prompt)], max_tokens=n)[0]


def _held_at(n):
    """An on_token callback that, at the ``n``-th token, waits (bounded) until the test sets ``release``: the
    request cannot run on while the test acts on it (a cancel lands at token ``n``, however loaded the machine)."""
    reached, release = threading.Event(), threading.Event()
    seen = []

    def on_token(tok, lp, v):
        seen.append(tok)
        if len(seen) == n:
            reached.set()
            assert release.wait(WAIT), "the test never released the request"

    return on_token, reached, release


def _hold_at(eng, n, until=None):
    """An on_token callback that, at the ``n``-th token, waits until a control call (a suspend) is queued: the
    request is still in flight when the suspend lands, however loaded the machine is (ordering, not timing).
    ``until`` (polled, bounded) also releases it: an engine-loop mutant may suspend without a control call."""
    seen = []
    reached = threading.Event()

    def on_token(tok, lp, v):
        seen.append(tok)
        if len(seen) == n:
            reached.set()
            if until is None:
                assert eng._batcher.wait_for_control(WAIT), "no control call came"
                return
            for _ in range(int(WAIT * 1000)):
                if eng._batcher.control_pending or until():
                    return
                time.sleep(0.001)
            raise AssertionError("no suspend came")

    return on_token, reached


def _check_length(c: TokenCompletion, n: int) -> None:
    assert c.finish_reason in ("length", "stop"), c
    if c.finish_reason == "length":
        assert len(c.token_ids) == n, c
    else:
        assert c.token_ids[-1] == TOK.eod and len(c.token_ids) <= n, c
    assert len(c.logprobs) == len(c.weight_versions) == len(c.token_ids)


# ---------------------------------------------------------------------------------------------- batching
def test_concurrent_requests_of_different_lengths_batch_together_and_match_solo_runs(model):
    eng = _engine(model, max_active_requests=4)
    lengths = [3, 17, 1, 9, 12, 5, 20, 2]
    solo = [_solo(eng, p, n) for p, n in zip(PROMPTS, lengths)]
    steps_solo = eng.steps
    out: dict[int, TokenCompletion] = {}

    running: list[int] = []

    def caller(i):
        on_token = lambda t, lp, v: running.append(eng.request_counts().running)  # noqa: E731
        out[i] = eng.submit(TOK.tokenize(PROMPTS[i]), max_tokens=lengths[i], on_token=on_token).result(timeout=WAIT)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(PROMPTS))]
    eng.suspend()  # the eight queue up first, so the resume batches them however the threads were scheduled
    for t in threads:
        t.start()
    wait_until(lambda: eng.request_counts().queued == len(PROMPTS), "every caller to submit", WAIT)
    eng.resume()
    for t in threads:
        t.join()
    for i, n in enumerate(lengths):
        _check_length(out[i], n)
        assert out[i].token_ids == solo[i].token_ids, (i, out[i], solo[i])  # batched = solo, token for token
        assert out[i].logprobs == pytest.approx(solo[i].logprobs, abs=1e-4)
    tokens = sum(len(c.token_ids) for c in out.values())
    assert eng.steps - steps_solo < tokens  # requests shared decode steps (a solo loop needs one step per token)
    assert max(running) == 4  # bounded by max_active_requests, and the bound was reached
    assert eng.request_counts() == (0, 0, 0)
    eng.shutdown()


def test_seeded_sampling_does_not_depend_on_the_other_requests_in_the_batch(model):
    eng = _engine(model)
    alone = eng.submit(TOK.tokenize("123>"), max_tokens=8, temperature=1.0, seed=5).result(timeout=WAIT)
    crowd = [eng.submit(TOK.tokenize(p), max_tokens=8, temperature=1.0) for p in PROMPTS]
    again = eng.submit(TOK.tokenize("123>"), max_tokens=8, temperature=1.0, seed=5).result(timeout=WAIT)
    [h.result(timeout=WAIT) for h in crowd]
    assert again.token_ids == alone.token_ids
    group = eng.generate_ids([TOK.tokenize("123>")] * 4, max_tokens=8, temperature=1.0, seed=3)
    assert len({c.token_ids for c in group}) > 1  # a seeded call gives each request its own seed
    eng.shutdown()


def test_stop_tokens_and_on_token_end_one_request(model):
    eng = _engine(model)
    ref = _solo(eng, "905>", 10)
    first = ref.token_ids[0]
    c = eng.submit(TOK.tokenize("905>"), max_tokens=10, stop_token_ids=[first]).result(timeout=WAIT)
    assert c.token_ids == (first,) and c.finish_reason == "stop"
    seen = []
    c = eng.submit(
        TOK.tokenize("905>"), max_tokens=10, on_token=lambda t, lp, v: seen.append((t, v)) or len(seen) < 3
    ).result(timeout=WAIT)
    assert c.finish_reason == "stop" and c.token_ids == ref.token_ids[:3] and [t for t, _ in seen] == list(c.token_ids)
    eng.shutdown()


# ---------------------------------------------------------------------------------------------- handoffs
def _rollouts(completions):
    from colo_fsm.adapters.megatron.trainer import Rollout

    return [
        Rollout(c.prompt_ids, c.token_ids, float(i % 2), 0, c.logprobs, c.weight_version)
        for i, c in enumerate(completions)
        if c.token_ids
    ]


def handoff_run(model, engine_class=MegatronEngine, *, n_tokens=16, trainer_lr=5e-2):
    """Park requests mid-generation, train one real step on the same model, resume; what happened.

    Returns (reference, completions, record): the uninterrupted greedy runs, the parked requests' completions
    (an exception where a request failed, None where it never completed), and what was observed on the way.
    """
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, TrainerConfig

    version = {"v": 0}
    eng = engine_class(model, TOK, GenerationConfig(max_active_requests=8), weight_version=lambda: version["v"])
    eng.bring_up()
    prompts = PROMPTS[:6]
    reference = eng.generate_ids([TOK.tokenize(p) for p in prompts], max_tokens=n_tokens)
    trainer = MegatronTrainer(model, TrainerConfig(lr=trainer_lr))
    on_token, started = _hold_at(eng, 3, until=lambda: eng._batcher.backend.suspended)
    submitted, seen = threading.Event(), []  # request 0 waits at its first token until all six are in

    def first(tok, lp, v):
        seen.append(tok)
        if len(seen) == 1:
            assert submitted.wait(WAIT), "the test never submitted the other requests"
        return on_token(tok, lp, v)

    handles = [
        eng.submit(TOK.tokenize(p), max_tokens=n_tokens, on_token=first if i == 0 else None)
        for i, p in enumerate(prompts)
    ]
    submitted.set()
    assert started.wait(WAIT)
    eng.suspend()
    record = {
        "in_flight_at_return": eng.decode_in_flight,
        "counts": eng.request_counts(),
        "steps": eng.steps,
        "done_at_suspend": sum(h.done() for h in handles),
    }
    trainer.train_step(_rollouts(reference))  # a real optimizer step on the very model the engine decodes with
    version["v"] += 1
    record["steps_after_train"] = eng.steps
    record["in_flight_after_train"] = eng.decode_in_flight
    eng.resume()
    for _ in range(60_000):  # until the engine is idle (bounded, never an assertion on time)
        if eng.request_counts() == (0, 0, 0) and not eng.decode_in_flight:
            break
        time.sleep(0.002)
    concurrent.futures.wait([h.future for h in handles], timeout=3)  # idle already: resolved at once unless lost
    completions = []
    for h in handles:
        if not h.future.done():
            completions.append(None)
            continue
        try:
            completions.append(h.result(timeout=0))
        except Exception as exc:  # the request failed in the engine
            completions.append(exc)
    record["steps_end"] = eng.steps
    record["counts_after"] = eng.request_counts()
    record["completed"] = eng._batcher.completed
    record["steps_while_suspended"] = eng._batcher.steps_while_suspended
    # what the request must be: its pre-handoff tokens, then the greedy continuation under the new weights
    record["continuations"] = {}
    for i, c in enumerate(completions):
        if isinstance(c, TokenCompletion):
            old = [t for t, v in zip(c.token_ids, c.weight_versions) if v == 0]
            if 0 < len(old) < n_tokens and (not old or old[-1] != TOK.eod):
                cont = eng.generate_ids([TOK.tokenize(prompts[i]) + old], max_tokens=n_tokens - len(old))[0]
                record["continuations"][i] = tuple(old) + cont.token_ids
    eng.shutdown()
    return reference, completions, record


def handoff_violations(reference, completions, record, n_tokens=16):
    """Every way the park-don't-drain handoff went wrong (empty: it held)."""
    bad = []
    if record["in_flight_at_return"] or record["in_flight_after_train"]:
        bad.append("a decode step was in flight during the handoff")
    if record["steps_after_train"] != record["steps"] or record["steps_while_suspended"]:
        bad.append(f"decode steps ran while suspended ({record['steps']} -> {record['steps_after_train']})")
    if record["counts"].running or not record["counts"].parked:
        bad.append(f"requests not parked at the suspend: {record['counts']}")
    after = record["steps_end"] - record["steps_after_train"]  # decode steps since the resume
    for i, (ref, c) in enumerate(zip(reference, completions)):
        if c is None:
            bad.append(f"request {i} never completed (lost)")
            continue
        if isinstance(c, Exception):
            bad.append(f"request {i} failed: {c!r}")
            continue
        if c.finish_reason not in ("length", "stop"):
            bad.append(f"request {i} ended {c.finish_reason!r}")
        elif c.finish_reason == "length" and len(c.token_ids) != n_tokens:
            bad.append(f"request {i}: {len(c.token_ids)} tokens, asked {n_tokens}")
        old = [t for t, v in zip(c.token_ids, c.weight_versions) if v == 0]
        if tuple(old) != ref.token_ids[: len(old)]:
            bad.append(f"request {i}: tokens before the handoff differ from an uninterrupted run")
        if list(c.weight_versions) != sorted(c.weight_versions):
            bad.append(f"request {i}: versions not monotone {c.weight_versions}")
        new = sum(v == 1 for v in c.weight_versions)
        if new > after:
            bad.append(f"request {i}: {new} tokens after the resume in {after} decode steps (generated twice)")
        want = record["continuations"].get(i)
        if want is not None and c.token_ids != want:
            bad.append(f"request {i}: {c.token_ids} is not its prefix + the new weights' continuation {want}")
    if record["completed"] < len(reference) * 2:  # the reference runs and the parked ones, each exactly once
        bad.append(f"{record['completed']} completions for {len(reference) * 2} requests")
    return bad


def test_suspend_parks_requests_train_step_then_they_finish_under_the_new_version(dist1):  # noqa: F811
    torch.manual_seed(99)
    model = tiny(TOK)
    reference, completions, record = handoff_run(model)
    assert handoff_violations(reference, completions, record) == []
    assert record["done_at_suspend"] < len(completions)  # suspend returned without waiting for requests
    spanning = [c for c in completions if c.version_span > 0]
    assert spanning, [c.weight_versions for c in completions]
    for c in spanning:
        assert c.first_weight_version == 0 and c.last_weight_version == 1 and c.weight_version == 0
    assert record["counts_after"] == (0, 0, 0)
    # behaviour log-probs were recorded when each token was generated: the pre-handoff ones are the old
    # weights' (the uninterrupted run's), the post-handoff ones the new weights' -- what the GRPO ratio needs
    from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout

    with torch.no_grad():
        now, t = MegatronTrainer(model).token_logprobs([Rollout(c.prompt_ids, c.token_ids, 0.0, 0) for c in spanning])
    model.eval()
    for i, c in enumerate(spanning):
        k = c.weight_versions.index(1)
        assert c.logprobs[:k] == pytest.approx(reference[completions.index(c)].logprobs[:k], abs=1e-4)
        current = now[i][t["comp"][i]].tolist()
        assert c.logprobs[k:] == pytest.approx(current[k:], abs=1e-4)
        assert c.logprobs[:k] != pytest.approx(current[:k], abs=1e-4)  # the step did change them


def test_drain_mode_suspend_waits_for_admitted_requests_and_keeps_the_queue(model):
    eng = _engine(model, max_active_requests=2, inflight="drain")
    n = 14
    ok = [p for p in PROMPTS if _solo(eng, p, n).finish_reason == "length"]  # no early eod: slots stay busy
    assert len(ok) >= 2
    on_token, started = _hold_at(eng, 2)  # both slots busy until the suspend is queued: the queue is never admitted
    eng.suspend()  # all four wait in the queue, so the resume fills both slots with the first two in one step
    first = [
        eng.submit(TOK.tokenize(ok[0]), max_tokens=n, on_token=on_token),
        eng.submit(TOK.tokenize(ok[1]), max_tokens=n),
    ]
    queued = [eng.submit(TOK.tokenize(p), max_tokens=3) for p in PROMPTS[:2]]
    eng.resume()
    assert started.wait(WAIT)
    eng.suspend()
    assert all(h.done() and h.result().finish_reason == "length" for h in first)  # drained to the end
    assert not any(h.done() for h in queued) and eng.request_counts() == (2, 0, 0)  # admission closed
    steps = eng.steps
    eng.resume()
    assert all(len(h.result(timeout=WAIT).token_ids) <= 3 for h in queued)
    assert eng.steps > steps
    eng.shutdown()


def test_abort_mode_resubmits_prompt_plus_tokens_and_the_real_model_continues_them(model):
    """inflight="abort" on the real CPU model: with the weights unchanged, ending a request at the suspend and
    re-prefilling prompt + its tokens after the resume gives exactly the uninterrupted greedy run."""
    version = {"v": 0}
    eng = _engine(model, version, inflight="abort")
    n = 12
    prompt = next(p for p in PROMPTS if _solo(eng, p, n).finish_reason == "length")
    ref = _solo(eng, prompt, n)
    on_token, reached = _hold_at(eng, 4)
    h = eng.submit(TOK.tokenize(prompt), max_tokens=n, on_token=on_token)
    assert reached.wait(WAIT)
    eng.suspend()
    assert eng.request_counts() == (1, 0, 0)  # ended in the engine, waiting for its resubmission
    assert eng._batcher.backend.active_ids() == []
    version["v"] = 1
    eng.resume()
    c = h.result(timeout=WAIT)
    assert c.token_ids == ref.token_ids and c.finish_reason == "length"
    assert c.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    assert c.weight_versions == (0,) * 4 + (1,) * (n - 4) and c.weight_version == 0 and c.resubmissions == 1
    assert (eng._batcher.reprefills, eng._batcher.reprefill_tokens) == (1, len(TOK.tokenize(prompt)) + 4)
    assert eng.steps_while_suspended == 0
    eng.shutdown()


def test_training_requests_are_admitted_before_server_requests(model):
    eng = _engine(model, max_active_requests=1)
    eng.suspend()
    server_a = eng.submit(TOK.tokenize("12>"), max_tokens=2, priority=Priority.SERVER)
    training = eng.submit(TOK.tokenize("34>"), max_tokens=2, priority=Priority.TRAINING)
    server_b = eng.submit(TOK.tokenize("56>"), max_tokens=2, priority=Priority.SERVER)
    assert eng.request_counts() == (3, 0, 0)
    eng.resume()
    for h in (server_a, training, server_b):
        h.result(timeout=WAIT)
    assert training.admitted_step < server_a.admitted_step < server_b.admitted_step
    eng.shutdown()


# ---------------------------------------------------------------------------------------------- cancel, bad input
def test_cancel_aborts_one_request_and_disturbs_nothing_else(model):
    eng = _engine(model, max_active_requests=8)
    solo = [_solo(eng, p, 10) for p in PROMPTS[:4]]
    on_token, started, release = _held_at(2)  # the cancel lands at its second token
    hs = [
        eng.submit(TOK.tokenize(p), max_tokens=25 if i == 1 else 10, on_token=on_token if i == 1 else None)
        for i, p in enumerate(PROMPTS[:4])
    ]
    assert started.wait(WAIT)
    assert hs[1].cancel() is True
    release.set()
    gone = hs[1].result(timeout=WAIT)
    assert gone.finish_reason == "abort" and len(gone.token_ids) == 2
    assert hs[1].cancel() is False  # already done
    eng.suspend()  # queued while the caller cancels: never admitted, whatever the load
    future_cancelled = eng.submit(TOK.tokenize("99>"), max_tokens=25)
    future_cancelled.future.cancel()  # the caller's future cancelled: aborted in the engine too
    eng.resume()
    assert future_cancelled.result().finish_reason == "abort"
    for i in (0, 2, 3):
        assert hs[i].result(timeout=WAIT).token_ids == solo[i].token_ids
    assert eng.request_counts() == (0, 0, 0)
    assert eng._batcher.backend.active_ids() == []  # the aborted rows left the backend's batch too
    eng.shutdown()


def test_bad_input_is_refused_with_typed_errors_and_nothing_else_is_disturbed(model):
    eng = _engine(model, max_request_tokens=40)
    ref = _solo(eng, "123>", 12)
    busy = eng.submit(TOK.tokenize("123>"), max_tokens=12)
    with pytest.raises(RequestTooLarge) as exc:
        eng.submit(TOK.tokenize("1234>"), max_tokens=30)  # 5 + 30 > max_sequence_length 32
    assert exc.value.value == 35 and exc.value.limit == 32
    assert "5 tokens" in str(exc.value) and "max_tokens=30" in str(exc.value) and "32" in str(exc.value)
    with pytest.raises(RequestTooLarge) as exc:
        eng.generate_ids([TOK.tokenize("1>")] * 6, max_tokens=8)  # 48 > max_request_tokens 40
    assert exc.value.value == 48 and exc.value.limit == 40 and exc.value.field == "prompts*max_tokens"
    for kw, field in (
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
    ):
        with pytest.raises(ConfigError) as cexc:
            eng.submit(TOK.tokenize("1>"), **{"max_tokens": 2, **kw})
        assert cexc.value.field == field
    with pytest.raises(ConfigError):
        eng.submit([], max_tokens=2)
    assert busy.result(timeout=WAIT).token_ids == ref.token_ids  # the request in flight never noticed
    eng.shutdown()
    with pytest.raises(EngineStopped):
        eng.submit(TOK.tokenize("1>"), max_tokens=2)
    with pytest.raises(EngineStopped):
        eng.generate(["1>"], max_tokens=2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("inflight", "pause"),
        ("inflight", None),
        ("max_active_requests", 0),
        ("max_request_tokens", -5),
        ("num_cuda_graphs", 0),
    ],
)
def test_generation_config_refuses_bad_values(field, value):
    with pytest.raises(ConfigError) as exc:
        GenerationConfig(**{field: value})
    assert exc.value.field == field and exc.value.value == value


def test_inflight_modes_parse():
    assert GenerationConfig().inflight == "park"
    assert GenerationConfig(inflight="DRAIN").inflight == "drain"


def test_shutdown_aborts_queued_running_and_parked_requests(model):
    eng = _engine(model, max_active_requests=1)
    assert _solo(eng, "123>", 1).token_ids != (TOK.eod,)  # its first token does not end it
    on_token, started = _hold_at(eng, 1)  # held after its first token until the suspend is on its way
    parked = eng.submit(TOK.tokenize("123>"), max_tokens=20, on_token=on_token)
    queued = eng.submit(TOK.tokenize("45>"), max_tokens=20)
    assert started.wait(WAIT)
    eng.suspend()
    assert eng.request_counts() == (1, 0, 1)
    eng.shutdown()
    assert parked.result(timeout=WAIT).finish_reason == "abort" and len(parked.result().token_ids) >= 1
    assert queued.result(timeout=WAIT).finish_reason == "abort" and queued.result().token_ids == ()
    assert not eng.awake


def test_completion_versions_oldest_first_last_span():
    c = TokenCompletion(0, (1,), (2, 3, 4), (-1.0, -1.0, -1.0), (3, 3, 4), "", "length", admitted_version=3)
    assert (c.first_weight_version, c.last_weight_version, c.weight_version, c.version_span) == (3, 4, 3, 1)
    empty = TokenCompletion(1, (1,), (), (), (), "", "abort", admitted_version=7)
    assert (empty.weight_version, empty.version_span) == (7, 0)


# ---------------------------------------------------------------------------------------------- mutants
_ENGINE_MUTANTS = ("suspend-not-at-step-boundary", "parked-request-dropped-on-resume", "parked-request-resumed-twice")


@pytest.mark.parametrize("name", _ENGINE_MUTANTS)
def test_engine_mutant_is_caught_by_the_handoff_checks(dist1, name):  # noqa: F811
    """Each engine-loop mutant of tests/support/mutants.py, run on the real model, breaks the handoff checks."""
    from tests.support.mutants import MUTANTS

    mutant = next(m for m in MUTANTS if m.name == name)
    assert mutant.batcher_class is not None

    class MutantEngine(MegatronEngine):
        batcher_class = mutant.batcher_class()

    torch.manual_seed(99)
    reference, completions, record = handoff_run(tiny(TOK), MutantEngine)
    assert handoff_violations(reference, completions, record), f"{name} survived the handoff checks"


def test_cancelling_the_awaiting_task_aborts_the_request_in_the_engine(model):
    """The server's disconnect path: the asyncio task awaiting handle.wait() is cancelled."""
    import asyncio

    eng = _engine(model)
    ref = _solo(eng, "44>", 12)
    on_token, started, release = _held_at(2)  # the task's cancel lands at the request's second token

    async def main():
        gone = eng.submit(TOK.tokenize("123>"), max_tokens=20, on_token=on_token)
        other = eng.submit(TOK.tokenize("44>"), max_tokens=12)
        task = asyncio.create_task(gone.wait())
        await asyncio.to_thread(started.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(int(WAIT * 100)):  # the future's cancel reaches the engine through the future's callbacks
            if gone.future.cancelled():
                break
            await asyncio.sleep(0.01)
        release.set()
        return gone, await other.wait()

    gone, other = asyncio.run(main())
    assert gone.future.cancelled() and gone.result().finish_reason == "abort" and len(gone.result().token_ids) == 2
    assert other.token_ids == ref.token_ids
    assert eng.request_counts() == (0, 0, 0)
    eng.shutdown()


def test_a_failing_on_token_callback_aborts_only_its_request(model):
    eng = _engine(model)
    ref = _solo(eng, "44>", 6)

    def boom(tok, lp, v):
        raise RuntimeError("callback bug")

    bad = eng.submit(TOK.tokenize("123>"), max_tokens=6, on_token=boom)
    good = eng.submit(TOK.tokenize("44>"), max_tokens=6)
    assert bad.result(timeout=WAIT).finish_reason == "abort"
    assert good.result(timeout=WAIT).token_ids == ref.token_ids
    eng.shutdown()


def test_control_calls_from_the_engine_thread_are_refused_not_deadlocked(model):
    eng = _engine(model)
    errors = []

    def suspend_from_callback(tok, lp, v):
        try:
            eng.suspend()
        except Exception as exc:
            errors.append(exc)
            return False

    c = eng.submit(TOK.tokenize("12>"), max_tokens=5, on_token=suspend_from_callback).result(timeout=WAIT)
    assert c.finish_reason == "stop" and len(c.token_ids) == 1
    assert errors and "engine thread" in str(errors[0])
    assert eng.awake and len(eng.generate(["12>"], max_tokens=2)[0].token_ids) >= 1
    eng.shutdown()


def test_a_backend_that_dies_fails_its_requests_and_stops_the_engine(model):
    from colo_fsm.adapters.megatron.cpu_loop import CpuStepLoop

    class Dying(CpuStepLoop):
        def step(self):
            if self.steps >= 2:
                raise RuntimeError("device lost")
            return super().step()

    eng = MegatronEngine(model, TOK)
    eng._make_backend = lambda: Dying(model, eod=TOK.eod, pad=TOK.pad, max_sequence_length=32)
    eng.bring_up()
    eng.suspend()  # all three are in before the backend's dying step, whatever the load
    hs = [eng.submit(TOK.tokenize(p), max_tokens=10) for p in PROMPTS[:3]]
    eng.resume()
    for h in hs:
        with pytest.raises(RuntimeError, match="device lost"):
            h.result(timeout=WAIT)
    with pytest.raises(EngineStopped):
        eng.submit(TOK.tokenize("1>"), max_tokens=2)
    eng.shutdown()


def test_the_shipped_batcher_satisfies_the_parking_property():
    """No false alarm: the property that kills the engine mutants holds for ContinuousBatcher itself."""
    from tests.support.properties import check_parking_property

    check_parking_property()
