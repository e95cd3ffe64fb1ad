"""Every relative link in the Markdown pages outside docs/ (README.md, CHANGELOG.md, bench/*.md) reaches a file of
the repository, and an anchor in it reaches a heading of the page it names (docs/ is checked by ``mkdocs build
--strict``, which ``make docs`` and CI run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "bench").glob("*.md"))]
# [text](target) or [text](<target> "title"); the text may hold one level of brackets ([`a[0]`](x.md))
_INLINE = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)  # [name]: target
_FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)(?:\s+#+)?\s*$")


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown page's ATX headings get on GitHub: the title with its links' text only, lower case,
    punctuation but ``-`` and ``_`` dropped, spaces turned into hyphens, ``-1``, ``-2`` ... after a repeat."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _FENCE.sub("", text).splitlines():
        m = _HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def link_targets(text: str) -> list[str]:
    """Every link target of a Markdown text outside its code fences: inline links and reference definitions."""
    body = _FENCE.sub("", text)
    return [t.strip("<>") for t in _INLINE.findall(body) + _REFERENCE.findall(body)]


def broken_links(page: Path) -> list[str]:
    """What is wrong with each relative link of ``page``: a target that is not there, or an anchor that names no
    heading of the target page."""
    wrong = []
    for target in link_targets(page.read_text(encoding="utf-8")):
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
    """The check itself can fail: a link to a file that is not there and an anchor no heading has are both named,
    in every link form the pages use or may use; what is in a code fence is not a link."""
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## park_ceiling ##\n\n## Runs\n\n## Runs\n\n#123 is not a heading\n", encoding="utf-8"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#park_ceiling) [gone](missing.md) [anchor](other.md#handoff_model) [self](#a-title)\n"
        '[titled](<other.md#runs-1> "a title") [`a[0]`](other.md#123-is-not-a-heading) [ref][r]\n'
        "[r]: gone-too.md\n"
        "# A [title](other.md)\n```\n[in a fence](nowhere.md)\n```\n~~~\n[in another](nowhere.md)\n~~~\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no file missing.md",
        "other.md#handoff_model: no heading of other.md has the anchor #handoff_model",
        "other.md#123-is-not-a-heading: no heading of other.md has the anchor #123-is-not-a-heading",
        "gone-too.md: no file gone-too.md",
    ]
