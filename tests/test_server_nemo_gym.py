"""nemo-gym 0.7.0's own clients against colo-fsm's server, across suspends.

The clients run in a subprocess of the Python 3.13 venv that ``make test`` sets up (``make nemo-gym-venv``;
nemo-gym needs 3.13); the server runs here. ``NeMoGymAsyncOpenAI`` (completions, chat, tokenize, responses,
models) and the ``VLLMModel`` responses server with ``return_token_id_information=True``, over chat and with
``use_completions_api=True``. Every suspend lands while a request is mid-generation, so requests are parked and
resumed under the clients; the token ids and log-probs they receive must be exactly what the engine generated.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _megatron_util import dist1, tiny  # noqa: F401
from _server_fake import FakeEngine

from colo_fsm.server import GatedEngine
from colo_fsm.server.templates import digits_chat_template
from tests.support.holds import FirstRequestHold

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("nemo_gym_driver.py")


def _gym_python() -> str:
    """The 3.13 venv's interpreter, or skip naming why it is absent."""
    explicit = os.environ.get("COLO_FSM_NEMO_GYM_PYTHON")
    candidates = [explicit] if explicit else [str(ROOT / ".venv-gym" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    if not (shutil.which("python3.13") or list(Path.home().glob(".pyenv/versions/3.13*/bin/python"))):
        pytest.skip("python3.13 is absent on this machine (nemo-gym 0.7.0 needs Python 3.13)")
    pytest.skip(f"the nemo-gym venv is not set up ({candidates[0]}): run `make nemo-gym-venv` (make test does)")


class Recording:
    """Wraps an engine; keeps every handle ``submit`` returned, to compare with what the clients received. With
    ``hold`` (:class:`~tests.support.holds.FirstRequestHold`), its first request that may make two tokens waits at
    its first token until the test's suspend is queued, so it spans that suspend."""

    def __init__(self, engine: Any, hold: FirstRequestHold | None = None) -> None:
        self._engine = engine
        self.handles: list[Any] = []
        self.hold = hold

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, prompt_ids: Any, **kw: Any) -> Any:
        if self.hold is not None:
            self.hold.wrap(kw, len(self.handles))
        h = self._engine.submit(prompt_ids, **kw)
        self.handles.append(h)
        return h

    def generated(self) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...], tuple[int, ...]]]:
        outs = [h.future.result(30) for h in self.handles]
        return [(tuple(o.prompt_ids), tuple(o.token_ids), tuple(o.logprobs), tuple(o.weight_versions)) for o in outs]


def _has_running(engine: Any) -> bool:
    if isinstance(engine, FakeEngine):
        return any(len(r.ids) >= 1 for r in list(engine._active))
    return bool(engine.request_counts().running)


@pytest.fixture(params=["megatron-cpu"])
def engine(request: Any) -> Any:
    """The real MegatronEngine (CPU backend, tiny GPT; weight version bumped at each resume); add "fake" to the
    params to run the same clients over the contract fake (tests/_server_fake.py)."""
    if request.param == "fake":
        return FakeEngine(step_s=0.01)
    from colo_fsm.adapters.megatron.engine import MegatronEngine
    from colo_fsm.adapters.megatron.tokenizer import CharTokenizer

    request.getfixturevalue("dist1")
    tok = CharTokenizer("0123456789>")
    box = {"v": 0}
    eng = MegatronEngine(tiny(tok), tok, weight_version=lambda: box["v"])
    eng.version_box = box  # type: ignore[attr-defined]
    return eng


def test_nemo_gym_clients_across_suspends(engine: Any, tmp_path: Path) -> None:
    gym_python = _gym_python()
    eng = engine
    hold = FirstRequestHold(lambda t: eng._batcher.wait_for_control(t)) if hasattr(eng, "_batcher") else None
    rec = Recording(eng, hold)
    gated = GatedEngine(eng, rec, serve=True, chat_template=digits_chat_template, request_timeout_s=60.0)
    gated.bring_up()
    stop = threading.Event()
    handoffs = {"n": 0}

    def cycle() -> None:  # a suspend only while a request is mid-generation: it is parked, then resumed
        while not stop.is_set():
            if _has_running(eng):
                gated.suspend()
                handoffs["n"] += 1
                if hasattr(eng, "version_box"):
                    eng.version_box["v"] += 1  # a training step: the parked requests continue on new weights
                time.sleep(0.05)
                gated.resume()
                time.sleep(0.05)
            time.sleep(0.002)

    cycler = threading.Thread(target=cycle, daemon=True)
    cycler.start()
    prompts = ["123", "4567", "89"]
    try:
        p = subprocess.run(
            [gym_python, str(DRIVER)],
            env={
                **os.environ,
                "NEMO_GYM_DRIVER_URL": gated.server_base_urls()[0],
                "NEMO_GYM_DRIVER_PROMPTS": json.dumps(prompts),
            },
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,  # nemo-gym (hydra) writes an outputs/ folder into its working directory
        )
    finally:
        stop.set()
        cycler.join(10)
    try:
        assert p.returncode == 0, p.stderr[-3000:]
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("NEMO_GYM_RESULT "))
        out = json.loads(line.removeprefix("NEMO_GYM_RESULT "))
        gen = rec.generated()
        by_tokens = {(g[1], g[2]): g for g in gen}
        tok = eng.tokenizer
        assert handoffs["n"] >= 1 and getattr(eng, "asleep_submits", 0) == 0
        assert any(len(set(g[3])) > 1 for g in gen), "no request spanned a suspend"
        if hold is not None:  # the held request was parked by a suspend and finished under the next version
            assert hold.index is not None and hold.failed is None, hold.failed
            assert len(set(gen[hold.index][3])) > 1, gen[hold.index]
        assert out["models"]["data"][0]["id"] == "colo-fsm"
        for c in out["completions"]:
            ch = c["choices"][0]
            ids = tuple(int(t.removeprefix("token_id:")) for t in ch["logprobs"]["tokens"])
            assert ids == tuple(ch["token_ids"]) and (ids, tuple(ch["logprobs"]["token_logprobs"])) in by_tokens
        for c in out["chat"]:
            ch = c["choices"][0]
            lps = tuple(e["logprob"] for e in ch["logprobs"]["content"])
            assert (tuple(ch["token_ids"]), lps) in by_tokens
        assert out["tokenize"]["tokens"] == tok.tokenize(prompts[0])
        assert out["response"]["output"][0]["content"][0]["type"] == "output_text"
        for mode, template in (("vllm_chat", digits_chat_template), ("vllm_completions", None)):
            assert len(out[mode]) == len(prompts)
            for prompt, resp in zip(prompts, out[mode]):
                msg = resp["output"][-1]
                key = (tuple(msg["generation_token_ids"]), tuple(msg["generation_log_probs"]))
                assert key in by_tokens, (mode, key)
                text = template([{"role": "user", "content": prompt}]) if template else prompt
                assert msg["prompt_token_ids"] == tok.tokenize(text) == list(by_tokens[key][0])
                assert msg["content"][0]["text"] == tok.detokenize(msg["generation_token_ids"])
        generated_texts = {tok.detokenize(g[1]) for g in gen}
        assert [r["output"][-1]["content"][0]["text"] in generated_texts for r in out["vllm_default"]] == [True] * 3
    finally:
        gated.shutdown()
