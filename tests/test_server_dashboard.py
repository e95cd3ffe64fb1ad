"""The Grafana dashboard (docs/dashboards/colo-fsm-server.json) is a dashboard Grafana can import, every query is in
the PromQL subset the renderer evaluates, every series it reads is one a live server exposes, and the renderer
draws it from real scrapes."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from _server_fake import serve_fake

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "dashboards" / "colo-fsm-server.json"


def _module(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "scripts"))


promql = _module("promql_subset")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def scrape_raw(root: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(httpx.get(root + "/metrics", timeout=30).text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def test_the_dashboard_is_a_grafana_dashboard_model() -> None:
    d = dashboard()
    for key in ("title", "uid", "panels", "schemaVersion", "time", "templating", "__inputs"):
        assert key in d, f"dashboard JSON without {key!r}"
    assert isinstance(d["schemaVersion"], int) and d["uid"] and d["title"]
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"] and d["__inputs"][0]["pluginId"] == "prometheus"
    assert {v["name"] for v in d["templating"]["list"]} == {"DS_PROMETHEUS", "rank"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        assert p["type"] in ("timeseries", "stat"), p["type"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("x", "y", "w", "h")) and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and t["expr"] and t["datasource"]["uid"] == "${DS_PROMETHEUS}"
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for what in ("outcome", "churn", "token", "queue wait", "engine", "lifecycle", "handoff", "step", "weight version"):
        assert what in titles, f"no panel about {what}"


def test_every_query_parses_and_reads_series_a_live_server_exposes() -> None:
    from colo_fsm.server.lifecycle_clock import LifecycleClock

    gated, _ = serve_fake()
    try:  # a lifecycle record, a request, a handoff: every family has its series
        gated.lifecycle_clock(
            type("R", (), {"dest": "Generating", "step": 0, "weight_version": 0, "t_enter": time.time(), "t_end": 0})()
        )
        assert isinstance(gated.lifecycle_clock, LifecycleClock)
        url = gated.server_base_urls()[0]
        assert httpx.post(url + "/completions", json={"prompt": "12>", "max_tokens": 2}).status_code == 200
        gated.suspend()
        gated.resume()
        exposed = set(scrape_raw(url.removesuffix("/v1")))
    finally:
        gated.shutdown()
    for p in dashboard()["panels"]:
        for t in p["targets"]:
            node = promql.parse(promql.substitute(t["expr"]))
            missing = promql.metric_names(node) - exposed
            assert not missing, f"panel {p['title']!r} reads series no server exposes: {missing}"


def test_the_promql_subset_computes_what_prometheus_would() -> None:
    def scrape(t: float, counter: float, buckets: dict[str, float]) -> dict[str, Any]:
        samples = {
            "x_total": [[{"rank": "0", "k": "a"}, counter], [{"rank": "0", "k": "b"}, 2 * counter]],
            "h_bucket": [[{"rank": "0", "le": le}, v] for le, v in buckets.items()],
        }
        return {"t": t, "samples": samples}

    scrapes = [
        scrape(0.0, 0.0, {"0.1": 0, "1.0": 0, "+Inf": 0}),
        scrape(10.0, 50.0, {"0.1": 10, "1.0": 30, "+Inf": 40}),
    ]
    rate = promql.parse('sum by (k) (rate(x_total{rank=~".*"}[1m]))')
    got = promql.evaluate(rate, scrapes, 1)
    assert got == {(("k", "a"),): 5.0, (("k", "b"),): 10.0}
    assert promql.evaluate(promql.parse("sum(rate(x_total[1m]))"), scrapes, 1) == {(): 15.0}
    q = promql.parse("histogram_quantile(0.5, sum by (le) (rate(h_bucket[1m])))")
    # 40 observations: 10 <= 0.1, 20 more <= 1.0: the 20th lies half way through (0.1, 1.0]
    assert promql.evaluate(q, scrapes, 1)[()] == pytest.approx(0.55)
    ratio = promql.parse('sum(x_total{k="a"}) / sum(x_total{k="b"})')
    assert promql.evaluate(ratio, scrapes, 1) == {(): 0.5}
    assert math.isnan(promql.evaluate(q, scrapes[:1], 0).get((), math.nan))
    for bad in ("rate(x_total)", "sum by (k (x)", 'x{k~="a"}', "avg(x)"):
        with pytest.raises(promql.PromQLError):
            promql.parse(bad)


def test_the_renderer_draws_every_panel_from_scrapes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    render = _module("render_server_dashboard")
    gated, _ = serve_fake()
    scrapes = []
    try:
        url = gated.server_base_urls()[0]
        for i in range(3):
            httpx.post(url + "/completions", json={"prompt": "12>", "max_tokens": 2})
            scrapes.append({"t": float(i), "samples": scrape_raw(url.removesuffix("/v1"))})
    finally:
        gated.shutdown()
    out = render.render(dashboard(), {"phases": [["quiet", 0.0, 1.0]], "scrapes": scrapes}, tmp_path / "d.png")
    assert out.stat().st_size > 10_000
    series = render.panel_series(dashboard()["panels"][4], scrapes, "15s")  # requests by outcome
    assert series["answered"][-1] == pytest.approx(1.0)  # one more answered per (fake) second
