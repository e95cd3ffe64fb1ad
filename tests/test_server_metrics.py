"""``GET /metrics`` through prometheus-client, scraped with Prometheus' own text parser while a real Lifecycle runs
steps and clients load the server: every scrape parses; requests by endpoint and outcome, tokens, the queue wait,
the engine's queued/running/parked requests, the lifecycle state with time per state, the handoff histogram, the
weight version and the step rate are there, with the serving rank; counters only grow and end equal to what
``/health`` counts."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from _server_fake import FakeEngine, serve_fake
from prometheus_client.parser import text_string_to_metric_families

from colo_fsm import Lifecycle, LifecycleConfig
from colo_fsm.server import GatedEngine, OpenAIServer, ServerSettings
from colo_fsm.server.templates import digits_chat_template
from colo_fsm.testing.fakes import recording_adapters


def scrape(root: str) -> dict[str, Any]:
    """``{family name: family}`` of one scrape, parsed by prometheus-client's text parser."""
    r = httpx.get(root + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.headers
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(fams: dict[str, Any], name: str, sample: str | None = None, **labels: str) -> float:
    """The sum of the samples of family ``name`` (sample name ``sample``) whose labels include ``labels``."""
    assert name in fams, f"no series {name} in /metrics"
    fam = fams[name]
    want = sample or name
    return sum(s.value for s in fam.samples if s.name == want and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_parse_under_load_with_a_lifecycle_running() -> None:
    _, _, trainer, collector, drain = recording_adapters()
    eng = FakeEngine(step_s=0.001)
    gated = GatedEngine(
        eng,
        eng,
        serve=True,
        chat_template=digits_chat_template,
        settings=ServerSettings(max_inflight_tokens=400),
        request_timeout_s=30.0,
    )
    steps = 6
    lc = Lifecycle(gated, trainer, collector, config=LifecycleConfig(num_steps=1000), drain=drain)
    gated.attach_lifecycle(lc)
    lc.start()
    url = gated.server_base_urls()[0]
    root = url.removesuffix("/v1")
    port = gated.server.port
    stop = threading.Event()
    scrapes: list[dict[str, Any]] = []
    problems: list[str] = []

    def client(i: int) -> None:
        with httpx.Client(timeout=60) as h:
            k = 0
            while not stop.is_set():
                k += 1
                if k % 5 == 0:  # a bad request now and then
                    h.post(url + "/completions", json={"prompt": "1>", "max_tokens": 0})
                elif k % 7 == 0:  # a client gone mid-upload: half a body, then the connection closed
                    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                        sock.sendall(
                            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b'Content-Length: 40\r\n\r\n{"prompt":'
                        )
                elif k % 3 == 0:  # a stream, read whole or left after its first line
                    with h.stream(
                        "POST", url + "/completions", json={"prompt": "12>", "max_tokens": 6, "stream": True}
                    ) as r:
                        for _line in r.iter_lines():
                            if (i + k) % 2:
                                break
                else:
                    r = h.post(
                        url + "/chat/completions", json={"messages": [{"role": "user", "content": "21"}], "n": 2}
                    )
                    if r.status_code not in (200, 429):
                        problems.append(f"client {i}: {r.status_code} {r.text[:200]}")

    def scraper() -> None:
        while not stop.is_set():
            try:
                scrapes.append(scrape(root))
            except Exception as exc:  # a scrape that does not parse is what this test is about
                problems.append(f"scrape: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)] + [threading.Thread(target=scraper)]
    for t in threads:
        t.start()
    try:
        for _ in range(steps):  # the run goes on (serving) after these: the clients never meet its end
            lc.step([1, 2])
            while len(scrapes) < 2 * lc.step_index and not problems:  # scrapes land between every two steps
                stop.wait(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    try:
        assert problems == [], problems[:5]
        assert len(scrapes) >= 2 * steps
        answered = [
            value(f, "colo_fsm_http_requests", "colo_fsm_http_requests_total", outcome="answered") for f in scrapes
        ]
        assert answered == sorted(answered) and answered[-1] > 0  # a counter only grows
        # the clients are joined, but the server may still be ending what they left (an upload or stream given up,
        # recorded once its clean-up runs): read the final scrape and /health once that is done (bounded), so the
        # two snapshots, taken one after the other, describe the same finished traffic
        deadline = time.monotonic() + 30
        while True:
            final = scrape(root)
            h = httpx.get(root + "/health", timeout=30).json()
            if settled(final, h) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for outcome in OUTCOMES:
            got = value(final, "colo_fsm_http_requests", "colo_fsm_http_requests_total", outcome=outcome)
            assert got == h["responses"][outcome], (outcome, got, h["responses"])
        assert h["responses"]["error"] == 0 and h["responses"]["bad_request"] > 0 and h["responses"]["client_gone"] > 0
        gone = value(final, "colo_fsm_http_client_outcomes", "colo_fsm_http_client_outcomes_total", stage="upload")
        assert gone == h["responses"]["client_by_stage"]["upload"] > 0
        ranks = {s.labels.get("rank") for fam in final.values() for s in fam.samples if fam.name.startswith("colo_fsm")}
        assert ranks == {"0"}, ranks  # every series names the serving rank
        # the lifecycle, from its trace
        assert value(final, "colo_fsm_train_steps", "colo_fsm_train_steps_total") == steps
        assert value(final, "colo_fsm_weight_version") == steps
        states = {s.labels["state"]: s.value for s in final["colo_fsm_lifecycle_state"].samples}
        assert states[lc.state.value] == 1.0 and sum(states.values()) == 1.0
        assert set(states) >= {"Generating", "Draining", "Training", "Stopped"}
        secs = {s.labels["state"]: s.value for s in final["colo_fsm_lifecycle_state_seconds"].samples}
        assert secs["Generating"] > 0 and secs["Training"] >= 0
        assert value(final, "colo_fsm_train_step_rate") > 0
        # a handoff per step (the gate closed to reopened), the queue wait of every admitted request
        assert value(final, "colo_fsm_handoff_duration_seconds", "colo_fsm_handoff_duration_seconds_count") == steps
        waited = value(final, "colo_fsm_http_queue_wait_seconds", "colo_fsm_http_queue_wait_seconds_count")
        assert waited == h["requests"]["admitted"] > 0
        # tokens and the engine's slot counts
        assert value(final, "colo_fsm_http_tokens_admitted", "colo_fsm_http_tokens_admitted_total") > 0
        assert value(final, "colo_fsm_http_tokens_held") == 0 and value(final, "colo_fsm_http_tokens_limit") == 400
        engine = {(s.labels["priority"], s.labels["state"]): s.value for s in final["colo_fsm_engine_requests"].samples}
        assert set(engine) == {(p, st) for p in ("training", "server") for st in ("queued", "running", "parked")}
        assert h["engine_requests"]["server"] == {"queued": 0, "running": 0, "parked": 0}
    finally:
        lc.stop()


OUTCOMES = ("answered", "bad_request", "client_gone", "error")


def settled(final: dict[str, Any], h: dict[str, Any]) -> bool:
    """Whether a scrape and the /health read after it agree on finished traffic: every outcome counted alike, every
    admitted request's queue wait observed, no tokens held and no request of the server's in the engine."""
    return (
        all(
            value(final, "colo_fsm_http_requests", "colo_fsm_http_requests_total", outcome=o) == h["responses"][o]
            for o in OUTCOMES
        )
        and value(final, "colo_fsm_http_queue_wait_seconds", "colo_fsm_http_queue_wait_seconds_count")
        == h["requests"]["admitted"]
        and value(final, "colo_fsm_http_tokens_held") == 0
        and not any(h["engine_requests"]["server"].values())
    )


@contextmanager
def served(rank: int) -> Iterator[tuple[FakeEngine, str]]:
    """A FakeEngine brought up and an OpenAIServer over it at ``rank``: ``(engine, root URL)``; both stopped after."""
    eng = FakeEngine()
    server = OpenAIServer(eng, tokenizer=eng.tokenizer, rank=rank, chat_template=digits_chat_template)
    eng.bring_up()
    url = server.start()
    try:
        yield eng, url.removesuffix("/v1")
    finally:
        server.stop()
        eng.shutdown()


def test_every_series_carries_the_serving_rank() -> None:
    with served(rank=3) as (_, root):
        assert httpx.post(root + "/v1/completions", json={"prompt": "12>", "max_tokens": 2}).status_code == 200
        fams = scrape(root)
        ranks = {s.labels.get("rank") for fam in fams.values() for s in fam.samples if fam.name.startswith("colo_fsm")}
        assert ranks == {"3"}
        assert value(fams, "colo_fsm_http_requests", "colo_fsm_http_requests_total", outcome="answered") == 1


def test_without_a_trace_the_lifecycle_state_comes_from_the_status() -> None:
    gated, _ = serve_fake(status=lambda: {"state": "Training", "weight_version": 7})
    try:
        fams = scrape(gated.server_base_urls()[0].removesuffix("/v1"))
        assert value(fams, "colo_fsm_lifecycle_state", state="Training") == 1.0
        assert value(fams, "colo_fsm_weight_version") == 7
        assert "colo_fsm_lifecycle_state_seconds" not in fams  # time per state needs the trace
    finally:
        gated.shutdown()


def test_the_engines_steps_are_counted_by_kind_and_by_captured_graph_where_it_keeps_a_profile() -> None:
    """An engine with a step profile (megatron-core's dynamic engine, either path) has its steps on ``/metrics``:
    per kind, and per captured decode-only graph with the requests those steps decoded (65 requests on the 128
    graph: about half full), read at each scrape, so the counters grow with the engine; an engine without one
    has no such series."""
    from colo_fsm.adapters.megatron.step_profile import StepProfile

    with served(rank=0) as (eng, root):
        assert not any(name.startswith("colo_fsm_engine_step") for name in scrape(root))  # no profile: no series
        profile = StepProfile()
        eng.step_profile = profile.snapshot  # type: ignore[attr-defined]
        profile.add("decode_graph", 0.010, 65, 0, 0, ran=65, graph=128)
        profile.add("decode_graph", 0.012, 66, 0, 0, ran=66, graph=128)
        profile.add("mixed_eager", 0.030, 70, 0, 4, ran=70)
        fams = scrape(root)
        assert value(fams, "colo_fsm_engine_steps", "colo_fsm_engine_steps_total", kind="decode_graph") == 2
        assert value(fams, "colo_fsm_engine_steps", "colo_fsm_engine_steps_total", kind="mixed_eager") == 1
        seconds = value(fams, "colo_fsm_engine_step_seconds", "colo_fsm_engine_step_seconds_total", kind="decode_graph")
        assert abs(seconds - 0.022) < 1e-9
        assert value(fams, "colo_fsm_engine_graph_steps", "colo_fsm_engine_graph_steps_total", graph="128") == 2
        requests = value(fams, "colo_fsm_engine_graph_requests", "colo_fsm_engine_graph_requests_total", graph="128")
        assert requests == 131 and requests / (2 * 128) < 0.52  # the padding an operator reads off
        errors = "colo_fsm_engine_step_record_errors"
        assert value(fams, errors, errors + "_total") == 0
        profile.add("decode_graph", 0.010, 120, 0, 0, ran=120, graph=128)
        assert value(scrape(root), "colo_fsm_engine_graph_steps", "colo_fsm_engine_graph_steps_total", graph="128") == 3


def test_a_step_profile_that_fails_to_read_leaves_every_other_series_on_the_scrape(caplog) -> None:
    """``/metrics`` answers with every other series when the engine's step profile raises or reads malformed,
    counts each such scrape (a series an operator can alert on, there while the engine keeps a profile) and logs
    why once per server."""

    def broken() -> dict[str, float]:
        raise RuntimeError("profile gone")

    reads = "colo_fsm_engine_step_profile_read_errors"
    with served(rank=0) as (eng, root):
        whole = set(scrape(root))
        assert reads not in whole  # no profile: no such series
        eng.step_profile = broken  # type: ignore[attr-defined]
        fams = scrape(root)
        assert set(fams) == whole | {reads} and "colo_fsm_engine_requests" in fams
        assert value(fams, reads, reads + "_total") == 1
        eng.step_profile = lambda: {"decode_graph/graph/x/steps": 1}  # type: ignore[attr-defined]  # malformed
        fams = scrape(root)
        assert set(fams) == whole | {reads} and value(fams, reads, reads + "_total") == 2
        said = [r for r in caplog.records if "could not read the engine's step profile" in r.getMessage()]
        assert len(said) == 1  # logged once for the server, not at every scrape
        assert "rank 0" in said[0].getMessage()
        eng.step_profile = lambda: {}  # type: ignore[attr-defined]  # reads again: the count stays, the steps return
        fams = scrape(root)
        assert value(fams, reads, reads + "_total") == 2 and "colo_fsm_engine_step_record_errors" in fams


def _documented_series() -> set[str]:
    """The series names the ``/metrics`` table of docs/serving.md lists (its first column; ``_x`` after a name
    stands for that name with its last word replaced, as in ``colo_fsm_http_tokens_held, _limit``)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    table = text[text.index("## `/metrics` (Prometheus)") :]
    names: set[str] = set()
    rows = table.split("\n| series | type | what |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    for line in rows.splitlines():
        assert line.startswith("| `"), f"not a row of the series table: {line!r}"
        last = ""
        for name in re.findall(r"`([a-z_]+)(?:\{[^}]*\})?`", line.split(" | ")[0]):
            name = last.rsplit("_", 1)[0] + name if name.startswith("_") else name
            names.add(name)
            last = name
    return names


def test_the_docs_table_lists_every_series_and_no_other() -> None:
    """docs/serving.md's ``/metrics`` table is what an operator builds dashboards from: every series a server with
    every source (a lifecycle, an engine with request counts and a step profile) exposes is listed there, and
    nothing listed is missing from the scrape."""
    from colo_fsm.adapters.megatron.step_profile import StepProfile, totals
    from colo_fsm.server.lifecycle_clock import LifecycleReading
    from colo_fsm.server.metrics import ServerMetrics, ServerReading

    profile = StepProfile()
    profile.add("decode_graph", 0.01, 3, 0, 0, ran=3, graph=4)
    reading = ServerReading(
        tokens_held=1, tokens_limit=8, tokens_waiting=0, requests_waiting=0, requests_holding=1,
        tokens_admitted=1, requests_admitted=1, drain_tokens_per_s=0.5, stages={"engine": 1}, admitting=True,
        engine={"training": (0, 1, 0), "server": (0, 1, 0)}, server_slots=4,
        lifecycle=LifecycleReading(state="GENERATING", states=("GENERATING",), step=1, weight_version=1, records=1),
        engine_steps=totals(profile.snapshot()), engine_step_read_errors=0,
    )  # fmt: skip
    metrics = ServerMetrics(0)
    metrics.watch(lambda: reading)
    body, _ = metrics.exposition()
    exposed = set()
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name.endswith("_created"):  # prometheus-client's creation time of each counter and histogram
            continue
        exposed.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    documented = _documented_series()
    assert exposed - documented == set(), "exposed but not in docs/serving.md"
    assert documented - exposed == set(), "in docs/serving.md but not exposed"
