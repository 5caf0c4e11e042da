"""Two dumps of one wiki at two dates, built from the real samples (test data for dump refreshes, issue 12).

OLD (``enwiki-20260101``) and NEW (``enwiki-20260201``) share most pages of the gensim sample byte for byte. NEW
differs from OLD the way a monthly dump does, and every change is real text:

- edited: a few articles whose OLD version lacks one linked paragraph that NEW has (the article grew);
- removed: a few articles that are in OLD only; added: a few that are in NEW only (plus the real "Pear");
- real revisions from pywikibot's multi-revision files: "Çullu, Agdam" is a redirect in OLD and a disambiguation
  page in NEW; "Pyrus" is a disambiguation page in OLD and a redirect to Pear in NEW.

Both are built from files in samples/ (the multistream sample holds the gensim sample's pages byte for byte; the
pywikibot files are copies), so they are the same with or without ../shared/data. They keep the sample's
``ARTICLES`` shortest articles (a seventh of its text: the session's fixtures run `all` on them three times) and
all its other pages. Everything is deterministic: the choices depend only on the article sizes and sorted titles.
"""

from __future__ import annotations

import bz2
import hashlib
import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYWIKIBOT = REPO / "samples" / "pywikibot"
BUNDLED_SAMPLE = REPO / "samples" / "enwiki-sample-pages-articles-multistream.xml.bz2"
OLD_NAME = "enwiki-20260101-pages-articles.xml.bz2"
NEW_NAME = "enwiki-20260201-pages-articles.xml.bz2"

ARTICLES = 53  # the shortest half of the sample's 106 articles
# Every STRIDE-th article (sorted by title) is edited, removed or added: about 10% of the ~150 pages change.
STRIDE = 12
_PAGE = re.compile(r"  <page>\n.*?</page>\n", re.DOTALL)
_TITLE = re.compile(r"<title>(.*?)</title>")
_TEXT = re.compile(r'(<text xml:space="preserve")(?: bytes="\d+")?(>)(.*?)(</text>)', re.DOTALL)
_SHA1 = re.compile(r"<sha1>[0-9a-z]*</sha1>")


@dataclass(frozen=True)
class DumpVersions:
    """The two dump files and the titles that differ between them."""

    old: Path
    new: Path
    edited: tuple[str, ...]
    removed: tuple[str, ...]
    added: tuple[str, ...]


@dataclass(frozen=True)
class _Revision:
    title: str
    namespace: int
    page_id: int
    revision_id: int
    timestamp: str
    text: str


def _split_dump(xml: str) -> tuple[str, list[str], str]:
    """(header up to the first page, raw page blocks, footer)."""
    pages = _PAGE.findall(xml)
    start, end = xml.index(pages[0]), xml.rindex(pages[-1]) + len(pages[-1])
    return xml[:start], pages, xml[end:]


def _title(page: str) -> str:
    return html.unescape(_TITLE.search(page).group(1))


def _is_article(page: str) -> bool:
    return "<ns>0</ns>" in page and "<redirect" not in page


def _sha1_base36(text: str) -> str:
    """MediaWiki's <sha1>: the SHA-1 of the text in base 36, 31 digits."""
    number = int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)
    digits = ""
    while number:
        number, digit = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
    return digits.rjust(31, "0")


def _with_text(page: str, text: str) -> str:
    """``page`` with its revision text replaced (bytes and sha1 kept consistent)."""
    escaped = html.escape(text, quote=False)
    size = len(text.encode("utf-8"))
    page = _TEXT.sub(lambda m: f'{m[1]} bytes="{size}"{m[2]}{escaped}{m[4]}', page, count=1)
    return _SHA1.sub(f"<sha1>{_sha1_base36(text)}</sha1>", page, count=1)


