"""Where megatron-core's coordinator pause spends its decode steps (``bench/coordinator_pause_rounds.py``): megatron's
own coordinator process, client, event loop, ``MegatronAsyncLLM`` and engine loop, on the CPU, around a decode step
that sleeps. What docs/coordinator.md says of the pause rests on these; a megatron-core that changes them turns
them red.
"""

from __future__ import annotations

import pytest

pytest.importorskip("zmq", reason="pyzmq (the coordinator extra)")
pytest.importorskip("msgpack", reason="msgpack (the coordinator extra)")
pytest.importorskip("megatron.core", reason="megatron-core (the megatron extra)")

from bench.coordinator_pause_rounds import Rig, main, measure_way, run_section

# a long decode step (2 ms before its yield, 10 after) so the trip through megatron's coordinator process fits in
# one step even on a busy machine
CPU_S, GPU_S = 0.002, 0.010


def test_megatrons_pause_sends_in_a_later_round_than_one_coroutine_or_a_callback() -> None:
    """megatron's ``pause()`` runs on its loop and hands its body to the same loop (``run_async``): PAUSE leaves the
    client three decode steps (rounds) after the loop first runs anything of the call, against one for a coroutine
    sending it and none for a plain callback (0 by construction: the callback marks its round and sends; the
    reference), in every handoff. The step under way at the send finishes before the engine reads its socket, and
    at interval 1 the engine is PAUSED in the iteration that reads it. Forced: that step ends only once megatron's
    coordinator process has forwarded the signal (``hold_until_delivered``), as on a quiet machine, so a busy one
    that runs the coordinator process late cannot move the count."""
    rig = Rig(interval=1, cpu_s=CPU_S, gpu_s=GPU_S)
    rig.engine.hold_until_delivered = True
    try:
        rows = {way: measure_way(rig, way, 6) for way in ("megatron", "one-coroutine", "callback")}
    finally:
        rig.close()
    for way, row in rows.items():
        assert row["failure"] is None, (way, row)
    assert rows["megatron"]["rounds_to_send"] == [3] * 6, rows["megatron"]
    assert rows["one-coroutine"]["rounds_to_send"] == [1] * 6, rows["one-coroutine"]
    assert rows["callback"]["rounds_to_send"] == [0] * 6, rows["callback"]
    for way, row in rows.items():
        # the engine reads its socket at the top of its loop: the step the signal found under way finishes first,
        # and with the signal delivered within that step the engine is PAUSED in the next iteration, every time
        after_send = [paused - sent for paused, sent in zip(row["steps_to_paused"], row["steps_at_send"], strict=True)]
        assert after_send == [1] * 6, (way, row)
        # SUSPEND adds no decode step: a PAUSED engine does not step
        assert row["pause_steps"] == row["steps_to_paused"], (way, row)


def test_a_calling_thread_late_to_submit_moves_the_steps_at_send_not_the_rounds() -> None:
    """The rounds are counted from the loop callback that starts the call, never from the calling thread: a calling
    thread held two decode steps between reading the step count and submitting (what a busy machine does to it)
    leaves every way's rounds as they are and shows up in ``steps_at_send`` alone."""
    rig = Rig(interval=1, cpu_s=CPU_S, gpu_s=GPU_S)
    rig.late_by_steps = 2
    try:
        rows = {way: measure_way(rig, way, 3) for way in ("megatron", "one-coroutine", "callback")}
    finally:
        rig.close()
    for way, rounds in (("megatron", 3), ("one-coroutine", 1), ("callback", 0)):
        row = rows[way]
        assert row["failure"] is None, (way, row)
        assert row["rounds_to_send"] == [rounds] * 3, (way, row)
        assert min(row["steps_at_send"]) >= 2 + rounds, (way, row)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # megatron's sys.exit: the finding
def test_suspend_sent_behind_pause_kills_megatrons_loop_above_interval_1() -> None:
    """megatron applies one signal per loop iteration and asserts PAUSED for SUSPEND: sent right behind PAUSE, with
    the next consensus 19 iterations away, SUSPEND finds PAUSING and megatron's engine loop ends. Why colo-fsm waits
    for PAUSED before it sends SUSPEND."""
    section = run_section(20, ["back-to-back"], 1, CPU_S, GPU_S)
    row = section["ways"]["back-to-back"]
    assert row["failure"] is not None, row
    assert "Received SUSPEND in state EngineState.PAUSING" in (row["loop_died"] or ""), row


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_rig_whose_loop_died_closes_it_with_nothing_left_pending() -> None:
    """Where megatron's loop ended mid-call, the rig's teardown cancels what the loop left (the client's listener, the
    call queued just before the end) and closes it, so nothing is destroyed pending at exit."""
    import asyncio

    rig = Rig(interval=20, cpu_s=CPU_S, gpu_s=GPU_S)
    try:
        row = measure_way(rig, "back-to-back", 1)
        assert row["failure"] is not None and rig.died() is not None, row
        late = asyncio.run_coroutine_threadsafe(asyncio.sleep(60), rig.loop)  # a call that reaches the dead loop
    finally:
        rig.close()
    assert rig.loop.is_closed()
    assert not [t for t in asyncio.all_tasks(rig.loop) if not t.done()]
    assert late.cancelled()


def test_the_bench_names_a_bad_option(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--decode-ms", "1"])
    err = capsys.readouterr().err
    assert "--decode-ms" in err and "'1'" in err and "two numbers" in err
    with pytest.raises(SystemExit):
        main(["--ways", "megatron,teleport"])
    err = capsys.readouterr().err
    assert "--ways" in err and "teleport" in err and "back-to-back" in err
