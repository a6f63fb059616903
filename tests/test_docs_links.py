"""The documentation holds together: its relative links resolve, and the README stays short.

Covers README.md, ARCHITECTURE.md and every docs/*.md page, with no Spark. A link is
relative when it has no scheme (``http:``, ``https:``, ``mailto:`` links are not checked);
its file must exist, and its ``#anchor`` must be the slug of a heading of its target (or
of its own page, for ``#anchor`` alone), as GitHub computes it: the heading's text,
lowercased, without punctuation but hyphens and underscores (backticks, colons,
parentheses, periods, commas, slashes, apostrophes, ``+``, ``>`` and the like go), each
space a hyphen; a heading whose slug was taken gets ``-1``, ``-2``, ... Links and headings
inside fenced code blocks, and links inside inline code, are not links. A failure names
the file, the line and the link.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README_MAX_BYTES = 16_000

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
# A link's text may run over lines of one paragraph, never over a blank line.
INLINE_LINK = re.compile(
    r"!?\[((?:[^\]\n]|\n(?![ \t]*\n))*)\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)"
)
REFERENCE_DEFINITION = re.compile(r"^[ ]{0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t].*)?$", re.M)
HEADING = re.compile(r"^\s{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    """A link as written: the file it is in, its line (1-based) and its target."""

    source: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{shown(self.source)}:{self.line}: ({self.target})"


def documents() -> list[Path]:
    """The checked Markdown files: the README, ARCHITECTURE.md and the docs pages."""
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Each line outside fenced code blocks, with its 1-based number."""
    lines, fence = [], ""
    for number, line in enumerate(text.splitlines(), start=1):
        marker = FENCE.match(line)
        if not fence and marker:
            fence = marker.group(1)  # opens a block
        elif fence:
            # Only a run of the opening character, at least as long and alone, closes it.
            run = marker.group(1) if marker else ""
            if run[:1] == fence[0] and len(run) >= len(fence) and line.strip() == run:
                fence = ""
        else:
            lines.append((number, line))
    return lines


def links_in(path: Path, text: str) -> list[Link]:
    """Every link target of a Markdown text, inline code and fenced code aside.

    A link's line is the line its target is on.
    """
    prose = dict(prose_lines(text))
    lines = text.splitlines()
    # Code blocks blanked and code spans replaced, line for line, so line numbers hold.
    masked = "\n".join(
        CODE_SPAN.sub("code", prose[number]) if number in prose else ""
        for number in range(1, len(lines) + 1)
    )
    matches = [
        *((match.start(2), match.group(2)) for match in INLINE_LINK.finditer(masked)),
        *((match.start(1), match.group(1)) for match in REFERENCE_DEFINITION.finditer(masked)),
    ]
    return [
        Link(path, masked.count("\n", 0, start) + 1, target) for start, target in sorted(matches)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before duplicates are numbered)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings, duplicates numbered -1, -2, ..."""
    occurrences: dict[str, int] = {}
    for _, line in prose_lines(text):
        if not (heading := HEADING.match(line)):
            continue
        base = anchor = slug(heading.group(1))
        while anchor in occurrences:
            occurrences[base] += 1
            anchor = f"{base}-{occurrences[base]}"
        occurrences[anchor] = 0
    return set(occurrences)


def relative_links() -> list[Link]:
    """Every relative link of the checked files."""
    return [
        link
        for path in documents()
        for link in links_in(path, path.read_text(encoding="utf-8"))
        if link.target and not SCHEME.match(link.target)
    ]


def shown(path: Path) -> str:
    """A path as a failure shows it: relative to the repository."""
    return os.path.relpath(path, ROOT)


def resolve(link: Link) -> tuple[Path, str]:
    """The file a link points to and its anchor ('' for none)."""
    file, _, anchor = link.target.partition("#")
    target = (link.source.parent / unquote(file)).resolve() if file else link.source
    return target, unquote(anchor)


def test_github_slugs_drop_punctuation_and_number_duplicates() -> None:
    page = "\n".join(
        [
            "# Planning a job: `spark-elastic plan`",
            "## Stateful: steady state, bucket checkpoints and rescale",
            "## Partition growth (SEP-5)",
            "## What a warm-up does, and what it does not do yet",
            "## A > B + C's/d. with_task_state",
            "## See [the index](README.md)",
            "```sh",
            "# not a heading",
            "```",
            "## Figures",
            "## Figures",
            "### Figures",
        ]
    )

    assert anchors(page) == {
        "planning-a-job-spark-elastic-plan",
        "stateful-steady-state-bucket-checkpoints-and-rescale",
        "partition-growth-sep-5",
        "what-a-warm-up-does-and-what-it-does-not-do-yet",
        "a--b--csd-with_task_state",
        "see-the-index",
        "figures",
        "figures-1",
        "figures-2",
    }


def test_links_in_code_are_not_links_and_each_link_keeps_its_line() -> None:
    page = "\n".join(
        [
            "See [the plan](planning.md#planning) and ![a figure](status-page.png).",
            "Not a link: `[x](missing.md)`. A [link over",
            "two lines](udfs.md), and [not a link",
            "",
            "over a paragraph](missing.md).",
            "```python",
            "rows[0](missing.md)  # [y](missing.md)",
            "```",
            "   ~~~",
            "[z](missing.md)",
            "   ~~~",
            "[ref]: ../ARCHITECTURE.md",
        ]
    )

    found = [(link.line, link.target) for link in links_in(ROOT / "page.md", page)]

    assert found == [
        (1, "planning.md#planning"),
        (1, "status-page.png"),
        (3, "udfs.md"),
        (12, "../ARCHITECTURE.md"),
    ]


def test_the_docs_pages_exist_and_have_relative_links() -> None:
    assert len(documents()) > 2
    assert relative_links()


def test_every_relative_link_in_the_docs_points_to_an_existing_file() -> None:
    broken = [
        f"{link}: no such file {shown(target)}"
        for link in relative_links()
        if not (target := resolve(link)[0]).exists()
    ]

    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_anchor_in_the_docs_names_a_heading_of_its_target() -> None:
    pages: dict[Path, set[str]] = {}
    broken = []
    for link in relative_links():
        target, anchor = resolve(link)
        if not anchor or target.suffix != ".md" or not target.is_file():
            continue
        if target not in pages:
            pages[target] = anchors(target.read_text(encoding="utf-8"))
        if anchor not in pages[target]:
            broken.append(f"{link}: no heading #{anchor} in {shown(target)}")

    assert not broken, "broken anchors:\n" + "\n".join(broken)


def test_every_docs_page_is_listed_in_the_docs_index() -> None:
    index = ROOT / "docs" / "README.md"
    listed = {resolve(link)[0] for link in links_in(index, index.read_text(encoding="utf-8"))}
    pages = set((ROOT / "docs").glob("*.md")) - {index}

    unlisted = sorted(page.name for page in pages - listed)

    assert not unlisted, f"docs pages that docs/README.md does not link: {unlisted}"


def test_the_readme_is_a_landing_page_of_at_most_16000_bytes() -> None:
    size = (ROOT / "README.md").stat().st_size

    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes (at most {README_MAX_BYTES:,}): move detail into docs/"
    )
