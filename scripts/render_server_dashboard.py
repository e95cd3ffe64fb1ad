"""Draw the Grafana dashboard ``docs/dashboards/colo-fsm-server.json`` with matplotlib, from ``/metrics`` scrapes.

No Grafana server runs here, so each panel of the dashboard is drawn where Grafana would put it (its ``gridPos``
on Grafana's 24-column grid), from the very PromQL of its targets, evaluated over the series that
``bench/server_chaos.py`` scraped (``scripts/promql_subset.py``): time series panels as lines (stacked where the
panel stacks), stat panels as their last value. Quiet phases of the run are shaded.

    python bench/server_chaos.py
    python scripts/render_server_dashboard.py            # -> docs/screenshots/server-dashboard.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from promql_subset import evaluate, legend, parse, substitute

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "dashboards" / "colo-fsm-server.json"
SERIES = ROOT / "bench" / "results" / "server_chaos_series.json"
OUT = ROOT / "docs" / "screenshots" / "server-dashboard.png"
ROW_PX = 30  # Grafana's grid row height
UNITS = {"reqps": "req/s", "s": "s", "percentunit": "share", "short": ""}


def panel_series(panel: dict[str, Any], scrapes: list[dict[str, Any]], rate_window: str) -> dict[str, list[float]]:
    """``{legend: [value at each scrape]}`` for every series of every target of ``panel``."""
    out: dict[str, list[float]] = {}
    for target in panel.get("targets", []):
        node = parse(substitute(target["expr"], rate_window))
        for i in range(len(scrapes)):
            for labels, v in evaluate(node, scrapes, i).items():
                name = legend(target.get("legendFormat", ""), labels) or target["refId"]
                out.setdefault(name, [math.nan] * len(scrapes))[i] = v
    return out


def render(dashboard: dict[str, Any], series: dict[str, Any], out: Path, rate_window: str = "15s") -> Path:
    """Draw ``dashboard``'s panels from ``series`` (``{"phases", "scrapes"}``) into the PNG ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scrapes = series["scrapes"]
    if len(scrapes) < 2:
        raise SystemExit("fewer than two scrapes: run bench/server_chaos.py first")
    t0 = scrapes[0]["t"]
    xs = [s["t"] - t0 for s in scrapes]
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_in = 20.0
    fig = plt.figure(figsize=(width_in, width_in * rows * ROW_PX / (24 * 45)), dpi=80)
    top, bottom = 0.035, 0.02  # room for the figure's title and the x axis' name
    unit_h = (1 - top - bottom) / rows
    pad_x, pad_title, pad_ticks = 0.012, 0.55 * unit_h, 0.75 * unit_h
    fig.suptitle(
        f"{dashboard['title']}: the Grafana dashboard's panels drawn from /metrics scrapes of the CPU demo under "
        "chaos (grey: quiet phases)",
        fontsize=12,
        y=1 - 0.01,
    )
    for p in panels:
        g = p["gridPos"]
        y_top = 1 - top - g["y"] * unit_h
        ax = fig.add_axes(
            (
                g["x"] / 24 + 2 * pad_x,
                y_top - g["h"] * unit_h + pad_ticks,
                g["w"] / 24 - 3 * pad_x,
                g["h"] * unit_h - pad_title - pad_ticks,
            )
        )
        data = panel_series(p, scrapes, rate_window)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        ax.set_title(p["title"], fontsize=10, loc="left")
        if p["type"] == "stat":
            last = [v[-1] for v in data.values() if v and not math.isnan(v[-1])]
            value = sum(last) if last else math.nan
            text = f"{value:.0%}" if unit == "percentunit" else f"{value:,.2f}".rstrip("0").rstrip(".")
            ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=26, transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for kind, a, b in series.get("phases", []):
            if kind == "quiet":
                ax.axvspan(a - t0, b - t0, color="0.9", zorder=0)
        stacked = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode")
        names = sorted(n for n in data if any(not math.isnan(v) for v in data[n]))
        if not names:
            ax.text(
                0.5,
                0.5,
                "no data in this run",
                ha="center",
                va="center",
                fontsize=11,
                color="0.5",
                transform=ax.transAxes,
            )
        if stacked == "normal" and names:
            ys = [[0.0 if math.isnan(v) else v for v in data[n]] for n in names]
            ax.stackplot(xs, ys, labels=names, alpha=0.7)
        else:
            for n in names:
                ax.plot(xs, data[n], label=n, linewidth=1.2)
        ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(xs[0], xs[-1])
        if names:
            ax.legend(fontsize=7, loc="upper left", ncol=min(4, len(names)), framealpha=0.6)
        ax.grid(alpha=0.3)
    fig.text(0.5, 0.004, "x axes: seconds since the first scrape", ha="center", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dashboard", default=str(DASHBOARD))
    ap.add_argument("--series", default=str(SERIES), help="bench/server_chaos.py's scraped series (JSON)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--rate-window", default="15s", help="what $__rate_interval stands for (default 15s)")
    args = ap.parse_args(argv)
    dashboard = json.loads(Path(args.dashboard).read_text())
    series = json.loads(Path(args.series).read_text())
    print(render(dashboard, series, Path(args.out), args.rate_window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
