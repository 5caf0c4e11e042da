"""Multistream bz2 dumps: the index of stream offsets, and each stream's pages read on their own.

A multistream dump is read by byte ranges of whole bz2 streams (about 100 pages each) so that many workers
share one huge file; only the offsets and page ids of the index are read on the driver.
"""

from __future__ import annotations

import bz2
import io
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.errors import InputError, first_line
from artifacts.ids import MAX_INT64
from transforms.parse.dump_reader import (
    PageProblem,
    RawPage,
    SiteInfo,
    ends_export,
    holds_page_start,
    page_fragments,
    page_from_fragment,
    text_after_pages,
    unclosed_pages,
)

# The last stream (~100 pages, then the closing </mediawiki> stream) is a few MB; more means a partial index.
_LAST_RANGE_LIMIT = 64 << 20
# What follows a bz2 stream's "BZh1".."BZh9": the magic of its first block, or of its end if it is empty
_BZ2_BLOCK_MAGICS = (bytes.fromhex("314159265359"), bytes.fromhex("177245385090"))
_DIGITS = re.compile("[0-9]+")  # an index's offsets and ids (str.isdigit also takes "²" and "６")


@dataclass(frozen=True)
class StreamRange:
    """One bz2 stream of a multistream dump: bytes [start, end) (end None: to the end of the file), and the ids of
    the pages the index lists in it, packed (240K ranges of English Wikipedia travel through one shuffle)."""

    path: str
    start: int
    end: int | None
    packed_ids: bytes

    @property
    def page_ids(self) -> tuple[int, ...]:
        return tuple(array("q", self.packed_ids))


# A multistream dump's name: its stem, a part's number and page range (``...-multistream1.xml-p1p41242.bz2``).
_MULTISTREAM_NAME = re.compile(r"(.*)multistream(\d*)\.xml(-p\d+p\d+)?\.bz2", re.S)


def find_multistream_index(dump_path: str) -> str | None:
    """The '...-multistream-index.txt.bz2' beside a '...-multistream.xml.bz2' dump, if it is there; of one of
    Wikimedia's part files, '...-multistream-index1.txt-p1p41242.bz2' beside '...-multistream1.xml-p1p41242.bz2'."""
    named = _MULTISTREAM_NAME.fullmatch(dump_path)
    if named is None:
        return None
    candidate = f"{named.group(1)}multistream-index{named.group(2)}.txt{named.group(3) or ''}.bz2"
    return candidate if FileSystems.exists(candidate) else None


@dataclass(frozen=True)
class FirstStream:
    """A bz2 file's first stream (a multistream dump's stream 0: the few-KB <siteinfo>)."""

    end: int  # the byte where it ends
    after: bytes  # the bytes read after it
    holds_page: bool  # its XML holds a <page> (a multistream dump's holds none)


def first_stream(path: str, limit: int) -> FirstStream | None:
    """A bz2 file's first stream; None when it does not end within the first ``limit`` bytes. Reads at most
    ``limit`` bytes."""
    decompressor, read, xml = bz2.BZ2Decompressor(), 0, bytearray()
    with fs.open_input(path) as raw:
        while not decompressor.eof and read < limit and (chunk := raw.read(64 * 1024)):
            read += len(chunk)
            xml += decompressor.decompress(chunk)
    if not decompressor.eof:
        return None
    return FirstStream(read - len(decompressor.unused_data), decompressor.unused_data, holds_page_start(xml))


def has_several_bz2_streams(path: str, limit: int = 1 << 20) -> bool:
    """Whether a bz2 file is made as a multistream dump: its first stream, the export's head without a page, ends
    within its first ``limit`` bytes and another one follows (pbzip2's streams, cut anywhere, start with pages: an
    index could not name where pages start). Reads at most ``limit`` bytes."""
    try:
        found = first_stream(path, limit)
    except fs.ARCHIVE_ERRORS:
        return False  # reading it will say what is wrong
    return found is not None and found.after.startswith(b"BZh") and not found.holds_page


def looks_multistream(path: str) -> bool:
    """A bz2 dump named or made as a multistream one (read in parallel only with its index)."""
    return path.endswith(".bz2") and ("multistream" in path.rsplit("/", 1)[-1] or has_several_bz2_streams(path))


