"""Two dumps of one wiki at two dates, built deterministically from the real gensim sample.

The sample's articles shorter than ``MAX_PAGE_CHARS`` (51 of 106, to keep test runs short) and all its other
pages are used. OLD: those pages minus the last ``ADDED`` articles. NEW: OLD's pages minus ``REMOVED`` articles, with
every ``EDIT_EVERY``-th remaining article edited (its middle paragraph deleted: a real text removal that also
removes that paragraph's links), plus the ``ADDED`` articles. Redirect pages are in both. 6 of the 51
articles (12%) differ between the two dumps.
"""

from __future__ import annotations

import bz2
import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import GENSIM_SAMPLE

MAX_PAGE_CHARS = 40_000
ADDED = 2  # articles only in NEW (the last ones)
REMOVED = (5, 30)  # positions (among the articles) of articles only in OLD
EDIT_EVERY = 16  # every 16th article kept in both dumps is edited
_PAGE = re.compile(r"  <page>.*?</page>\n", re.S)
_TITLE = re.compile(r"<title>(.*?)</title>")
_TEXT = re.compile(r"(<text[^>]*>)(.*?)(</text>)", re.S)


@dataclass(frozen=True)
class DumpVersions:
    old: Path
    new: Path
    added: tuple[str, ...]
    removed: tuple[str, ...]
    edited: tuple[str, ...]


def is_article(page: str) -> bool:
    return "<ns>0</ns>" in page and "<redirect" not in page


def title_of(page: str) -> str:
    return _TITLE.search(page).group(1)


def without_middle_paragraph(page: str) -> str:
    """The page with the middle paragraph of its wikitext deleted."""
    match = _TEXT.search(page)
    paragraphs = match.group(2).split("\n\n")
    del paragraphs[len(paragraphs) // 2]
    return page[:match.start(2)] + "\n\n".join(paragraphs) + page[match.end(2):]


def write_dump(path: Path, header: str, pages: list[str], footer: str) -> Path:
    with bz2.open(path, "wt", encoding="utf-8") as handle:
        handle.write(header + "".join(pages) + footer)
    return path


def build_dump_versions(directory: Path) -> DumpVersions:
    """Write ``old.xml.bz2`` and ``new.xml.bz2`` into ``directory``."""
    with bz2.open(GENSIM_SAMPLE, "rt", encoding="utf-8") as handle:
        source = handle.read()
    every = _PAGE.findall(source)
    header, footer = source[:source.index(every[0])], source[source.rindex(every[-1]) + len(every[-1]):]
    pages = [page for page in every if not is_article(page) or len(page) < MAX_PAGE_CHARS]
    articles = [page for page in pages if is_article(page)]
    added, removed = articles[-ADDED:], [articles[position] for position in REMOVED]
    old = [page for page in pages if page not in added]
    kept = [page for page in old if page not in removed]
    edited = [page for page in kept if is_article(page)][EDIT_EVERY - 1::EDIT_EVERY]
    new = [without_middle_paragraph(page) if page in edited else page for page in kept] + added
    return DumpVersions(write_dump(directory / "old.xml.bz2", header, old, footer),
                        write_dump(directory / "new.xml.bz2", header, new, footer),
                        tuple(map(title_of, added)), tuple(map(title_of, removed)), tuple(map(title_of, edited)))
