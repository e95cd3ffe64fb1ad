"""Every relative link in the Markdown pages outside docs/ (README.md, CHANGELOG.md, bench/*.md) reaches a file of
the repository, and an anchor in it reaches a heading of the page it names (docs/ is checked by ``mkdocs build
--strict``, which ``make docs`` and CI run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "bench").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown page's headings get on GitHub: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces turned into hyphens."""
    anchors = set()
    for line in _FENCE.sub("", text).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    """What is wrong with each relative link of ``page``: a target that is not there, or an anchor that names no
    heading of the target page."""
    wrong = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this test's job
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        shown = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest.name
        if not dest.exists():
            wrong.append(f"{target}: no file {shown}")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text(encoding="utf-8")):
            wrong.append(f"{target}: no heading of {shown} has the anchor #{anchor}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    wrong = broken_links(page)
    assert not wrong, f"{page.relative_to(ROOT)}: " + "; ".join(wrong)


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    """The check itself can fail: a link to a file that is not there and an anchor no heading has are both named."""
    (tmp_path / "other.md").write_text("# Other page\n\n## park_ceiling\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#park_ceiling) [gone](missing.md) [anchor](other.md#handoff_model) [self](#a-title)\n"
        "# A title\n```\n[in a fence](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    wrong = broken_links(page)
    assert len(wrong) == 2, wrong
    assert wrong[0].startswith("missing.md: no file")
    assert wrong[1] == "other.md#handoff_model: no heading of other.md has the anchor #handoff_model"