def iter_index_entries(index_path: str) -> Iterator[tuple[int, int]]:
    """(stream offset, page id) of every line of a multistream index ('offset:page_id:title'), streaming."""
    with fs.open_decompressed(index_path) as stream:
        try:
            # only the offsets and ids are read: a title's bytes need not be UTF-8
            for number, line in enumerate(io.TextIOWrapper(stream, encoding="utf-8", errors="replace"), start=1):
                if not line.strip():
                    continue
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3 or not _DIGITS.fullmatch(parts[0]) or not _DIGITS.fullmatch(parts[1]):
                    raise InputError(f"{index_path}: line {number} is not 'offset:page_id:title'")
                if max(int(parts[0]), int(parts[1])) > MAX_INT64:
                    raise InputError(f"{index_path}: line {number} holds a number past 2^63 - 1")
                yield int(parts[0]), int(parts[1])
        except fs.ARCHIVE_ERRORS as error:
            problem = fs.misnamed_compression(index_path) or f"truncated or corrupt archive: {first_line(error)}"
            raise InputError(f"{index_path}: {problem}") from error


def index_page_count(index_path: str) -> int:
    """How many pages a multistream index lists (the whole index is checked; nothing is kept)."""
    count = sum(1 for _ in iter_index_entries(index_path))
    if not count:
        raise InputError(f"{index_path}: the multistream index lists no pages")
    return count


def read_stream_ranges(dump_path: str, index_path: str) -> list[StreamRange]:
    """The page streams of a multistream dump, from its index (read where the streams are read: in a worker).
    Their ranges cover the dump from the end of stream 0 (the <siteinfo>) to its end: no stream goes unread."""
    ids_by_offset: dict[int, array] = {}
    for offset, page_id in iter_index_entries(index_path):
        ids_by_offset.setdefault(offset, array("q")).append(page_id)
    offsets = sorted(ids_by_offset)
    if not offsets:
        raise InputError(f"{index_path}: the multistream index lists no pages")
    check_index_start(dump_path, index_path, offsets[0])
    ends: list[int | None] = [*offsets[1:], None]
    return [StreamRange(dump_path, start, end, ids_by_offset[start].tobytes())
            for start, end in zip(offsets, ends, strict=True)]


def check_index_start(dump_path: str, index_path: str, first: int) -> None:
    """An InputError unless the index's first stream starts where the dump's stream 0 ends: else the streams
    before it would go unread (a stream past the end of the file is a bad stream: ``decompress_range``)."""
    try:
        head = first_stream(dump_path, _LAST_RANGE_LIMIT)
    except fs.ARCHIVE_ERRORS as error:
        with fs.open_input(dump_path) as raw:  # read again only to say which
            if raw.read(3) != b"BZh":
                raise InputError(f"{dump_path} is no bz2 file, but {index_path} is given as its multistream index: "
                                 "an index goes with a .bz2 multistream dump only (with dumps of both kinds, leave "
                                 "--dump-index out and put each index beside its dump, named as Wikimedia names it: "
                                 "NAME-multistream-index.txt.bz2 beside NAME-multistream.xml.bz2)") from error
        raise InputError(f"{dump_path}: corrupt bz2 stream at byte 0: {first_line(error)}") from error
    if head is not None and first != head.end:
        raise InputError(f"{index_path} does not match {dump_path}: its first stream starts at byte {first}, but "
                         f"the dump's first stream (its <siteinfo>) ends at byte {head.end}")
    if head is not None and head.holds_page:
        raise InputError(f"{dump_path}: its first stream holds pages, which {index_path} does not list (a "
                         "multistream dump's first stream holds its <siteinfo> alone): rebuild the dump or its index")


class IndexMismatchError(InputError):
    """A stream that reads whole but holds other pages than the index lists for it, or an index that does not cover
    the dump: not a damaged stream (``--skip-bad-streams`` skips none of these)."""


