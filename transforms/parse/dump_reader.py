"""Reading MediaWiki XML export dumps: plain, bz2 (single or multistream) and gzip, schemas 0.3 to 0.11.

Everything streams with bounded memory: a real dump is 20+ GB of bz2. Multistream dumps read by byte ranges
are in transforms/parse/multistream.py.
"""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import IO

from artifacts import fs
from artifacts.errors import InputError, first_line
from artifacts.ids import int64_of
from transforms.parse.namespaces import ARTICLE, Namespaces, unlisted_aliases
from transforms.parse.titles import normalize_title

_SCHEMA = re.compile(r"export-(\d+\.\d+)")
_SITEINFO_END = b"</siteinfo>"
_HOST_LANGUAGE = re.compile(r"^[a-z]+://([a-z-]+)\.wikipedia\.org")
_HEAD_LIMIT = 1 << 20  # <siteinfo> sits in the first few KB; stop looking after 1 MB of XML
_READ_CHUNK = 1 << 20
_PAGE_END = b"</page>"  # safe to split on: a literal "<" inside page text is always escaped as &lt;
_PAGE_START = re.compile(rb"<page[\s>]")
_FRAGMENT_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")
_FRAGMENT_TITLE = re.compile(rb"<title>([^<]*)</title>")
_DOCUMENT_END = re.compile(rb"</mediawiki\s*>|<mediawiki\b[^>]*/>")  # a closed or an empty export
# what comes before the first page: the export's start tag and its <siteinfo> (an XML declaration before them)
_DOCUMENT_HEAD = re.compile(rb"\A.*?</siteinfo\s*>|\A.*?<mediawiki\b[^>]*>", re.DOTALL)


@dataclass(frozen=True)
class SiteInfo:
    dbname: str | None
    base_url: str | None
    schema_version: str | None
    namespaces: Namespaces


@dataclass(frozen=True)
class RawPage:
    page_id: int
    namespace: int
    title: str
    text: str
    redirect: str | None  # the <redirect title="..."/> value ("" without a title); None when absent
    revision_id: int | None
    source: str  # "file" or "file@offset", for messages and dead letters
    ordinal: int = 0  # the page's number in its file or stream: source + ordinal tell two copies of a page apart

    @property
    def position(self) -> str:
        """Where the page was read: unique within a dump."""
        return f"{self.source}#{self.ordinal}"


@dataclass(frozen=True)
class PageProblem:
    source: str
    page_id: int | None
    title: str | None
    reason: str


def _local(tag: str) -> str:
    """A tag without its XML namespace: '{http://www.mediawiki.org/xml/export-0.10/}page' -> 'page'."""
    return tag.rsplit("}", 1)[-1]


def _child(element: ElementTree.Element, name: str) -> ElementTree.Element | None:
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def _child_text(element: ElementTree.Element, name: str) -> str | None:
    child = _child(element, name)
    return None if child is None else (child.text or "")


def siteinfo_from_element(element: ElementTree.Element | None, schema_version: str | None) -> SiteInfo:
    """SiteInfo from a parsed <siteinfo> (English Wikipedia's namespaces when there is none)."""
    if element is None:
        return SiteInfo(None, None, schema_version, Namespaces.english_defaults())
    local: dict[str, int] = {}
    block = _child(element, "namespaces")
    case = _child_text(element, "case")
    for namespace in [] if block is None else block:
        key = namespace.get("key")
        if key is not None and key.strip() == "0":
            case = namespace.get("case") or case
        if key is not None and namespace.text:
            if not key.strip().lstrip("-").isdigit():
                raise ValueError(f"namespace {namespace.text!r} has key {key!r}, not a number")
            local[namespace.text] = int(key)
    dbname, base_url = _child_text(element, "dbname"), _child_text(element, "base")
    language = wiki_language(dbname, base_url)
    local.update(unlisted_aliases(language))
    namespaces = Namespaces.canonical().with_names(local).with_language(language)
    return SiteInfo(dbname, base_url, schema_version, replace(namespaces, first_letter=case != "case-sensitive"))


def wiki_language(dbname: str | None, base_url: str | None) -> str | None:
    """The language code of a Wikipedia: from ``itwiki``, or from ``http://it.wikipedia.org/...``; hyphenated
    as in its host name and interwiki prefix (``zh_yuewiki``: ``zh-yue``)."""
    if dbname and dbname.endswith("wiki"):
        return dbname.removesuffix("wiki").replace("_", "-")
    match = _HOST_LANGUAGE.match(base_url or "")
    return match.group(1) if match else None


def read_siteinfo(path: str) -> SiteInfo:
    """The <siteinfo> of a dump, reading only its head (for multistream: stream 0)."""
    head = b""
    with fs.open_decompressed(path) as stream:
        try:
            while _SITEINFO_END not in head and len(head) < _HEAD_LIMIT:
                chunk = stream.read(64 * 1024)
                if not chunk:
                    break
                head += chunk
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: cannot decompress the start of the dump: "
                             f"{fs.misnamed_compression(path) or first_line(error)}") from error
    require_export(path, head)
    match = _SCHEMA.search(head[:4096].decode("utf-8", "replace"))
    version = match.group(1) if match else None
    end = head.find(_SITEINFO_END)
    if end < 0:
        return siteinfo_from_element(None, version)
    start = head.find(b"<siteinfo")
    try:
        return siteinfo_from_element(ElementTree.fromstring(head[start:end + len(_SITEINFO_END)]), version)
    except (ElementTree.ParseError, ValueError) as error:
        raise InputError(f"{path}: unreadable <siteinfo>: {error}") from error


