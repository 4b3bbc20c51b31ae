"""The documentation: a README that is a first page, and links into docs/ that resolve."""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.anchors import anchors_plugin

from support import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
# The README is read first: past this it is no first page any more.
README_MAX_LINES = 200


def _parser() -> MarkdownIt:
    # GitHub's dialect as far as links and headings go: tables, and an anchor per heading
    # named the way GitHub names it (duplicates get -1, -2, ...).
    return MarkdownIt("commonmark").enable("table").use(anchors_plugin, min_level=1, max_level=6)


def _links_and_anchors(path: Path) -> tuple[list[str], set[str]]:
    links, anchors = [], set()
    for token in _parser().parse(path.read_text()):
        if token.type == "heading_open":
            anchors.add(str(token.attrs["id"]))
        for child in token.children or []:
            if child.type in ("link_open", "image"):
                links.append(str(child.attrs.get("href") or child.attrs.get("src")))
    return links, anchors


def test_readme_is_a_first_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert script in text.split("\n## ", 1)[0], f"{script} is not among the README's first commands"
        assert os.access(REPO / script, os.X_OK), script
    links, _ = _links_and_anchors(README)
    targets = {(REPO / urlsplit(link).path).resolve() for link in links if not urlsplit(link).scheme}
    assert [d.name for d in DOCS if d not in targets] == [], "docs/ files the README does not link to"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    links, _ = _links_and_anchors(doc)
    bad = []
    for link in links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc:
            continue  # another site: not checked here
        target = (doc.parent / unquote(parts.path)).resolve() if parts.path else doc
        if not target.is_relative_to(REPO) or not target.exists():
            bad.append(f"{link}: no such file in the repository")
        elif parts.fragment and (target.suffix != ".md" or parts.fragment not in _links_and_anchors(target)[1]):
            bad.append(f"{link}: no heading #{parts.fragment} in {target.relative_to(REPO)}")
    assert bad == [], f"{doc.relative_to(REPO)} has links that lead nowhere"
