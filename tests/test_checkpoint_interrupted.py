"""A REAL checkpoint save interrupted mid-write: the megatron CPU adapter (tiny model, DCP format) driven by a
real Lifecycle. The second save writes its shards, then fails before (or at) the rename that publishes it.

The lifecycle must end in Failed with an ActionFailed naming save_checkpoint, Checkpointing, rank and weight
version; ``latest`` must still point at the previous complete step; no published ``step_*`` is half-written (an
``.incomplete-*`` leftover is ignored by load); loading restores the previous step's weights and extra state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _megatron_util import dist1, tiny  # noqa: F401

from colo_fsm.adapters.megatron import checkpoint as ckpt
from colo_fsm.adapters.megatron.engine import MegatronEngine
from colo_fsm.adapters.megatron.tokenizer import CharTokenizer
from colo_fsm.adapters.megatron.trainer import MegatronTrainer, Rollout, TrainerConfig
from colo_fsm.errors import ActionFailed
from colo_fsm.guards import CheckpointDecision, ValidationDecision
from colo_fsm.machine.lifecycle import Lifecycle, LifecycleConfig
from colo_fsm.states.spec import State

TOK = CharTokenizer("0123456789>")


def _batch(eng: MegatronEngine, seed: int) -> list[Rollout]:
    out = []
    for g, p in enumerate(("123>", "905>")):
        for i, c in enumerate(eng.generate_ids([TOK.tokenize(p)] * 2, max_tokens=4, temperature=1.0, seed=seed + g)):
            out.append(Rollout(c.prompt_ids, c.token_ids, float(i % 2), g, c.logprobs, c.weight_version))
    return out


class Interrupted(OSError):
    """The injected crash between writing a checkpoint's shards and publishing it."""


def _interrupt_publish(monkeypatch: pytest.MonkeyPatch, how: str) -> list[Path]:
    """Make the next save write its data, then fail before it is published; returns the dirs it wrote into."""
    written: list[Path] = []
    if how == "rename":  # the shards (and meta) are on disk; the rename to step_* dies
        real_rename = Path.rename

        def rename(self: Path, target: str | Path) -> Path:
            if self.name.startswith(".incomplete-step_"):
                written.append(self)
                raise Interrupted(f"killed while publishing {self.name}")
            return real_rename(self, target)

        monkeypatch.setattr(Path, "rename", rename)
    else:  # dcp.save writes every shard, then raises (a crash at the end of the write)
        import torch.distributed.checkpoint as dcp

        real_save = dcp.save

        def save(state, *, checkpoint_id, **kw):  # type: ignore[no-untyped-def]
            real_save(state, checkpoint_id=checkpoint_id, **kw)
            written.append(Path(checkpoint_id))
            raise Interrupted(f"killed after writing {checkpoint_id}")

        monkeypatch.setattr(dcp, "save", save)
    return written


@pytest.mark.parametrize("how", ["rename", "after_dcp_write"])
def test_real_save_interrupted_before_publish_keeps_previous_checkpoint(dist1, tmp_path, monkeypatch, how):  # noqa: F811
    model = tiny(TOK)
    root = tmp_path / "ckpt"
    lc_ref: dict[str, Lifecycle] = {}
    eng = MegatronEngine(model, TOK, weight_version=lambda: lc_ref["lc"].weight_version)
    trainer = MegatronTrainer(model, TrainerConfig(lr=5e-2, checkpoint_dir=str(root)))
    replay: list[str] = []
    lc = Lifecycle(
        eng,
        trainer,
        config=LifecycleConfig(num_steps=4),
        checkpoint=CheckpointDecision(1),  # every step saves
        validation=ValidationDecision(None),
        checkpoint_extra=lambda: {"buffer": list(replay)},
    )
    lc_ref["lc"] = lc
    lc.start()

    replay.extend(["g0", "g1"])
    lc.step(_batch(eng, 0))  # step 1: saved and published
    assert latest_checkpoint_name(root) == "step_00000001"
    saved_weights = {k: v.detach().clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    saved_buffer = list(replay)

    written = _interrupt_publish(monkeypatch, how)
    replay.append("g2")
    with pytest.raises(ActionFailed) as info:
        lc.step(_batch(eng, 10))  # step 2: trained, its save dies before publishing
    monkeypatch.undo()

    err = info.value
    assert lc.state is State.FAILED and lc.failure is err
    assert err.action == "save_checkpoint" and isinstance(err.cause, Interrupted)
    assert (err.state, err.rank, err.weight_version) == (State.CHECKPOINTING.value, 0, 2)
    text = str(err)
    for part in ("save_checkpoint", "state=Checkpointing", "rank=0", "weight_version=2"):
        assert part in text, (part, text)

    # data was written, and only into the unpublished directory
    assert written and written[0].name == ".incomplete-step_00000002"
    assert any(p.is_file() and p.stat().st_size > 0 for p in written[0].rglob("*"))
    assert not (root / "step_00000002").exists()
    assert latest_checkpoint_name(root) == "step_00000001"
    for published in root.glob("step_*"):  # every published step is complete
        assert (published / ckpt.META).is_file() and any(published.glob("*.distcp")), published

    # a fresh model loads the previous complete step exactly (the .incomplete-* leftover is ignored)
    fresh = tiny(TOK)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # differs from the saved weights everywhere
    loaded = ckpt.load_checkpoint(root, model=fresh)
    assert (loaded.step, loaded.weight_version) == (1, 1)
    assert loaded.extra_state["buffer"] == saved_buffer == ["g0", "g1"]
    assert loaded.extra_state["colo_fsm"]["weight_version"] == 1
    got = fresh.state_dict()
    for k, v in saved_weights.items():
        assert torch.equal(got[k], v), k
    lc.stop()
    assert lc.state is State.STOPPED


def latest_checkpoint_name(root: Path) -> str | None:
    path = ckpt.latest_checkpoint(root)
    return None if path is None else path.name