_INDEX_LINE = re.compile(rb"\d+:\d+:[^\n]")  # a multistream index's first line


def root_element(head: bytes) -> str | None:
    """The local name of the first element in the start of an XML document; None if it is not XML."""
    parser = ElementTree.XMLPullParser(events=("start",))
    parser.feed(head)  # a syntax error is queued behind the events read before it
    try:
        for _event, element in parser.read_events():
            return _local(element.tag)
    except ElementTree.ParseError:
        return None
    return None


def require_export(path: str, head: bytes) -> None:
    """An InputError unless ``head``, the start of ``path``, is a MediaWiki XML export (root <mediawiki>):
    any other XML would parse to zero pages without a word."""
    root = root_element(head)
    if root == "mediawiki":
        return
    if root:
        found = f"its root element is <{root}>, not <mediawiki>"
    elif _INDEX_LINE.match(head):
        found = "it is a multistream index ('offset:page_id:title' lines): give it as --dump-index"
    else:
        found = "it does not start with XML"
    raise InputError(f"{path} is not a MediaWiki XML export dump: {found}")


def _latest_revision(page: ElementTree.Element) -> ElementTree.Element | None:
    """The revision with the highest id (the last one when ids are missing)."""
    revisions = [child for child in page if _local(child.tag) == "revision"]
    if not revisions:
        return None

    def revision_id(revision: ElementTree.Element) -> int:
        value = _child_text(revision, "id") or ""
        return int(value) if value.strip().isdigit() else -1

    best = revisions[-1]
    for revision in revisions:
        if revision_id(revision) > revision_id(best):
            best = revision
    return best


def page_from_element(page: ElementTree.Element, siteinfo: SiteInfo, source: str,
                      ordinal: int = 0) -> RawPage | PageProblem:
    """A RawPage from a parsed <page>, or a PageProblem saying what is wrong with it."""
    title = _child_text(page, "title")
    raw_id = (_child_text(page, "id") or "").strip()
    page_id = read_page_id(raw_id)
    if not title or not normalize_title(title):
        return PageProblem(source, page_id, title, "page without a title")
    if page_id is None:
        return PageProblem(source, None, title, f"page id {raw_id!r} is " + (
            "past 2^63 - 1" if raw_id.isdigit() else "not a number"))
    raw_namespace = _child_text(page, "ns")
    if raw_namespace is not None and raw_namespace.strip().lstrip("-").isdigit():
        namespace = int(raw_namespace)
    else:  # schemas before 0.6 have no <ns>: the title prefix tells
        prefix, _, rest = title.partition(":")
        found = siteinfo.namespaces.lookup(prefix) if rest else None
        namespace = ARTICLE if found is None else found
    redirect = _child(page, "redirect")
    redirect_title = None if redirect is None else (redirect.get("title") or "")
    revision = _latest_revision(page)
    if revision is None:
        return PageProblem(source, page_id, title, "page without a revision")
    raw_revision_id = (_child_text(revision, "id") or "").strip()
    text = _child_text(revision, "text") or ""
    return RawPage(page_id, namespace, title, text, redirect_title,
                   int(raw_revision_id) if raw_revision_id.isdigit() else None, source, ordinal)


def read_page_id(raw: str) -> int | None:
    """A page id from its digits; None when it is no number that fits the int64 it is stored as."""
    return int64_of(raw)


class SecondExport(ValueError):
    """A file holds a second export (``<mediawiki>`` and ``<siteinfo>``) after pages of the first: two dumps joined
    into one, whose pages would be read with the first one's namespaces."""


def iter_page_fragment_bytes(stream: IO[bytes], chunk_size: int = _READ_CHUNK) -> Iterator[bytes]:
    """Each ``<page>...</page>`` of an XML stream as bytes; memory holds one chunk plus the page being read.

    The end of the stream inside a page, or before ``</mediawiki>``, is a ``ValueError`` (the file was cut short:
    also where a bz2 reader stops without a word at bytes that start no stream, e.g. a damaged stream header); a
    second export's start before a page is a ``SecondExport``.
    """
    pending = b""
    exports, first = 0, True  # the export start tags read so far (they lie between pages, never in one)
    # read1: what one read of the archive gives (read(n) reads on to n bytes and, at a cut, drops what it had)
    read = getattr(stream, "read1", stream.read)
    while chunk := read(chunk_size):
        pending += chunk
        end = pending.rfind(_PAGE_END)
        if end >= 0:
            complete, pending = pending[:end + len(_PAGE_END)], pending[end + len(_PAGE_END):]
            exports += complete.count(b"<mediawiki")
            if exports > 1:
                raise SecondExport("a second <mediawiki> and <siteinfo>")
            yield from page_fragments(complete, head=first)
            first = False
    if b"<page" in pending:
        raise ValueError("the file ends inside a <page>")
    if not _DOCUMENT_END.search(pending):
        raise ValueError("the file ends before </mediawiki> (cut short, or a bz2 stream header is damaged: the pages "
                         "after it were not read)")