def decompress_range(stream: StreamRange) -> tuple[bytes, bytes]:
    """The XML of one stream range's bz2 stream, and for the last range the bytes after it (the dump's closing
    stream, not yet read); InputError naming file and offset if it is no whole bz2 stream."""
    where = f"{stream.path} at byte {stream.start}"
    with fs.open_ranges(stream.path, read_ahead=0) as handle:
        handle.seek(stream.start)
        data = handle.read(_LAST_RANGE_LIMIT + 1) if stream.end is None else handle.read(stream.end - stream.start)
    if stream.end is None and len(data) > _LAST_RANGE_LIMIT:
        raise IndexMismatchError(f"{where}: more than {_LAST_RANGE_LIMIT >> 20} MB follow the last index offset "
                         "(the index does not cover the whole dump)")
    if not data:
        raise InputError(f"{where}: the file ends before that byte (it is cut short, or the index does not match it)")
    if not data.startswith(b"BZh"):
        if data[4:10] in _BZ2_BLOCK_MAGICS:  # the index is right, the stream's first four bytes are damaged
            raise InputError(f"{where}: corrupt bz2 stream: its header is damaged")
        raise IndexMismatchError(f"{where}: no bz2 stream starts there (the index does not match the dump)")
    decompressor = bz2.BZ2Decompressor()
    try:
        xml = decompressor.decompress(data)
    except OSError as error:
        raise InputError(f"{where}: corrupt bz2 stream: {first_line(error)}") from error
    if not decompressor.eof:
        raise InputError(f"{where}: the bz2 stream is truncated")
    if decompressor.unused_data and stream.end is not None:
        raise IndexMismatchError(f"{where}: the stream ends before the next index offset {stream.end}")
    return xml, decompressor.unused_data


def dump_end(stream: StreamRange, closing: bytes) -> tuple[bytes, str | None]:
    """The XML of ``closing``, the bytes after the dump's last page stream ``stream`` (its closing stream), and
    None; or nothing and what is wrong with them (``stream_pages`` then looks for the end tag)."""
    where = f"{stream.path}, after its last page stream (at byte {stream.start})"
    pieces, remaining = [], closing
    try:
        while remaining:
            if not remaining.startswith(b"BZh"):
                return b"", f"{where}: {len(remaining):,} bytes are no bz2 stream (something was appended to the dump)"
            decompressor = bz2.BZ2Decompressor()
            pieces.append(decompressor.decompress(remaining))
            if not decompressor.eof:
                return b"", f"{where}: the closing bz2 stream is truncated"
            remaining = decompressor.unused_data
    except OSError as error:
        return b"", f"{where}: corrupt closing bz2 stream: {first_line(error)}"
    return b"".join(pieces), None


def stream_pages(stream: StreamRange, siteinfo: SiteInfo) -> tuple[list[RawPage | PageProblem], str | None]:
    """The pages of one multistream stream, checked against the page ids the index lists for it; for the dump's
    last stream, what is wrong with the dump's end after it (None: it ends with ``</mediawiki>``). A damaged end
    costs no page of the stream before it."""
    source = f"{stream.path}@{stream.start}"
    xml, closing = decompress_range(stream)
    end_problem = None
    if stream.end is None:
        closing_xml, end_problem = dump_end(stream, closing)
        xml += closing_xml  # nothing of a damaged end: half of </mediawiki> would read as half a page
        if end_problem is None and not ends_export(xml[-4096:]):
            end_problem = (f"{stream.path}: the dump ends before </mediawiki>, after its last page stream (at byte "
                           f"{stream.start}): it is cut short")
    fragments = page_fragments(xml)
    if tail := text_after_pages(xml):  # its last page without its </page>: one malformed page, as read whole
        unclosed = unclosed_pages(tail)  # pages where the index lists them, else bytes of no page
        if not unclosed or len(fragments) + len(unclosed) != len(stream.page_ids):
            raise InputError(f"{stream.path} at byte {stream.start}: the stream ends with {len(tail):,} bytes that "
                             f"are no whole page ({tail[:60]!r}): half a page, or a damaged dump")
        fragments += unclosed
    pages = [page_from_fragment(fragment, siteinfo, source, ordinal) for ordinal, fragment in enumerate(fragments)]
    found = tuple(page.page_id for page in pages if page.page_id is not None)
    # A page whose id cannot be read still counts as one page; every id that can be read must be the index's.
    if len(pages) != len(stream.page_ids) or Counter(found) - Counter(stream.page_ids):
        unlisted, missing = Counter(found) - Counter(stream.page_ids), Counter(stream.page_ids) - Counter(found)
        raise IndexMismatchError(f"{stream.path} at byte {stream.start}: the stream holds pages {_ids(found)} "
                         f"but the index lists {_ids(stream.page_ids)}; not in the index: "
                         f"{_ids(tuple(unlisted.elements()))}, not in the stream: {_ids(tuple(missing.elements()))}")
    return pages, end_problem


def _ids(ids: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, ids[:3]))
    return f"[{shown}{', ...' if len(ids) > 3 else ''}] ({len(ids)})"
