"""Synthetic multistream dumps built from a real one: its pages repeated with new ids and titles.

A dump of ``copies`` copies is written as ``…-multistream.xml.bz2`` with its ``…-multistream-index.txt.bz2``
(stream 0: header and siteinfo, then streams of ``PAGES_PER_STREAM`` pages, the last stream: the footer), the
layout of a Wikimedia multistream dump. Two ways of copying the links:

- ``keep``: a copy's links point where the original's do (the number of entities stays that of the sample);
- ``grow``: copy c links to the pages of copy c (``[[Plato]]`` -> ``[[Plato (copy 3)|Plato]]``, the shown
  text unchanged), so entities, link targets and sampled mentions grow with the dump as in a real wiki.
"""

from __future__ import annotations

import bz2
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

PAGES_PER_STREAM = 100
ENTITY_MODES = ("keep", "grow")
COPY_OFFSET = 10_000_000  # page ids of copy c: the original id + c x this
_PAGE = re.compile(rb"  <page>.*?</page>\n", re.S)
_TEXT = re.compile(rb"(<text[^>]*>)(.*?)(</text>)", re.S)
_LINK = re.compile(rb"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]")
_REDIRECT = re.compile(rb'(<redirect title=")([^"]*)(")')
DUMP_NAME, INDEX_NAME = "synthetic-multistream.xml.bz2", "synthetic-multistream-index.txt.bz2"
_DESCRIPTION = "dump.json"  # written last: a dump directory with it is complete


def split_dump(xml: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(header up to the first page, pages, footer)."""
    pages = _PAGE.findall(xml)
    first = xml.index(pages[0])
    last = xml.rindex(pages[-1]) + len(pages[-1])
    return xml[:first], pages, xml[last:]


def renumbered(page: bytes, copy: int) -> bytes:
    """A copy of a page with a new page id and a distinct title (links inside stay as they were)."""
    if copy == 0:
        return page
    page = re.sub(rb"<id>(\d+)</id>", lambda m: b"<id>%d</id>" % (int(m.group(1)) + copy * COPY_OFFSET), page,
                  count=1)
    return re.sub(rb"<title>(.*?)</title>", lambda m: b"<title>%s (copy %d)</title>" % (m.group(1), copy), page,
                  count=1)


def copy_title(title: bytes, copy: int) -> bytes:
    """The title a page or link target has in copy ``copy`` (copy 0 is the original); a ``#section`` stays last."""
    if copy == 0:
        return title
    page, hash_sign, section = title.strip().partition(b"#")
    return b"%s (copy %d)%s%s" % (page.strip(), copy, hash_sign, section)


def link_to_copy(link: re.Match, copy: int) -> bytes:
    """``[[Target|text]]`` -> ``[[Target (copy c)|text]]``, ``[[Target]]`` -> ``[[Target (copy c)|Target]]``.
    Left as they are: links within the page (``[[#Section]]``), colon-escaped links and the pipe trick
    (``[[Target|]]``). Namespaced targets keep their prefix, so they stay what they were (File, Category, …)."""
    target, shown = link.group(1), link.group(2)
    if not target.strip() or target.lstrip().startswith((b"#", b":")) or shown == b"":
        return link.group(0)
    return b"[[%s|%s]]" % (copy_title(target, copy), target if shown is None else shown)


def links_to_copy(page: bytes, copy: int) -> bytes:
    """``page`` with every wikilink of its text and its redirect target renamed to copy ``copy``."""
    if copy == 0:
        return page
    page = _REDIRECT.sub(lambda m: m.group(1) + copy_title(m.group(2), copy) + m.group(3), page, count=1)
    return _TEXT.sub(lambda m: m.group(1) + _LINK.sub(lambda link: link_to_copy(link, copy), m.group(2)) + m.group(3),
                     page, count=1)


def copied_pages(pages: list[bytes], copies: int, entities: str) -> list[bytes]:
    """``copies`` copies of ``pages`` (copy 0 first, unchanged); ``entities``: "keep" or "grow" (module doc)."""
    if entities not in ENTITY_MODES:
        raise ValueError(f"entities must be one of {ENTITY_MODES}, got {entities!r}")
    copied = [renumbered(page, copy) for copy in range(copies) for page in pages]
    if entities == "grow":
        copied = [links_to_copy(page, index // len(pages)) for index, page in enumerate(copied)]
    return copied


def write_multistream(header: bytes, pages: list[bytes], footer: bytes, directory: Path) -> tuple[Path, Path, int]:
    """A multistream .xml.bz2 + index of ``pages``; returns the paths and the uncompressed size."""
    dump, index = directory / DUMP_NAME, directory / INDEX_NAME
    offset, lines, size = 0, [], 0
    with dump.open("wb") as out:
        for chunk in [header, *[b"".join(pages[i:i + PAGES_PER_STREAM])
                                for i in range(0, len(pages), PAGES_PER_STREAM)], footer]:
            if chunk.lstrip().startswith(b"<page>"):
                for page in _PAGE.findall(chunk):
                    page_id = re.search(rb"<id>(\d+)</id>", page).group(1).decode()
                    title = re.search(rb"<title>(.*?)</title>", page).group(1).decode()
                    lines.append(f"{offset}:{page_id}:{title}")
            compressed = bz2.compress(chunk)
            out.write(compressed)
            offset += len(compressed)
            size += len(chunk)
    index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return dump, index, size


@dataclass(frozen=True)
class SyntheticDump:
    """A written synthetic dump: its files, uncompressed XML bytes and page count."""

    dump: Path
    index: Path
    xml_bytes: int
    pages: int
    copies: int
    entities: str


def synthetic_dump(source: Path, copies: int, entities: str, directory: Path) -> SyntheticDump:
    """The dump of ``copies`` copies of ``source``'s pages in ``directory``, written unless already complete there."""
    described = directory / _DESCRIPTION
    if described.exists():
        return SyntheticDump(directory / DUMP_NAME, directory / INDEX_NAME, **json.loads(described.read_text()))
    directory.mkdir(parents=True, exist_ok=True)
    header, pages, footer = split_dump(bz2.decompress(source.read_bytes()))
    copied = copied_pages(pages, copies, entities)
    dump, index, size = write_multistream(header, copied, footer, directory)
    written = SyntheticDump(dump, index, size, len(copied), copies, entities)
    described.write_text(json.dumps({name: value for name, value in asdict(written).items()
                                     if name not in ("dump", "index")}))
    return written
