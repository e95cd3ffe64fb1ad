"""Tensor-parallel serving over gloo: one server per TP group, on its first rank, fed to the others by the lockstep.

WORLD processes (tests/support/tp_serve_ranks.py) run training steps through the lifecycle on a tiny megatron-core
GPT with tensor parallel 2, each with ``GatedEngine(serve=True)``. Only the first rank of each TP group starts a
server, ``dp_openai_server_base_urls`` has one URL per data-parallel replica, and the ``openai`` client gets
answers (plain, streamed, ``n=2``, stop strings that the leader alone acts on, chat) while the steps go on. The
stop, with a stream still open, ends on every rank within a bounded wait, far below the lockstep's 300 s. A
layout that cannot route (a server asked for on a follower, TP serving without the lockstep) is refused at
bring-up on every rank with :class:`~colo_fsm.errors.ServingTopologyError`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
openai = pytest.importorskip("openai")


class Ranks:
    def __init__(self, tmp_path: Path, world: int, tp: int = 2, **env: str) -> None:
        from colo_fsm.adapters.megatron.parallel import free_port

        self.work = tmp_path
        init = f"tcp://127.0.0.1:{free_port()}"
        e = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.tp_serve_ranks",
                    str(r),
                    str(world),
                    str(tp),
                    init,
                    str(tmp_path),
                ],
                cwd=ROOT,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]

    def wait_file(self, name: str, ok=lambda v: True, limit_s: float = 240) -> object:
        """The JSON in ``name`` once it exists and ``ok(value)``; fails at once if a rank exited first."""
        path = self.work / name
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if path.exists():
                value = json.loads(path.read_text())
                if ok(value):
                    return value
            dead = [p for p in self.procs if p.poll() is not None]
            assert not dead, f"a rank exited early:\n{dead[0].stdout.read()[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"{name} not ready within {limit_s} s")

    def finish(self) -> list[dict]:
        (self.work / "stop").touch()
        outs = [p.communicate(timeout=180)[0] for p in self.procs]
        recs = []
        for r, out in enumerate(outs):
            path = self.work / f"rank{r}.json"
            assert path.exists(), f"rank {r} wrote no result:\n{out[-3000:]}"
            recs.append(json.loads(path.read_text()))
        return recs


def _gym_python() -> str | None:
    """The nemo-gym venv's interpreter (``make nemo-gym-venv``), or None when it is not set up here."""
    explicit = os.environ.get("COLO_FSM_NEMO_GYM_PYTHON")
    path = Path(explicit) if explicit else ROOT / ".venv-gym" / "bin" / "python"
    return str(path) if path.is_file() else None


def _nemo_gym(url: str, tmp_path: Path) -> dict:
    """nemo-gym's own clients (tests/nemo_gym_driver.py) against ``url``; what they received."""
    gym = _gym_python()
    assert gym is not None
    prompts = ["123", "4567"]
    p = subprocess.run(
        [gym, str(ROOT / "tests" / "nemo_gym_driver.py")],
        env={**os.environ, "NEMO_GYM_DRIVER_URL": url, "NEMO_GYM_DRIVER_PROMPTS": json.dumps(prompts)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # hydra writes an outputs/ folder into its working directory
    )
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("NEMO_GYM_RESULT "))
    return json.loads(line.removeprefix("NEMO_GYM_RESULT "))


