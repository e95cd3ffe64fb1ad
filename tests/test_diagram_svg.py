"""Pictures where people look: the SVG colo-fsm draws itself (docs site, run folder), and every picture's title.

The SVG is checked as a drawing (every state a box, every transition a curve with its label, no two boxes or
labels on top of each other), the docs pages are checked to show a picture wherever they hold Mermaid source
(a browser without a Mermaid script shows that source as raw text), and the committed pictures are checked
against the spec they were drawn from.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from colo_fsm import diagram
from colo_fsm.diagram.svg import edge_label_lines, to_svg, write_svg
from colo_fsm.errors import ConfigError
from colo_fsm.states import LIFECYCLE, NEMO_RL
from colo_fsm.states.spec import LifecycleSpec

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NS = {"s": "http://www.w3.org/2000/svg"}
SPECS = [LIFECYCLE, NEMO_RL]


def _boxes(svg: str) -> tuple[dict[str, tuple[float, float, float, float]], list[tuple[float, float, float, float]]]:
    """The state boxes by name and the edge-label boxes of ``svg``, as (x, y, w, h)."""
    root = ET.fromstring(svg)
    states: dict[str, tuple[float, float, float, float]] = {}
    for g in root.findall("s:g", NS):
        rect = g.find("s:rect", NS)
        name = g.find("s:text", NS)
        assert rect is not None and name is not None and name.text
        states[name.text] = tuple(float(rect.get(k, "0")) for k in ("x", "y", "width", "height"))  # type: ignore[assignment]
    labels = [
        tuple(float(r.get(k, "0")) for k in ("x", "y", "width", "height"))
        for r in root.findall("s:rect", NS)
        if r.get("fill-opacity") == "0.92"
    ]
    return states, labels  # type: ignore[return-value]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_svg_draws_every_state_and_transition(spec: LifecycleSpec) -> None:
    svg = to_svg(spec)
    root = ET.fromstring(svg)
    states, labels = _boxes(svg)
    assert set(states) == {s.state.value for s in spec.states}
    drawn = Counter(t.text for p in root.findall("s:path", NS) if (t := p.find("s:title", NS)) is not None and t.text)
    assert drawn == Counter(f"{t.source.value} -> {t.dest.value}" for t in spec.transitions)
    assert len(labels) == len(spec.transitions)
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for t in spec.transitions:
        assert all(line in texts for line in edge_label_lines(t)), t
    failed = " ".join(texts)
    assert all(s.value in failed for s in spec.failable()) and spec.fail_trigger in failed  # the failure note
    assert to_svg(spec) == svg  # deterministic: a committed picture can be checked by regenerating it


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_no_box_or_label_sits_on_another(spec: LifecycleSpec) -> None:
    states, labels = _boxes(to_svg(spec))
    boxes = [*states.values(), *labels]
    clashes = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if _overlap(a, b)]
    assert not clashes, clashes
    root = ET.fromstring(to_svg(spec))
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    assert all(0 <= x and x + w <= width and 0 <= y and y + h <= height for x, y, w, h in boxes)


def test_svg_options_and_bad_input(tmp_path: Path) -> None:
    bare = to_svg(LIFECYCLE, actions=False, conditions=False, title=None)
    assert "build_engine" not in bare and "engine absent" not in bare and "colo-fsm lifecycle" not in bare
    noted = to_svg(NEMO_RL, notes={"Training": ["policy.train()"]})
    assert "policy.train()" in noted
    with pytest.raises(ConfigError, match="notes"):
        to_svg(NEMO_RL, notes={"Nowhere": ["x"]})
    with pytest.raises(ConfigError, match="spec"):
        to_svg("lifecycle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"\.svg"):
        write_svg(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------------------------- titles
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_picture_is_titled_with_the_spec_name(spec: LifecycleSpec) -> None:
    want = f"colo-fsm lifecycle ({spec.name})"
    assert f"title: {want}\n" in diagram.to_mermaid(spec)
    assert f'label="{want}"' in diagram.to_dot(spec)  # Graphviz's png/svg/pdf are drawn from this source
    assert f"<title>{want}</title>" in to_svg(spec) and f">{want}</text>" in to_svg(spec)
    assert "(custom)" in diagram.to_mermaid(dataclasses.replace(spec, name="custom"))
    assert f">my {spec.name} picture</text>" in to_svg(spec, title="my {name} picture")


@pytest.mark.parametrize("fmt", ["mermaid", "dot", "svg"])
def test_cli_preset_diagram_carries_its_name(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    from colo_fsm.cli import main

    assert main(["diagram", "--spec", "nemo_rl", "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "colo-fsm lifecycle (nemo_rl)" in out and "colo-fsm lifecycle\n" not in out


def test_cli_svg_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from colo_fsm.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no dot anywhere
    out = tmp_path / "sub" / "nemo.svg"
    assert main(["diagram", "--spec", "nemo_rl", "--format", "svg", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == to_svg(NEMO_RL)
    assert main(["diagram", "--format", "svg", "-o", str(tmp_path / "x.png")]) == 2
    assert main(["diagram", "--format", "svg", "--direction", "LR"]) == 2  # not drawn that way: refused
    assert main(["diagram", "--format", "markdown", "--title", "x"]) == 2  # markdown has no title: refused
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------------------------- run folder
def test_run_folder_holds_a_lifecycle_picture_of_its_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from colo_fsm.demo.run import _write_artifacts

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Graphviz
    _write_artifacts(tmp_path, 1, NEMO_RL)  # no trace here: the timeline is skipped with a warning
    assert (tmp_path / "lifecycle.svg").is_file(), sorted(p.name for p in tmp_path.iterdir())
    svg = (tmp_path / "lifecycle.svg").read_text(encoding="utf-8")
    assert svg == to_svg(NEMO_RL) and "colo-fsm lifecycle (nemo_rl)" in svg and "Concluding" in svg
    assert (tmp_path / "lifecycle.mmd").read_text(encoding="utf-8") == diagram.to_mermaid(NEMO_RL)
    _write_artifacts(tmp_path, 1, LIFECYCLE)
    assert (tmp_path / "lifecycle.svg").read_text(encoding="utf-8") == to_svg(LIFECYCLE)


# ---------------------------------------------------------------------------------------------- docs site
_DOC_PAGES = [(DOCS / "lifecycle.md", LIFECYCLE), (DOCS / "nemo-rl.md", NEMO_RL)]


@pytest.mark.parametrize(("page", "spec"), _DOC_PAGES, ids=lambda v: getattr(v, "name", ""))
def test_docs_pictures_match_the_spec(page: Path, spec: LifecycleSpec) -> None:
    result = diagram.update_docs(page, spec, check=True, required=("picture", "mermaid"))
    assert "picture" not in result.changed, (
        f"{page.parent / diagram.picture_path(spec)} is out of date; run "
        f"`colo-fsm diagram --spec {spec.name} --update-docs {page.relative_to(ROOT)}`"
    )


def test_a_stale_or_missing_picture_is_found_and_rewritten(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("<!-- BEGIN GENERATED: picture -->\n<!-- END GENERATED: picture -->\n", encoding="utf-8")
    svg = tmp_path / diagram.picture_path(LIFECYCLE)
    assert diagram.update_docs(page, check=True, required=()).changed == ("picture",)
    assert not svg.exists()  # check writes nothing
    diagram.update_docs(page, required=())
    assert svg.read_text(encoding="utf-8") == to_svg(LIFECYCLE)
    assert diagram.update_docs(page, check=True, required=()).changed == ()
    variant = dataclasses.replace(LIFECYCLE, transitions=LIFECYCLE.transitions[:-1])
    assert diagram.update_docs(page, variant, check=True, required=()).changed == ("picture",)


def test_annotated_nemo_rl_picture_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("nemo_rl_diagram", DOCS / "_ext" / "nemo_rl_diagram.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.PICTURE.read_text(encoding="utf-8") == gen.annotated_svg(), (
        "docs/diagrams/nemo_rl_annotated.svg is out of date; run python docs/_ext/nemo_rl_diagram.py"
    )
    assert "prepare_for_refit()" in gen.annotated_svg()


def test_every_mermaid_block_on_the_site_has_its_picture() -> None:
    """The site has no Mermaid script (it must work offline): each Mermaid block is folded source under a
    picture of it, an SVG that exists in docs/."""
    nav_pages = sorted(DOCS.glob("*.md"))
    seen = 0
    for page in nav_pages:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```mermaid$", text, re.M):
            seen += 1
            before = text[: m.start()]
            fold = before.rfind('<details markdown="1">')
            assert fold > before.rfind("</details>"), f"{page.name}: a Mermaid block outside <details>"
            pics = re.findall(r"!\[[^\]]*\]\((diagrams/[^)]+\.svg)\)", before[max(0, fold - 600) : fold])
            assert pics, f"{page.name}: a Mermaid block without its picture just above it"
            assert (DOCS / pics[-1]).is_file(), pics[-1]
    assert seen >= 3
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "md_in_html" in mkdocs  # folds the source; the picture needs nothing but an <img>
    shots = sorted((DOCS / "screenshots").glob("*.png"))
    assert len(shots) >= 3 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in shots)


def test_a_self_loop_is_drawn_beside_its_state() -> None:
    t = LIFECYCLE.transitions[3]
    looped = dataclasses.replace(LIFECYCLE, transitions=(*LIFECYCLE.transitions, dataclasses.replace(t, dest=t.source)))
    svg = to_svg(looped)
    assert f"<title>{t.source.value} -&gt; {t.source.value}</title>" in svg
    states, labels = _boxes(svg)
    boxes = [*states.values(), *labels]
    assert len(labels) == len(looped.transitions)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if _overlap(a, b)]
