"""Spec mistakes caught early and named: unknown states and triggers, stuck states, a spec loaded from a file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from colo_fsm.errors import ConfigError, SpecError
from colo_fsm.machine.lifecycle import Lifecycle
from colo_fsm.states import LIFECYCLE, NEMO_RL, Fact, State, TransitionSpec, resolve_spec, walk
from colo_fsm.states.validate import validate_spec
from colo_fsm.states.walk import find_stuck
from colo_fsm.testing.checker import check
from colo_fsm.testing.checker import main as check_main
from colo_fsm.testing.fakes import recording_adapters

S = State


def _plus(spec, *extra):
    return dataclasses.replace(spec, transitions=(*spec.transitions, *extra))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (TransitionSpec("stop", S.GENERATING, "Nowhere"), r"stop: Generating -> 'Nowhere'.*destination 'Nowhere'"),
        (TransitionSpec("stop", "Limbo", S.STOPPED), r"stop: 'Limbo' -> Stopped.*source 'Limbo'"),
        (TransitionSpec("stop", S.GENERATING, "Stopped"), r"write State.STOPPED"),
        (TransitionSpec("stopp", S.GENERATING, S.STOPPED), r"stopp: Generating -> Stopped.*trigger 'stopp'"),
        (TransitionSpec("stop", S.CONCLUDING, S.STOPPED), r"stop: Concluding -> Stopped.*source Concluding"),
        (TransitionSpec("stop", S.GENERATING, S.STOPPED, ("explode",)), r"action 'explode'"),
    ],
)
def test_unknown_destination_source_trigger_or_action_is_a_spec_error_naming_the_transition(extra, named):
    spec = _plus(LIFECYCLE, extra)
    with pytest.raises(SpecError, match=named):
        validate_spec(spec)
    _j, engine, trainer, collector, drain = recording_adapters()
    with pytest.raises(SpecError, match=named):
        Lifecycle(engine, trainer, collector, drain=drain, spec=spec)
    with pytest.raises(SpecError, match=named):
        check(2, spec=spec)


def _stuck_spec():
    """Starting leaves only for validation at start, which nothing enables when the run does not validate first."""
    ts = tuple(
        dataclasses.replace(t, when=(Fact.HANDOFF_COMPLETE, Fact.VALIDATE_AT_START)) if t.trigger == "generate" else t
        for t in NEMO_RL.transitions
        if t.trigger != "validate"
    )
    return dataclasses.replace(NEMO_RL, transitions=ts, name="stuck")


def test_validate_spec_finds_a_state_a_run_gets_stuck_in():
    spec = _stuck_spec()
    assert find_stuck(LIFECYCLE) is None and find_stuck(NEMO_RL) is None
    assert find_stuck(spec) == "stuck in Starting: no transition enabled (facts: engine_built, handoff_complete)"
    with pytest.raises(SpecError, match="stuck in Starting"):
        validate_spec(spec)


def test_colo_fsm_check_reports_a_bad_spec_as_a_violation(capsys, monkeypatch, tmp_path):
    (tmp_path / "my_variant.py").write_text(
        "import dataclasses\n"
        "from colo_fsm.states import LIFECYCLE, State, TransitionSpec\n"
        "BAD = dataclasses.replace(LIFECYCLE, transitions=(*LIFECYCLE.transitions,"
        " TransitionSpec('stop', State.GENERATING, 'Nowhere')))\n"
        "GOOD = LIFECYCLE\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    assert check_main(["--ranks", "2", "--spec", "my_variant.py:BAD"]) == 1
    out = capsys.readouterr().out
    assert "SpecError" in out and "Nowhere" in out and "1 violation(s)" in out


def test_spec_loaded_from_a_file_and_the_import_error_says_how(tmp_path, monkeypatch):
    spec_file = tmp_path / "sub" / "my_variant.py"
    spec_file.parent.mkdir()
    spec_file.write_text("from colo_fsm.states import NEMO_RL\nMINE = NEMO_RL\n", encoding="utf-8")
    assert resolve_spec(f"{spec_file}:MINE") is NEMO_RL
    monkeypatch.chdir(spec_file.parent)
    assert resolve_spec("my_variant.py:MINE") is NEMO_RL
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # cwd is not on sys.path for an installed script
    monkeypatch.delitem(sys.modules, "my_variant", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(spec_file.parent))])
    with pytest.raises(ConfigError, match=r"No module named 'my_variant'.*--spec my_variant.py:MINE"):
        resolve_spec("my_variant:MINE")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_spec("nope/missing.py:MINE")


def test_installed_colo_fsm_draws_a_spec_file_from_the_current_folder(tmp_path):
    (tmp_path / "my_variant.py").write_text("from colo_fsm.states import NEMO_RL as MINE\n", encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    code = "import sys; from colo_fsm.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run(
        [sys.executable, "-c", code, "diagram", "--spec", "my_variant.py:MINE", "--format", "mermaid"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "Concluding" in run.stdout


def check_stuck_save_and_last() -> None:
    """A variant with no way out of Checkpointing on a step latched save-and-last (its Checkpointing -> Done edge
    is gone) gets stuck there; only a walk that follows latches deciding True finds it."""
    variant = dataclasses.replace(
        LIFECYCLE,
        transitions=tuple(
            t
            for t in LIFECYCLE.transitions
            if not (t.trigger == "conclude" and t.source is State.CHECKPOINTING and t.dest is State.DONE)
        ),
        name="no-save-and-last",
    )
    found = walk.find_stuck(variant)
    assert found is not None and found.startswith("stuck in Checkpointing"), (
        f"find_stuck said {found!r} of a spec stuck in Checkpointing on a save-and-last step"
    )
    assert "last_step" in found and "save_this_step" in found, found


def test_a_spec_stuck_on_a_save_and_last_step_is_refused():
    check_stuck_save_and_last()
    with pytest.raises(SpecError, match="stuck in Checkpointing"):
        validate_spec(
            dataclasses.replace(
                LIFECYCLE,
                transitions=tuple(
                    t for t in LIFECYCLE.transitions if not (t.source is State.CHECKPOINTING and t.dest is State.DONE)
                ),
            )
        )


def test_a_done_without_stop_is_refused_before_anything_runs():
    """A terminal-ish Done with no way to stop: lc.stop() there would raise and never tear the engine down."""
    no_stop = dataclasses.replace(
        LIFECYCLE,
        transitions=tuple(t for t in LIFECYCLE.transitions if not (t.trigger == "stop" and t.source is State.DONE)),
        name="done-without-stop",
    )
    with pytest.raises(SpecError) as err:
        validate_spec(no_stop)
    msg = str(err.value)
    assert "[build-once] a way to stop from every state" in msg and "Done (facts:" in msg, msg
    assert "no stop is enabled" in msg and "with_stops" in msg, msg
    _j, engine, trainer, collector, drain = recording_adapters()
    with pytest.raises(SpecError, match="a way to stop"):
        Lifecycle(engine, trainer, collector, drain=drain, spec=no_stop)
    assert engine.journal.calls == []  # refused before anything ran
    from colo_fsm.states.spec import with_stops

    validate_spec(with_stops(no_stop))  # the derived stop puts it right


def test_duplicates_are_called_duplicates():
    begin = next(t for t in LIFECYCLE.transitions if t.trigger == "begin_step")
    with pytest.raises(SpecError, match=r"#\d+ is an exact duplicate of #3"):
        validate_spec(_plus(LIFECYCLE, begin))
    shadow = dataclasses.replace(begin, dest=State.TRAINING)
    with pytest.raises(
        SpecError, match="a duplicate \\(the same trigger, source and guards, to Draining and Training\\)"
    ):
        validate_spec(_plus(LIFECYCLE, shadow))
    with pytest.raises(SpecError, match="^state Done=.*declared 2 times: a duplicate"):
        validate_spec(dataclasses.replace(LIFECYCLE, states=(*LIFECYCLE.states, LIFECYCLE.state(State.DONE))))
    with pytest.raises(SpecError, match="^action barrier=.*a duplicate"):
        validate_spec(dataclasses.replace(LIFECYCLE, actions=(*LIFECYCLE.actions, LIFECYCLE.action("barrier"))))


def test_a_stop_that_does_step_work_is_refused():
    ts = tuple(
        dataclasses.replace(t, actions=("restore_training_buffers", "train_step", *t.actions))
        if t.trigger == "stop" and t.source is State.DRAINING
        else t
        for t in LIFECYCLE.transitions
    )
    with pytest.raises(SpecError, match="a stop abandons the step in progress"):
        validate_spec(dataclasses.replace(LIFECYCLE, transitions=ts))