def _serve_across_steps(tmp_path: Path, world: int, nemo_gym: bool = False) -> None:
    ranks = Ranks(tmp_path, world)
    client_error: BaseException | None = None
    try:
        urls = ranks.wait_file("urls.json")
        assert len(urls) == world // 2  # one URL per data-parallel replica, not per rank
        first = ranks.wait_file("steps.json", lambda s: s >= 1)
        for url in urls:
            c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
            r = c.completions.create(model="tp", prompt="12+3=", max_tokens=6, temperature=1.0, n=2)
            assert len(r.choices) == 2 and all(ch.finish_reason in ("stop", "length") for ch in r.choices)
            r = c.completions.create(model="tp", prompt="7+7=", max_tokens=12, temperature=1.0, stop=["1", "2", "3"])
            assert not any(ch in r.choices[0].text for ch in "123")  # the leader's own stop: the group dropped it
            chunks = list(c.completions.create(model="tp", prompt="4+4=", max_tokens=8, stream=True))
            assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
            chat = c.chat.completions.create(model="tp", messages=[{"role": "user", "content": "21"}], max_tokens=5)
            assert chat.choices[0].finish_reason in ("stop", "length")
        if nemo_gym:  # nemo-gym's clients: completions and chat with token ids, the VLLMModel responses server
            out = _nemo_gym(urls[0], tmp_path)
            assert all(c["choices"][0]["token_ids"] for c in out["completions"] + out["chat"])
            for mode in ("vllm_chat", "vllm_completions"):
                assert all(r["output"][-1]["generation_token_ids"] for r in out[mode]), mode
        # training went on while the group served (the requests above ran across handoffs)
        later = ranks.wait_file("steps.json", lambda s: s >= first + 3)
        assert later >= first + 3
        # every serving rank has its own /metrics, each series labelled with that rank (replica i: rank 2i)
        from prometheus_client.parser import text_string_to_metric_families

        for i, url in enumerate(urls):
            text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=60).text
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            labels = {s.labels.get("rank") for f in fams.values() for s in f.samples if f.name.startswith("colo_fsm")}
            assert labels == {str(2 * i)}, (url, labels)
            assert fams["colo_fsm_train_steps"].samples[0].value >= first
            answered = [
                s
                for s in fams["colo_fsm_http_requests"].samples
                if s.name == "colo_fsm_http_requests_total" and s.labels["outcome"] == "answered"
            ]
            assert sum(s.value for s in answered) >= 4
        # a stream still open when the run stops: the stop must not wait for the lockstep
        c = openai.OpenAI(base_url=urls[0], api_key="x", max_retries=0, timeout=120)
        stream = c.completions.create(model="tp", prompt="9", max_tokens=50, stream=True, temperature=1.0)
        next(iter(stream))
    except Exception as exc:  # reported after the ranks' own account of their stop
        client_error = exc
    finally:
        recs = ranks.finish()
    for rec in recs:
        assert rec["error"] is None, rec.get("traceback")
        assert rec["stopped_within_bound"] is True, f"rank {rec['rank']}: the stop did not end within the bound"
        assert rec["role"]["server"] == (rec["rank"] % 2 == 0)  # the first rank of each TP group, only
        if rec["rank"] % 2:  # an HTTP request handed to a follower directly is refused, not left to hang
            assert rec["follower_http"].startswith("ConfigError: priority=") and "first rank" in rec["follower_http"]
    assert client_error is None, repr(client_error)
    assert len({r["steps"] for r in recs}) == 1 and recs[0]["steps"] >= 4


@pytest.mark.slow  # two processes import megatron-core and train: ~40 s on a busy 2-core machine
def test_tp2_serves_the_openai_client_across_training_steps(tmp_path):
    _serve_across_steps(tmp_path, world=2)


@pytest.mark.slow  # nemo-gym's clients run in their own Python 3.13 venv
def test_tp2_serves_nemo_gym_clients_across_training_steps(tmp_path):
    if _gym_python() is None:
        pytest.skip("the nemo-gym venv is not set up (make nemo-gym-venv, or COLO_FSM_NEMO_GYM_PYTHON)")
    _serve_across_steps(tmp_path, world=2, nemo_gym=True)


@pytest.mark.slow  # four processes on two cores
def test_tp2_dp2_one_url_per_data_parallel_replica(tmp_path):
    _serve_across_steps(tmp_path, world=4)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "field"),
    [({"SERVE_RANKS": "1"}, "serve=True"), ({"NO_LOCKSTEP": "1"}, "tp_lockstep=False")],
    ids=["server-on-a-follower", "no-lockstep"],
)
def test_a_layout_that_cannot_route_is_refused_on_every_rank(tmp_path, env, field):
    ranks = Ranks(tmp_path, 2, ROLE_ONLY="1", **env)
    recs = ranks.finish()
    for rec in recs:
        assert rec["error"] and "ServingTopologyError: " in rec["error"] and field in rec["error"], rec
        assert rec["stopped_within_bound"] is True