def _without_linked_paragraph(page: str) -> str:
    """The older version of ``page``: its middle paragraph that carries wikilinks is not written yet."""
    text = html.unescape(_TEXT.search(page).group(3))
    paragraphs = text.split("\n\n")
    linked = [i for i, p in enumerate(paragraphs) if "[[" in p and not p.lstrip().startswith(("{", "|", "="))]
    chosen = linked[len(linked) // 2]
    return _with_text(page, "\n\n".join(paragraphs[:chosen] + paragraphs[chosen + 1:]))


def _revisions(path: Path) -> list[_Revision]:
    """Every revision of every page of a (possibly bz2) dump, oldest first, namespaces stripped."""
    data = bz2.decompress(path.read_bytes()) if path.suffix == ".bz2" else path.read_bytes()
    root = ET.fromstring(data)
    strip = re.compile(r"\{.*\}")
    out = []
    for page in (e for e in root.iter() if strip.sub("", e.tag) == "page"):
        fields = {strip.sub("", child.tag): child for child in page}
        namespace = int(fields["ns"].text) if "ns" in fields else (1 if ":" in fields["title"].text else 0)
        for revision in (c for c in page if strip.sub("", c.tag) == "revision"):
            values = {strip.sub("", child.tag): child.text or "" for child in revision}
            out.append(_Revision(fields["title"].text, namespace, int(fields["id"].text), int(values["id"]),
                                 values["timestamp"], values["text"]))
    return out


def _page_xml(revision: _Revision) -> str:
    """A schema-0.10 <page> block for one revision."""
    redirect = re.match(r"#REDIRECT\s*\[\[([^\]|#]+)", revision.text, re.IGNORECASE)
    redirect_line = f'    <redirect title="{html.escape(redirect.group(1).strip())}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{html.escape(revision.title, quote=False)}</title>\n"
            f"    <ns>{revision.namespace}</ns>\n    <id>{revision.page_id}</id>\n{redirect_line}"
            f"    <revision>\n      <id>{revision.revision_id}</id>\n"
            f"      <timestamp>{revision.timestamp}</timestamp>\n"
            f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f'      <text xml:space="preserve"></text>\n      <sha1></sha1>\n'
            f"    </revision>\n  </page>\n")


def _pywikibot_pages() -> tuple[list[str], list[str], list[str]]:
    """(OLD pages, NEW pages, titles added in NEW) from the real multi-revision files."""
    old, new = [], []
    pair = [r for r in _revisions(PYWIKIBOT / "pair-0.10.xml") if r.namespace == 0]
    pyrus = _revisions(PYWIKIBOT / "article-pyrus.xml.bz2")
    disambiguation = next(r for r in pyrus if "may refer to" in r.text)
    for before, after in ((pair[0], pair[-1]), (disambiguation, pyrus[-1])):
        old.append(_with_text(_page_xml(before), before.text))
        new.append(_with_text(_page_xml(after), after.text))
    pear = _revisions(PYWIKIBOT / "article-pear-0.10.xml")[-1]
    new.append(_with_text(_page_xml(pear), pear.text))
    return old, new, [pear.title]


def _source_xml(source: Path | None) -> str:
    """The decompressed source dump (bz2 handles the multistream layout too)."""
    return bz2.decompress((source or BUNDLED_SAMPLE).read_bytes()).decode("utf-8")


def write_dump_versions(directory: Path, source: Path | None = None, write: bool = True) -> DumpVersions:
    """Write OLD and NEW dumps (.xml.bz2) into ``directory`` (``write=False``: they are there already); return
    their paths and what changed."""
    header, pages, footer = _split_dump(_source_xml(source))
    longer = set(sorted((p for p in pages if _is_article(p)), key=len)[ARTICLES:])
    pages = [p for p in pages if p not in longer]
    articles = sorted(_title(p) for p in pages if _is_article(p))
    edited = set(articles[0::STRIDE])
    removed, added = set(articles[4::STRIDE]), set(articles[8::STRIDE])
    extra_old, extra_new, extra_added = _pywikibot_pages()
    old_pages = [_without_linked_paragraph(p) if _title(p) in edited else p
                 for p in pages if _title(p) not in added] + extra_old
    new_pages = [p for p in pages if _title(p) not in removed] + extra_new
    versions = DumpVersions(directory / OLD_NAME, directory / NEW_NAME, tuple(sorted(edited)),
                            tuple(sorted(removed)), tuple(sorted(added | set(extra_added))))
    if not write:
        return versions
    directory.mkdir(parents=True, exist_ok=True)
    for path, chosen in ((versions.old, old_pages), (versions.new, new_pages)):
        path.write_bytes(bz2.compress((header + "".join(chosen) + footer).encode("utf-8")))
    return versions