def iter_pages(path: str, siteinfo: SiteInfo | None = None) -> Iterator[RawPage | PageProblem]:
    """Every page of a whole dump file, in file order. Each page is parsed on its own, so broken page XML
    costs only that page (a PageProblem); an unreadable or cut-short file is an InputError."""
    info = siteinfo or read_siteinfo(path)
    pages, title = 0, None  # the pages read and the last one's title: where the file breaks
    with fs.open_decompressed(path) as stream:
        try:
            for pages, fragment in enumerate(iter_page_fragment_bytes(stream), start=1):
                page = page_from_fragment(fragment, info, path, pages - 1)
                title = page.title
                yield page
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive {where_it_breaks(pages, title)}: "
                             f"{first_line(error)}") from error
        except SecondExport as error:
            raise InputError(f"{path} holds two exports ({error}, found {where_it_breaks(pages, title)}): two dumps "
                             "joined into one file? Give each as a --dump of its own (their namespaces are "
                             "compared)") from error
        except ValueError as error:
            raise InputError(f"{path}: truncated dump {where_it_breaks(pages, title)}: {error}") from error


def where_it_breaks(pages: int, title: str | None) -> str:
    """Where a file stops being readable: after its first ``pages`` pages were read (the last one's title); the
    reader takes the file in what one read of the archive decompresses (up to ``_READ_CHUNK`` bytes), so the break
    may lie a page or so further."""
    if not pages:
        return "before any page was read"
    return f"after {pages:,} {'page was' if pages == 1 else 'pages were'} read (the last {title!r})"


def page_fragments(xml: bytes, head: bool = True) -> list[bytes]:
    """The ``<page>...</page>`` pieces of XML that ends with a ``</page>`` (a multistream stream holds whole pages
    only). A page whose ``</page>`` is missing is a piece of its own, up to the next ``<page>`` (malformed: a
    PageProblem), so that the next page is read as it is; so is what ends with a ``</page>`` but starts no page
    (``<pgae>``: its start tag damaged), and nothing is passed over but space and, where ``xml`` starts a file
    (``head``), the export's head."""
    fragments = []
    for number, piece in enumerate(xml.split(_PAGE_END)[:-1]):
        starts = [found.start() for found in _PAGE_START.finditer(piece)]
        before = piece[:starts[0]] if starts else piece
        if number == 0 and head:
            before = _DOCUMENT_HEAD.sub(b"", before, count=1)
        if before.strip():
            fragments.append(before.strip() + (b"" if starts else _PAGE_END))
        fragments.extend(piece[start:end] for start, end in itertools.pairwise(starts))
        if starts:
            fragments.append(piece[starts[-1]:] + _PAGE_END)
    return fragments


def unclosed_pages(tail: bytes) -> list[bytes]:
    """The pieces of ``tail`` (what a stream holds after its last ``</page>``: ``text_after_pages``) where it starts
    with a page whose ``</page>`` is missing, one per page start (each malformed, as ``page_fragments`` cuts them
    in a whole-file read); none when it starts with no page."""
    starts = [found.start() for found in _PAGE_START.finditer(tail)]
    if not starts or starts[0] != 0:
        return []
    return [tail[start:end] for start, end in itertools.pairwise([*starts, len(tail)])]


def holds_page_start(xml: bytes) -> bool:
    return _PAGE_START.search(xml) is not None


def text_after_pages(xml: bytes) -> bytes:
    """What ``page_fragments`` does not read of ``xml``: what follows its last ``</page>`` (all of it without one),
    less the export's end tag and space (a whole stream of a multistream dump leaves nothing)."""
    end = xml.rfind(_PAGE_END)
    return _DOCUMENT_END.sub(b"", xml[end + len(_PAGE_END):] if end >= 0 else xml).strip()


def ends_export(xml: bytes) -> bool:
    """Whether ``xml`` (an export's last bytes) holds its end tag."""
    return bool(_DOCUMENT_END.search(xml))


def page_from_fragment(fragment: bytes, siteinfo: SiteInfo, source: str, ordinal: int = 0) -> RawPage | PageProblem:
    """One page parsed on its own, so broken XML costs only that page (a PageProblem with what can be read)."""
    try:
        return page_from_element(ElementTree.fromstring(fragment), siteinfo, source, ordinal)
    except ElementTree.ParseError as error:
        found_id, found_title = _FRAGMENT_ID.search(fragment), _FRAGMENT_TITLE.search(fragment)
        return PageProblem(source, read_page_id(found_id.group(1).decode()) if found_id else None,
                           found_title.group(1).decode("utf-8", "replace") if found_title else None,
                           f"malformed page XML: {error}")
