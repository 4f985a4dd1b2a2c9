"""The README stays a front door, and every relative link in it and in docs/ resolves (file and #anchor)
inside the repository: a guide that sends the reader to a file beside the repository (``../shared/...``)
works only on the machine it was written on.

Plain text processing, no TensorFlow: runs in well under a second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
DOCS = sorted([README, *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
# A commit hash: 7-40 hex digits, a letter and a digit among them, not part of a word, a path or a number
_COMMIT = re.compile(r"(?<![\w/.#])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/]|\.\w)")
#: The reference guides say what holds now; dated runs with the commit each ran live in docs/notes/.
GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")  # results.md: a record by design
# A relative path that climbs (``../x``), in a link, a code span or prose; not ``.../`` (an elided name)
_CLIMBING_PATH = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-][\w./-]*)")


def _prose(text: str) -> str:
    """The text without fenced code blocks (links in them are examples, not links)."""
    return _FENCE.sub("", text)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (not ``-``/``_``), spaces to ``-``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's ``-1``, ``-2`` suffixes for repeats."""
    seen: dict[str, int] = {}
    found = set()
    for match in _HEADING.finditer(_prose(path.read_text(encoding="utf-8"))):
        base = github_anchor(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """Targets of the Markdown links and images in `path` that point inside the repository."""
    prose = _prose(path.read_text(encoding="utf-8"))
    targets = []
    for line in prose.splitlines():
        # a link inside inline code is text; strip inline code first, keeping link syntax outside it
        for match in _LINK.finditer(_INLINE_CODE.sub(lambda m: "x" * len(m.group(0)), line)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            targets.append(target)
    return targets


def test_github_anchor_follows_githubs_rules():
    assert github_anchor('`config="auto"` in detail') == "configauto-in-detail"
    assert github_anchor("Measured in fresh processes, one batch each (`--confirm`)") == \
        "measured-in-fresh-processes-one-batch-each---confirm"
    assert github_anchor("The tuner's efficiency") == "the-tuners-efficiency"
    assert github_anchor("Long skip connections: `swap_branches`") == "long-skip-connections-swap_branches"


def test_readme_is_a_front_door_of_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move depth into docs/"


def test_the_readme_links_the_guides():
    linked = {Path(t.split("#")[0]).name for t in relative_links(README)}
    for guide in ("lms.md", "tuner.md", "results.md", "troubleshooting.md", "gpu.md", "equivalence.md",
                  "default_search.md"):
        assert guide in linked, f"README.md does not link docs/{guide}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def paths_outside_the_repository(path: Path) -> list[str]:
    """Relative paths in `path` (links, code spans, code blocks, prose) that lead out of the repository: every
    link, and every path that climbs (``../``), must reach a file or folder of the repository from `path`'s folder.
    (``../shared/x.md`` in docs/ names a ``shared/`` beside the repository, not one inside it.)"""
    text = path.read_text(encoding="utf-8")
    candidates = [*relative_links(path), *(m.group(1) for m in _CLIMBING_PATH.finditer(text))]
    outside = set()
    for target in candidates:
        file_part = target.partition("#")[0]
        dest = (path.parent / file_part).resolve()
        if file_part and not (dest.is_relative_to(ROOT) and dest.exists()):
            outside.add(target)
    return sorted(outside)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_points_outside_the_repository(doc: Path):
    assert paths_outside_the_repository(doc) == [], \
        f"{doc.relative_to(ROOT)} names files outside the repository; bring what it needs into docs/"


def test_the_outside_check_finds_a_path_beside_the_repository(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "a.md"
    (tmp_path / "README.md").write_text("# R\n", encoding="utf-8")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "run.py").write_text("", encoding="utf-8")
    doc.write_text("See `../shared/NOTES.md`, [up](../../x.md), [ok](../README.md#r), `gradient_tape/.../MatMul`,\n"
                   "and ../examples/run.py, [here](#top).\n", encoding="utf-8")
    assert paths_outside_the_repository(doc) == ["../../x.md", "../shared/NOTES.md"]


def commit_hashes(text: str) -> list[str]:
    """The commit hashes in the prose of a Markdown text (code blocks are examples)."""
    return _COMMIT.findall(_prose(text))


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_no_reference_guide_names_a_commit(guide: Path):
    found = commit_hashes(guide.read_text(encoding="utf-8"))
    assert found == [], (f"docs/{guide.name} names commits {found}: a guide says what holds now; move the dated "
                         "account into docs/notes/<topic>.md and link it in one line")


def test_the_commit_check_finds_hashes_and_nothing_else():
    text = ("fixed (c4bef8f); at df13c3f-ac40c6b; code 3a081c2.\n"
            "Not: 1,613 tests, 0x7f3a2b1c, deadbeef, studies/abc1234/, run1a2b3c4d, 1234567, v2.21.0.\n")
    assert commit_hashes(text) == ["c4bef8f", "df13c3f", "ac40c6b", "3a081c2"]


def test_the_link_check_finds_a_broken_link(tmp_path: Path):
    (tmp_path / "a.md").write_text("# Title\n\nSee [b](b.md), [here](#title), [gone](#nowhere).\n"
                                   "```\n[not a link](missing.md)\n```\n", encoding="utf-8")
    assert relative_links(tmp_path / "a.md") == ["b.md", "#title", "#nowhere"]
    assert anchors(tmp_path / "a.md") == {"title"}
