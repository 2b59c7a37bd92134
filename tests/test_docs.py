"""Every relative link in README.md and docs/ names a file that exists, and
its #anchor a heading of that file (as GitHub makes anchors from headings):
moving text between pages must carry its links along. The README stays short,
opens with the two commands, and CI runs the test command it gives."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ +(.+?) *$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def relative_links(page: Path) -> list[str]:
    return [link for link in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", link)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in set(anchors(path)):
            broken.append(f"{link} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{page.relative_to(ROOT)}: {broken_links(page)}"


def test_the_checker_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n## Reading report.md\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#reading-reportmd) [b](other.md#gone) [c](missing.md) [d](https://x.org/y)\n"
                    "```\n[e](in-code.md)\n```\n")
    assert broken_links(page) == ["other.md#gone (no such heading)", "missing.md (no such file)"]


def test_the_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    first_section = text.split("\n## ", 2)[1]
    assert first_section.startswith("The two commands\n")
    assert "`make run`" in first_section and "`make test`" in first_section
    assert "python -m" not in text.split("\n## The two commands")[0], "a command before the two commands"
    cells = [cell.strip() for line in first_section.splitlines() if line.startswith("|") for cell in line.split("|")]
    assert max(map(len, cells)) <= 80


def test_ci_runs_the_readme_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "| `make test` |" in README.read_text() and "make test" in ci
