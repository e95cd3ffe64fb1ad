"""The server's in-flight policy: park, drain and abort (aliases keep/wait) accepted alike by ServerSettings and
GatedEngine, taken from the engine when unset, and refused when the gate cannot honour it; /health says which
policy and which log-prob distribution (the engine's logprobs_mode) the server serves."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from _server_fake import FakeEngine, serve_fake

from colo_fsm.errors import ConfigError, WaitTimeout
from colo_fsm.server import GatedEngine, ServerSettings


def _engine(inflight: str | None) -> FakeEngine:
    eng = FakeEngine(step_s=0.05)
    if inflight is not None:
        eng.inflight = inflight  # type: ignore[attr-defined]
    return eng


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("park", "park"),
        ("keep", "park"),
        ("drain", "drain"),
        ("wait", "drain"),
        ("abort", "abort"),
        (" Abort ", "abort"),
    ],
)
def test_settings_take_every_policy_and_alias(value: str, want: str) -> None:
    assert ServerSettings(inflight=value).inflight == want
    assert ServerSettings().inflight is None and ServerSettings().inflight_policy == "park"


def test_a_bad_policy_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="inflight.*'abort'"):
        ServerSettings(inflight="sleep")
    with pytest.raises(ConfigError, match="inflight"):
        GatedEngine(_engine(None), _engine(None), inflight="sleep")


def test_unset_policy_is_the_engines_own() -> None:
    for engine_policy, want in ((None, "park"), ("abort", "abort"), ("drain", "drain"), ("keep", "park")):
        eng = _engine(engine_policy)
        gated = GatedEngine(eng, eng)
        assert gated.inflight == want and gated.settings.inflight == want, engine_policy


def test_a_policy_the_gate_cannot_honour_is_refused() -> None:
    eng = _engine("park")
    with pytest.raises(ConfigError, match="engine's own inflight='park'"):
        GatedEngine(eng, eng, inflight="abort")  # only the engine can abort its requests
    with pytest.raises(ConfigError, match="settings.inflight='drain'"):
        GatedEngine(eng, eng, inflight="park", settings=ServerSettings(inflight="drain"))
    assert GatedEngine(eng, eng, inflight="drain").inflight == "drain"  # a draining gate over a parking engine


def test_abort_is_served_like_park_and_reported() -> None:
    """With inflight='abort' a suspend does not wait for a running HTTP request (the engine ends and resubmits
    it), the request is answered after the resume, and /health reports the policy. Forced: the engine holds the
    request after its 2nd token (of 6) until the suspend has returned, so it is still in flight whatever the timing.
    ``drain_timeout_s`` bounds only a failing run: the hand-over leaves the gate at once, the held request never."""
    eng = _engine("abort")
    gated, _ = serve_fake(eng, drain_timeout_s=10.0)
    url = gated.server_base_urls()[0]
    try:
        assert gated.inflight == "abort"
        assert httpx.get(url.removesuffix("/v1") + "/health").json()["inflight_policy"] == "abort"
        with concurrent.futures.ThreadPoolExecutor(1) as pool, eng.hold_at(2) as hold:
            fut = pool.submit(
                httpx.post,
                url + "/completions",
                json={"prompt": "12345>", "max_tokens": 8, "temperature": 0},
                timeout=60,
            )
            assert hold.reached.wait(30), "the request never made its 2nd token"
            assert len(eng._active) == 1, "the request to be running in the engine"
            try:
                gated.suspend()  # a drain would wait for the held request (and time out)
            except WaitTimeout:
                hold.release.set()  # let the request end, so the pool's thread does
                pytest.fail("the suspend waited for the HTTP request (drained, not aborted/parked)")
            assert len(eng._active) == 1 and not fut.done()
            hold.release.set()  # the engine is asleep: the request stays in it until the resume
            gated.resume()
            r = fut.result(30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "54321"
    finally:
        gated.shutdown()


@pytest.mark.parametrize("mode", ["processed", "raw", None])
def test_health_names_the_engines_logprobs_mode(mode: str | None) -> None:
    """A client reading behaviour log-probs over HTTP can tell which distribution they are of."""
    eng = _engine(None)
    if mode is not None:
        eng.logprobs_mode = mode  # type: ignore[attr-defined]
    gated, _ = serve_fake(eng)
    try:
        h = httpx.get(gated.server_base_urls()[0].removesuffix("/v1") + "/health").json()
        assert h.get("logprobs_mode", "absent") == mode
    finally:
        gated.shutdown()
