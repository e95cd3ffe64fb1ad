"""Screenshot the built docs site's diagrams with headless Chromium (the proof that the site draws them).

Builds the site (``mkdocs build --strict``) into a temporary folder, opens each page that shows a lifecycle
picture in headless Chromium and saves the part of the page from its diagram's heading down as a PNG under
``docs/screenshots/``, then the NEMO_RL picture at its full size (what a click on a picture opens). Needs ``chromium`` (Debian: ``apt-get install chromium``) and Pillow (a matplotlib
dependency). Run from the repository root: ``python scripts/docs_screenshots.py``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAGES: tuple[tuple[str, str, str], ...] = (
    ("lifecycle", "#diagram", "lifecycle.png"),
    ("nemo-rl", "#diagram", "nemo-rl.png"),
    ("embedding", "img[src$='nemo_rl_annotated.svg']", "embedding.png"),
)
"""(page, CSS selector of the element the shot starts at, screenshot file name)."""

_WIDTH, _TALL, _HEIGHT = 1280, 9000, 1700
_PROBE = (
    '<script>window.addEventListener("load", () => {{ const e = document.querySelector("{anchor}"); '
    'document.title = "Y=" + Math.round(e.getBoundingClientRect().top + window.scrollY); }});</script></body>'
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no chromium on PATH: apt-get install chromium")


def _run(browser: str, *args: str) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)
    return proc.stdout


def shoot(site: Path, page: str, anchor: str, out: Path, browser: str) -> Path:
    """Save the part of ``page`` from ``anchor`` down (``_HEIGHT`` pixels) as ``out``."""
    from PIL import Image

    html = site / page / "index.html"
    probe = html.with_name("probe.html")
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", _PROBE.format(anchor=anchor), 1), "utf-8")
    dom = _run(browser, f"--window-size={_WIDTH},{_TALL}", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    m = re.search(r"<title>Y=(\d+)</title>", dom)
    if not m:
        raise SystemExit(f"{page}: could not find {anchor} on the page")
    top = max(0, int(m.group(1)) - 80)
    full = out.with_suffix(".full.png")
    _run(browser, f"--window-size={_WIDTH},{_TALL}", f"--screenshot={full}", html.as_uri())
    with Image.open(full) as img:
        img.crop((0, top, _WIDTH, min(img.height, top + _HEIGHT))).save(out, optimize=True)
    full.unlink()
    return out


def main(argv: list[str]) -> int:
    """Build the site, screenshot every page of :data:`PAGES` into ``--out`` (default docs/screenshots)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args(argv)
    browser = _chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)], cwd=ROOT, check=True
        )
        for page, anchor, name in PAGES:
            print(f"wrote {shoot(site, page, anchor, args.out / name, browser)}")
        # what a click on a picture opens: the SVG at its full size, as the browser draws it
        svg = site / "diagrams" / "nemo_rl.svg"
        m = re.search(r'width="([\d.]+)" height="([\d.]+)"', svg.read_text(encoding="utf-8"))
        assert m, svg
        size = f"{int(float(m.group(1))) + 1},{int(float(m.group(2))) + 1}"
        out = args.out / "nemo_rl-full-size.png"
        _run(browser, f"--window-size={size}", f"--screenshot={out}", svg.as_uri())
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
