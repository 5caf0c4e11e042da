"""Reading MediaWiki XML dumps: exact expectations on the real files in ../shared/data, and real files broken
in tmp_path (truncated, corrupt, an index that does not match its dump)."""

from __future__ import annotations

import bz2
import gzip
import io
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from artifacts.errors import InputError
from tests.builders import MirrorFileSystem, mirrored
from tests.conftest import BUNDLED_INDEX, BUNDLED_SAMPLE, GENSIM_SAMPLE, MINI, WIKIPEDIA
from transforms.parse.dump_reader import (
    PageProblem,
    RawPage,
    SiteInfo,
    iter_page_fragment_bytes,
    iter_pages,
    read_siteinfo,
)
from transforms.parse.multistream import StreamRange, find_multistream_index, read_stream_ranges, stream_pages

pytestmark = pytest.mark.usefixtures("shared_data")
EDGE = WIKIPEDIA / "edge-cases"
PARTS = MINI / "inputs" / "wikipedia-raw-20210701" / "articlesdump"


def iter_stream_pages(stream: StreamRange, siteinfo: SiteInfo) -> list[RawPage | PageProblem]:
    """The pages of one stream, as ``read_stream`` reads them without --skip-bad-streams: a damaged end of the dump
    after the stream an InputError."""
    pages, end_problem = stream_pages(stream, siteinfo)
    if end_problem is not None:
        raise InputError(end_problem)
    return pages


def pages_of(path: Path) -> list[RawPage]:
    items = list(iter_pages(str(path)))
    assert all(isinstance(item, RawPage) for item in items)
    return items


def content(pages: list[RawPage]) -> list[tuple]:
    return [(p.page_id, p.namespace, p.title, p.text, p.redirect, p.revision_id) for p in pages]


def test_gensim_sample_pages():
    pages = pages_of(GENSIM_SAMPLE)
    assert len(pages) == 206
    assert sum(page.namespace == 0 for page in pages) == 205
    assert [(page.page_id, page.title) for page in pages if page.namespace == 4] == [
        (724, "Wikipedia:Adding Wikipedia articles to Nupedia")]
    assert sum(page.redirect is not None for page in pages) == 100
    first = pages[0]
    assert (first.page_id, first.title, first.redirect) == (10, "AccessibleComputing", "Computer accessibility")
    albedo = next(page for page in pages if page.title == "Albedo")
    assert (albedo.page_id, albedo.revision_id, albedo.source) == (39, 715952044, str(GENSIM_SAMPLE))
    assert albedo.text.startswith("{{Other uses}}")


def test_multistream_ranges_equal_the_single_stream_read():
    index = find_multistream_index(str(BUNDLED_SAMPLE))
    assert index == str(BUNDLED_INDEX)
    assert find_multistream_index(str(GENSIM_SAMPLE)) is None
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), index)
    assert [len(stream.page_ids) for stream in ranges] == [100, 100, 6]
    assert [stream.end for stream in ranges[:-1]] == [stream.start for stream in ranges[1:]]
    assert ranges[-1].end is None and BUNDLED_SAMPLE.read_bytes()[ranges[0].start:].startswith(b"BZh")
    siteinfo = read_siteinfo(str(BUNDLED_SAMPLE))
    assert siteinfo == read_siteinfo(str(GENSIM_SAMPLE))
    assert (siteinfo.dbname, siteinfo.schema_version) == ("enwiki", "0.10")
    from_streams = [page for stream in ranges for page in iter_stream_pages(stream, siteinfo)]
    assert all(isinstance(page, RawPage) for page in from_streams)
    assert {page.source for page in from_streams} == {f"{BUNDLED_SAMPLE}@{stream.start}" for stream in ranges}
    assert content(from_streams) == content(pages_of(GENSIM_SAMPLE))
    # The whole multistream file read as one bz2 file gives the same pages too.
    assert content(pages_of(BUNDLED_SAMPLE)) == content(from_streams)



def test_the_index_of_a_wikimedia_part_file_is_found_beside_it(tmp_path):
    """English Wikipedia's multistream dump also comes in parts, each with its index under a name of its own: a
    part was read as one stream by one worker ("without its index beside it")."""
    dump = tmp_path / "enwiki-20210701-pages-articles-multistream1.xml-p1p41242.bz2"
    index = tmp_path / "enwiki-20210701-pages-articles-multistream-index1.txt-p1p41242.bz2"
    dump.write_bytes(BUNDLED_SAMPLE.read_bytes())
    assert find_multistream_index(str(dump)) is None
    index.write_bytes(BUNDLED_INDEX.read_bytes())
    assert find_multistream_index(str(dump)) == str(index)
    assert [len(stream.page_ids) for stream in read_stream_ranges(str(dump), find_multistream_index(str(dump)))] == [
        len(stream.page_ids) for stream in read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))]

def test_smallest_sample_redirect():
    pages = pages_of(WIKIPEDIA / "enwiki-pages-articles-sample.xml.bz2")
    assert read_siteinfo(str(WIKIPEDIA / "enwiki-pages-articles-sample.xml.bz2")).schema_version == "0.9"
    assert [(p.page_id, p.title, p.redirect) for p in pages] == [
        (10, "AccessibleComputing", "Computer accessibility"), (411964, "Computer accessibility", None),
        (302109, "Accessibility", None)]


def test_latest_revision_wins_and_talk_namespace():
    path = EDGE / "pair-0.10.xml"
    pages = pages_of(path)
    assert [(page.title, page.namespace) for page in pages] == [("Çullu, Agdam", 0), ("Talk:Çullu, Agdam", 1)]
    # Each page's revision ids, read from the file itself: the reader keeps the highest (here also the last).
    xml = path.read_text(encoding="utf-8")
    for page, block in zip(pages, xml.split("</page>")[:2], strict=True):
        revision_ids = [int(found) for found in re.findall(r"<revision>\s*<id>(\d+)</id>", block)]
        assert len(revision_ids) >= 2 and page.revision_id == max(revision_ids) == revision_ids[-1]
        last_text = block.rsplit("<text", 1)[1].split(">", 1)[1].split("</text>")[0]
        assert page.text == last_text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace(
            "&amp;", "&")
    assert (pages[0].revision_id, pages[1].revision_id) == (237383099, 237383127)


def test_latest_revision_is_the_highest_id_not_the_last_in_the_file(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_text("<mediawiki><page><title>A</title><ns>0</ns><id>1</id>"
                    "<revision><id>9</id><text>new</text></revision>"
                    "<revision><id>3</id><text>old</text></revision></page></mediawiki>")
    assert [(page.revision_id, page.text) for page in pages_of(path)] == [(9, "new")]


def test_schema_03_redirect_without_title():
    path = EDGE / "article-pyrus.xml.bz2"
    assert read_siteinfo(str(path)).schema_version == "0.3"
    pages = pages_of(path)
    revision_ids = [int(found) for found in re.findall(r"<revision>\s*<id>(\d+)</id>",
                                                       bz2.decompress(path.read_bytes()).decode("utf-8"))]
    assert len(revision_ids) > 1
    assert [(p.page_id, p.title, p.namespace, p.redirect, p.revision_id) for p in pages] == [
        (9261472, "Pyrus", 0, "", max(revision_ids))]  # <redirect/> without a title: the text names the target
    assert pages[0].text.startswith("#REDIRECT [[Pear]]")


def test_old_schema_namespace_from_the_title_prefix(tmp_path):
    path = tmp_path / "old.xml"
    path.write_text(
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.4/"><siteinfo><sitename>W</sitename>'
        '<namespaces><namespace key="1">Diskussion</namespace><namespace key="14">Kategorie</namespace>'
        "</namespaces></siteinfo>"
        + "".join(f"<page><title>{title}</title><id>{number}</id><revision><id>{number}</id><text>t</text>"
                  "</revision></page>" for number, title in enumerate(
                      ["Diskussion:Haus", "Kategorie:Tiere", "Star Wars: Episode I", "Haus"], start=1))
        + "</mediawiki>")
    assert read_siteinfo(str(path)).schema_version == "0.4"
    assert [(page.title, page.namespace) for page in pages_of(path)] == [
        ("Diskussion:Haus", 1), ("Kategorie:Tiere", 14), ("Star Wars: Episode I", 0), ("Haus", 0)]


def test_aawiki_schema_011_namespaces_from_siteinfo():
    path = EDGE / "aawiki-20260101-pages-meta-current.xml.bz2"
    siteinfo = read_siteinfo(str(path))
    assert (siteinfo.dbname, siteinfo.schema_version) == ("aawiki", "0.11")
    pages = pages_of(path)
    assert len(pages) == 507
    assert [page.title for page in pages if page.namespace == 0] == ["Main Page", "Main page"]
    assert sum(page.namespace == 2 for page in pages) == 174 and sum(page.namespace == 14 for page in pages) == 29


def test_italian_gzip_namespaces():
    path = WIKIPEDIA / "itwiki-sample.xml.gz"
    siteinfo = read_siteinfo(str(path))
    assert siteinfo.schema_version == "0.8"
    with gzip.open(path) as handle:
        head = handle.read(20000).decode("utf-8")
    declared = dict((name, int(key)) for key, name in re.findall(r'<namespace key="(-?\d+)"[^>]*>([^<]+)<', head))
    assert (declared["Categoria"], declared["File"]) == (14, 6)  # the siteinfo's own words
    assert {name: siteinfo.namespaces.lookup(name) for name in ("Categoria", "File", "Immagine", "Discussione")} == {
        "Categoria": 14, "File": 6, "Immagine": 6, "Discussione": 1}
    pages = pages_of(path)
    assert len(pages) == 747 and sum(page.redirect is not None for page in pages) == 65
    assert sum(page.namespace == 0 for page in pages) == 672


def test_part_files_of_a_multi_file_dump():
    parts = sorted(PARTS.glob("*.bz2"))
    assert len(parts) == 4
    titles = [page.title for part in parts for page in pages_of(part)]
    assert sorted(titles) == sorted(["Gandalf", "Boromir", "Samwise Gamgee", "Character (arts)", "Literary element",
                                     "Gimli (Middle-earth)", "Merry Brandybuck", "Pippin Took", "Frodo Baggins",
                                     "Legolas"])


def test_malformed_pages_are_problems_not_crashes(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_bytes(b"<mediawiki><page><title>Good</title><ns>0</ns><id>1</id><revision><id>5</id><text>x</text>"
                     b"</revision></page><page><title>Bad</title><ns>0</ns><id>abc</id><revision><text>y</text>"
                     b"</revision></page><page><ns>0</ns><id>3</id><revision><text>z</text></revision></page>"
                     b"<page><title>Empty</title><ns>0</ns><id>4</id></page>"
                     b"<page><title>Huge</title><ns>0</ns><id>99999999999999999999999</id><revision><text>w</text>"
                     b"</revision></page><page><title> _ </title><ns>0</ns><id>6</id><revision><text>v</text>"
                     b"</revision></page></mediawiki>")
    items = list(iter_pages(str(path)))
    assert isinstance(items[0], RawPage) and items[0].title == "Good"
    assert items[1:] == [
        PageProblem(str(path), None, "Bad", "page id 'abc' is not a number"),
        PageProblem(str(path), 3, None, "page without a title"),
        PageProblem(str(path), 4, "Empty", "page without a revision"),
        PageProblem(str(path), None, "Huge", "page id '99999999999999999999999' is past 2^63 - 1"),  # ids are int64
        PageProblem(str(path), 6, " _ ", "page without a title")]  # a title that normalizes to nothing


def test_a_namespace_key_that_is_not_a_number_is_one_line(tmp_path):
    path = tmp_path / "dump.xml"
    path.write_text('<mediawiki><siteinfo><namespaces><namespace key="x14">Category</namespace></namespaces>'
                    "</siteinfo></mediawiki>")
    with pytest.raises(InputError, match=r"dump\.xml: unreadable <siteinfo>: namespace 'Category' has key 'x14', "
                                         r"not a number"):
        read_siteinfo(str(path))


def test_a_dump_that_ends_between_pages_or_streams_is_truncated_not_shorter(tmp_path):
    """bz2 readers stop without a word at bytes that start no stream (a damaged stream header, a cut between
    streams), and XML cut right after a </page> reads as whole pages: the missing </mediawiki> tells."""
    whole = list(iter_pages(str(BUNDLED_SAMPLE)))
    assert len(whole) == 206
    data = BUNDLED_SAMPLE.read_bytes()
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    second = ranges[1].start
    damaged = {"header.xml.bz2": data[:second] + b"X" + data[second + 1:],
               "cut.xml.bz2": data[:second],
               "cut-at-page.xml": bz2.decompress(data).split(b"</page>")[0] + b"</page>\n"}
    for (name, content), pages in zip(damaged.items(), (100, 100, 1), strict=True):
        (tmp_path / name).write_bytes(content)
        read = f"{pages} pages were" if pages > 1 else "1 page was"
        with pytest.raises(InputError, match=rf"{re.escape(name)}: truncated dump after {read} read \(the last "
                                             r"'[^']+'\): the file ends before </mediawiki>"):
            list(iter_pages(str(tmp_path / name)))
    empty = tmp_path / "empty.xml"
    empty.write_text('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" />')
    assert list(iter_pages(str(empty))) == []


def test_a_stream_past_the_end_or_bytes_after_the_last_one_are_bad_streams(tmp_path):
    """Each a one-line InputError naming the stream (which --skip-bad-streams counts), not an OverflowError or a
    "corrupt bz2 stream" that is whole."""
    dump, ranges = copy_sample(tmp_path)
    siteinfo, size = read_siteinfo(str(dump)), dump.stat().st_size
    past = StreamRange(str(dump), size + 10, None, ranges[-1].packed_ids)
    with pytest.raises(InputError, match=rf"at byte {size + 10}: the file ends before that byte"):
        list(iter_stream_pages(past, siteinfo))
    with dump.open("ab") as handle:
        handle.write(b"appended by mistake")
    with pytest.raises(InputError, match=rf"after its last page stream \(at byte {ranges[-1].start}\): 19 bytes are "
                                         r"no bz2 stream \(something was appended"):
        list(iter_stream_pages(ranges[-1], siteinfo))
    index = tmp_path / "huge-offset-index.txt.bz2"
    index.write_bytes(bz2.compress(b"99999999999999999999999:10:AccessibleComputing\n"))
    with pytest.raises(InputError, match=r"huge-offset-index\.txt\.bz2: line 1 holds a number past 2\^63 - 1"):
        read_stream_ranges(str(dump), str(index))


def test_an_index_title_that_is_not_utf8_is_read_past(tmp_path):
    """Only an index line's offset and page id are read: bytes in its title that are no UTF-8 change nothing."""
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).split(b"\n")
    lines[5] = lines[5] + b"\xff\xfe"
    index = tmp_path / "index.txt.bz2"
    index.write_bytes(bz2.compress(b"\n".join(lines)))
    assert read_stream_ranges(str(BUNDLED_SAMPLE), str(index)) == read_stream_ranges(str(BUNDLED_SAMPLE),
                                                                                     str(BUNDLED_INDEX))


def test_truncated_and_corrupt_archives_and_a_missing_file(tmp_path):
    pear = (EDGE / "article-pear-0.10.xml").read_bytes()
    siteinfo = read_siteinfo(str(EDGE / "article-pear-0.10.xml"))  # given, so the page reading itself fails
    compressed_gzip = gzip.compress(pear)
    cut = tmp_path / "cut.xml.gz"
    cut.write_bytes(compressed_gzip[: len(compressed_gzip) // 2])
    with pytest.raises(InputError, match=r"cut\.xml\.gz: truncated or corrupt archive"):
        list(iter_pages(str(cut), siteinfo))
    corrupt = bytearray(compressed_gzip)
    corrupt[200:260] = bytes(byte ^ 0xFF for byte in corrupt[200:260])
    bad = tmp_path / "bad.xml.gz"
    bad.write_bytes(bytes(corrupt))
    with pytest.raises(InputError, match=r"bad\.xml\.gz: truncated or corrupt archive"):
        list(iter_pages(str(bad), siteinfo))
    real_bz2 = (WIKIPEDIA / "enwiki-pages-articles-sample.xml.bz2").read_bytes()
    cut_bz2 = tmp_path / "cut.xml.bz2"
    cut_bz2.write_bytes(real_bz2[: len(real_bz2) * 2 // 3])
    with pytest.raises(InputError, match=r"cut\.xml\.bz2: truncated or corrupt archive before any page was read"):
        list(iter_pages(str(cut_bz2), siteinfo))
    # a file of many pages says how far it was read: every page whole before the cut
    xml = bz2.decompress(BUNDLED_SAMPLE.read_bytes())  # its 206 pages, in one stream
    for name, compressed, readable in (
            ("many.xml.bz2", bz2.compress(xml), lambda cut: bz2.BZ2Decompressor().decompress(cut)),
            ("many.xml.gz", gzip.compress(xml), lambda cut: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut))):
        cut_many = tmp_path / name
        cut_many.write_bytes(compressed[: len(compressed) * 2 // 3])
        whole = readable(cut_many.read_bytes())
        whole = whole[:whole.rfind(b"</page>")]
        pages, last = whole.count(b"</page>") + 1, re.findall(rb"<title>([^<]*)</title>", whole)[-1].decode()
        with pytest.raises(InputError) as refused:
            list(iter_pages(str(cut_many)))
        assert refused.value.message.startswith(f"{cut_many}: truncated or corrupt archive after {pages} pages were "
                                                f"read (the last {last!r}): Compressed file ended")
    with pytest.raises(InputError, match=r"cut\.xml\.gz: cannot decompress the start of the dump"):
        read_siteinfo(str(cut))
    misnamed = tmp_path / "gzip.xml.bz2"  # was "cannot decompress the start of the dump: Invalid data stream"
    misnamed.write_bytes(gzip.compress(GENSIM_SAMPLE.read_bytes()[:1000]))
    with pytest.raises(InputError, match=r"gzip\.xml\.bz2: cannot decompress the start of the dump: its bytes are "
                                         r"gzip-compressed: its name should end in \.gz$"):
        read_siteinfo(str(misnamed))
    with pytest.raises(InputError, match=r"missing\.xml"):
        list(iter_pages(str(tmp_path / "missing.xml")))
    with pytest.raises(InputError, match=r"missing\.xml\.bz2"):
        read_siteinfo(str(tmp_path / "missing.xml.bz2"))


def copy_sample(tmp_path: Path) -> tuple[Path, list[StreamRange]]:
    dump = tmp_path / "copy-multistream.xml.bz2"
    dump.write_bytes(BUNDLED_SAMPLE.read_bytes())
    return dump, read_stream_ranges(str(dump), str(BUNDLED_INDEX))


def edited_index(tmp_path: Path, edit: Callable[[str, list[str]], str | None]) -> tuple[Path, list[str]]:
    """A copy of the bundled dump with its index edited line by line (``edit(line, stream offsets)``, None drops
    the line); the copy's path and the index's stream offsets in order."""
    dump, _ = copy_sample(tmp_path)
    index = tmp_path / "copy-multistream-index.txt.bz2"
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).decode().splitlines()
    offsets = sorted({line.split(":", 1)[0] for line in lines}, key=int)
    edited = [found for line in lines if (found := edit(line, offsets)) is not None]
    index.write_bytes(bz2.compress("\n".join(edited).encode()))
    assert find_multistream_index(str(dump)) == str(index)
    return dump, offsets


def test_index_offset_that_does_not_match_its_dump(tmp_path):
    dump, offsets = edited_index(tmp_path, lambda line, offsets: line.replace(offsets[1], str(int(offsets[1]) + 7), 1)
                                 if line.startswith(offsets[1] + ":") else line)
    index = str(tmp_path / "copy-multistream-index.txt.bz2")
    stream = read_stream_ranges(str(dump), index)[1]
    assert stream.start == int(offsets[1]) + 7
    with pytest.raises(InputError, match=rf"copy-multistream\.xml\.bz2 at byte {stream.start}: no bz2 stream"):
        list(iter_stream_pages(stream, read_siteinfo(str(dump))))


@pytest.mark.parametrize(("edit", "message"), [
    # no line of the first page stream: its 100 pages would go unread, with no stream to say so
    (lambda line, offsets: None if line.startswith(offsets[0] + ":") else line,
     r"its first stream starts at byte \d+, but the dump's first stream \(its <siteinfo>\) ends at byte 638"),
    (lambda line, offsets: line.replace(offsets[0], str(int(offsets[0]) + 7), 1),
     r"its first stream starts at byte 645, but"),
], ids=["first stream missing", "first offset shifted"])
def test_an_index_that_leaves_streams_unread_is_refused(tmp_path, edit, message):
    dump, _ = edited_index(tmp_path, edit)
    with pytest.raises(InputError, match=rf"copy-multistream-index\.txt\.bz2 does not match .*copy-multistream\."
                                         rf"xml\.bz2: {message}"):
        read_stream_ranges(str(dump), str(tmp_path / "copy-multistream-index.txt.bz2"))


@pytest.mark.parametrize("suffix", [".xml.gz", ".xml"])
def test_an_index_given_for_a_dump_that_is_no_bz2_file_says_so(tmp_path, suffix):
    """Not "corrupt bz2 stream at byte 0": the dump is fine, the index does not go with it."""
    xml = bz2.decompress(BUNDLED_SAMPLE.read_bytes())
    dump = tmp_path / f"dump{suffix}"
    dump.write_bytes(gzip.compress(xml) if suffix == ".xml.gz" else xml)
    with pytest.raises(InputError, match=rf"dump{re.escape(suffix)} is no bz2 file, but .*-index\.txt\.bz2 is given "
                                         r"as its multistream index: .*leave --dump-index out"):
        read_stream_ranges(str(dump), str(BUNDLED_INDEX))


def test_stream_that_runs_past_the_next_offset_or_holds_other_pages(tmp_path):
    dump, ranges = copy_sample(tmp_path)
    siteinfo = read_siteinfo(str(dump))
    merged = StreamRange(str(dump), ranges[0].start, ranges[2].start, ranges[0].packed_ids)
    with pytest.raises(InputError, match=rf"at byte {ranges[0].start}: the stream ends before the next index"):
        list(iter_stream_pages(merged, siteinfo))
    wrong_ids = StreamRange(str(dump), ranges[1].start, ranges[1].end, ranges[0].packed_ids)
    with pytest.raises(InputError, match=rf"at byte {ranges[1].start}: the stream holds pages \[.*\] \(100\) but"):
        list(iter_stream_pages(wrong_ids, siteinfo))
    short = StreamRange(str(dump), ranges[1].start, ranges[1].end - 10, ranges[1].packed_ids)
    with pytest.raises(InputError, match=rf"at byte {ranges[1].start}: the bz2 stream is truncated"):
        list(iter_stream_pages(short, siteinfo))


def test_a_stream_read_from_an_object_store_fetches_its_own_bytes(tmp_path):
    """Each worker reads its streams of the dump by byte range: from an object store a read fetches the stream,
    not the 16 MB (here: the rest of the file) Beam's reader fetches at each read outside its buffer."""
    dump, ranges = copy_sample(tmp_path)
    stream = ranges[1]
    local = [(page.page_id, page.text) for page in iter_stream_pages(stream, read_siteinfo(str(dump)))]
    MirrorFileSystem.log.clear()
    remote = StreamRange(mirrored(dump), stream.start, stream.end, stream.packed_ids)
    assert [(page.page_id, page.text) for page in iter_stream_pages(remote, read_siteinfo(str(dump)))] == local
    assert MirrorFileSystem.log.fetched == [stream.end - stream.start]  # one request, of the stream's bytes


def test_corrupt_bytes_inside_one_stream(tmp_path):
    dump, ranges = copy_sample(tmp_path)
    data = bytearray(dump.read_bytes())
    middle = (ranges[1].start + ranges[1].end) // 2
    data[middle:middle + 16] = bytes(byte ^ 0xFF for byte in data[middle:middle + 16])
    dump.write_bytes(bytes(data))
    siteinfo = read_siteinfo(str(dump))
    with pytest.raises(InputError, match=rf"copy-multistream\.xml\.bz2 at byte {ranges[1].start}: corrupt bz2"):
        list(iter_stream_pages(ranges[1], siteinfo))
    # The other streams are untouched and still read.
    assert len(list(iter_stream_pages(ranges[0], siteinfo))) + len(list(iter_stream_pages(ranges[2], siteinfo))) == 106


def write_multistream(dump: Path, index: Path, head: bytes, streams: list[bytes], page_ids: list[tuple[int, ...]],
                      tail: bytes) -> list[int]:
    """A multistream dump of the given XML pieces (one bz2 stream each) and its index; the page streams' offsets."""
    out, starts = bytearray(bz2.compress(head)), []
    for xml in streams:
        starts.append(len(out))
        out += bz2.compress(xml)
    out += bz2.compress(tail)
    dump.write_bytes(bytes(out))
    lines = [f"{start}:{page_id}:t" for start, ids in zip(starts, page_ids, strict=True) for page_id in ids]
    index.write_bytes(bz2.compress("\n".join(lines).encode()))
    return starts


def test_broken_page_xml_inside_a_stream_is_a_problem(tmp_path):
    raw = BUNDLED_SAMPLE.read_bytes()
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    tail = b"</mediawiki>"
    streams = [bz2.decompress(raw[r.start:r.end] if r.end else raw[r.start:]).replace(tail, b"") for r in ranges]
    albedo = streams[0].index(b"<title>Albedo</title>")
    streams[0] = streams[0][:albedo] + streams[0][albedo:].replace(b"</ns>", b"</nss>", 1)
    dump, index = tmp_path / "x-multistream.xml.bz2", tmp_path / "x-multistream-index.txt.bz2"
    starts = write_multistream(dump, index, bz2.decompress(raw[:ranges[0].start]), streams,
                               [r.page_ids for r in ranges], tail)
    siteinfo = read_siteinfo(str(dump))
    items = [item for stream in read_stream_ranges(str(dump), str(index))
             for item in iter_stream_pages(stream, siteinfo)]
    problems = [item for item in items if isinstance(item, PageProblem)]
    assert [(p.page_id, p.title, p.source) for p in problems] == [(39, "Albedo", f"{dump}@{starts[0]}")]
    assert problems[0].reason.startswith("malformed page XML: mismatched tag")
    expected = [page for page in pages_of(GENSIM_SAMPLE) if page.title != "Albedo"]
    assert [(p.page_id, p.namespace, p.title, p.text, p.redirect) for p in items if isinstance(p, RawPage)] == [
        (p.page_id, p.namespace, p.title, p.text, p.redirect) for p in expected]


def test_a_stream_whose_last_page_lacks_its_end_tag_costs_that_page_as_a_whole_file_read(tmp_path):
    """The stream was refused ("ends with 110,508 bytes that are no whole page"; with --skip-bad-streams its other
    99 pages dropped) where a whole-file read of the same XML makes that page one malformed page."""
    raw = BUNDLED_SAMPLE.read_bytes()
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    tail = b"</mediawiki>"
    streams = [bz2.decompress(raw[r.start:r.end] if r.end else raw[r.start:]).replace(tail, b"") for r in ranges]
    last = streams[0].rindex(b"</page>")
    streams[0] = streams[0][:last] + streams[0][last + len(b"</page>"):]
    dump, index = tmp_path / "x-multistream.xml.bz2", tmp_path / "x-multistream-index.txt.bz2"
    head = bz2.decompress(raw[:ranges[0].start])
    write_multistream(dump, index, head, streams, [r.page_ids for r in ranges], tail)
    whole = tmp_path / "whole.xml"
    whole.write_bytes(head + b"".join(streams) + tail)
    siteinfo = read_siteinfo(str(dump))
    by_streams = [item for stream in read_stream_ranges(str(dump), str(index))
                  for item in iter_stream_pages(stream, siteinfo)]
    read_whole = list(iter_pages(str(whole)))

    def fields(items: list[RawPage | PageProblem]) -> list[tuple]:
        return [(type(item).__name__, item.page_id, item.title,  # the XML error's line and column aside
                 item.reason.split(": line")[0] if isinstance(item, PageProblem) else item.text) for item in items]

    assert fields(by_streams) == fields(read_whole)
    problems = [item for item in by_streams if isinstance(item, PageProblem)]
    assert [(item.page_id, item.reason.startswith("malformed page XML")) for item in problems] == [
        (ranges[0].page_ids[-1], True)]
    assert len(by_streams) == sum(len(r.page_ids) for r in ranges)


def test_a_damaged_stream_header_is_a_corrupt_stream_and_a_wrong_offset_an_index_mismatch(tmp_path):
    """Four damaged bytes at a stream's start ("BZh9") were blamed on the index; an offset of the index that is no
    stream start still is."""
    dump, ranges = copy_sample(tmp_path)
    data = bytearray(dump.read_bytes())
    data[ranges[1].start:ranges[1].start + 4] = b"\0\0\0\0"
    dump.write_bytes(bytes(data))
    siteinfo = read_siteinfo(str(dump))
    with pytest.raises(InputError, match=rf"at byte {ranges[1].start}: corrupt bz2 stream: its header is damaged$"):
        iter_stream_pages(ranges[1], siteinfo)
    shifted = StreamRange(ranges[2].path, ranges[2].start + 1, ranges[2].end, ranges[2].packed_ids)
    with pytest.raises(InputError, match=rf"at byte {shifted.start}: no bz2 stream starts there \(the index does "
                                         r"not match the dump\)$"):
        iter_stream_pages(shifted, siteinfo)


def test_index_that_leaves_out_the_last_stream(tmp_path):
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).decode().splitlines()
    index = tmp_path / "partial-index.txt.bz2"
    index.write_bytes(bz2.compress("\n".join(lines[:200]).encode()))
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(index))
    assert [(len(r.page_ids), r.end) for r in ranges] == [(100, ranges[1].start), (100, None)]
    with pytest.raises(InputError, match=rf"at byte {ranges[1].start}: the stream holds pages .* \(106\) but the "
                                         r"index lists .* \(100\)"):
        list(iter_stream_pages(ranges[1], read_siteinfo(str(BUNDLED_SAMPLE))))


def test_an_index_that_names_another_page_id_says_which(tmp_path):
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).decode().splitlines()
    offset, page_id, title = lines[150].split(":", 2)
    lines[150] = f"{offset}:9{page_id}:{title}"
    index = tmp_path / "edited-index.txt.bz2"
    index.write_bytes(bz2.compress("\n".join(lines).encode()))
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(index))
    with pytest.raises(InputError, match=rf"\(100\); not in the index: \[{page_id}\] \(1\), not in the stream: "
                                         rf"\[9{page_id}\] \(1\)$"):
        list(iter_stream_pages(ranges[1], read_siteinfo(str(BUNDLED_SAMPLE))))


def test_broken_page_xml_in_a_whole_file_costs_only_that_page(tmp_path):
    good = b"<page><title>Good</title><ns>0</ns><id>1</id><revision><id>5</id><text>x</text></revision></page>"
    broken = b"<page><title>Broken</title><ns>0</ns><id>2</id><revision><text>y</revision></page>"
    after = b"<page><title>After</title><ns>0</ns><id>3</id><revision><id>6</id><text>z</text></revision></page>"
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(b"<mediawiki>" + good + broken + after + b"</mediawiki>"))
    items = list(iter_pages(str(path)))
    assert [item.title for item in items] == ["Good", "Broken", "After"]
    assert isinstance(items[0], RawPage) and isinstance(items[2], RawPage) and items[2].text == "z"
    assert isinstance(items[1], PageProblem) and items[1].page_id == 2
    assert items[1].reason.startswith("malformed page XML: mismatched tag")


def test_a_page_without_its_end_tag_costs_only_that_page(tmp_path):
    """A <page> whose </page> is missing is one malformed page: the page after it is read, and text between pages
    that only starts like a page tag is no page."""
    first = b"<page><title>Alpha</title><ns>0</ns><id>1</id><revision><id>5</id><text>a</text></revision></page>"
    unclosed = b"<page><title>Gamma</title><ns>0</ns><id>4</id><revision><id>6</id><text>g</text></revision>\n"
    after = b"<page>\n<title>Beta</title><ns>0</ns><id>2</id><revision><id>7</id><text>b</text></revision></page>"
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(b"<mediawiki>" + first + unclosed + b"<page-ish/>" + after + b"</mediawiki>"))
    items = list(iter_pages(str(path)))
    assert [(type(item).__name__, item.title) for item in items] == [
        ("RawPage", "Alpha"), ("PageProblem", "Gamma"), ("RawPage", "Beta")]
    assert items[1].page_id == 4 and items[1].reason.startswith("malformed page XML")
    assert items[2].text == "b"


def test_pages_split_across_read_chunks_and_a_cut_short_file(tmp_path):
    pages = [f"<page><title>P{n}</title><ns>0</ns><id>{n}</id><revision><text>{'w ' * n}</text></revision></page>"
             for n in range(1, 40)]
    xml = ("<mediawiki>" + "".join(pages) + "</mediawiki>").encode()
    fragments = list(iter_page_fragment_bytes(io.BytesIO(xml), chunk_size=7))
    assert [fragment.decode() for fragment in fragments] == pages
    cut = tmp_path / "cut.xml"
    cut.write_bytes(xml[: len(xml) // 2])
    with pytest.raises(InputError, match=r"cut\.xml: truncated dump after \d+ pages were read \(the last 'P\d+'\): "
                                         r"the file ends inside a <page>"):
        list(iter_pages(str(cut), read_siteinfo(str(EDGE / "article-pear-0.10.xml"))))


@pytest.mark.parametrize(("name", "compress"), [("joined.xml.bz2", bz2.compress), ("joined.xml", lambda xml: xml)])
def test_two_exports_joined_into_one_file_are_refused(tmp_path, name, compress):
    """`cat a.xml.bz2 b.xml.bz2`: the second <siteinfo> was passed over without a word and its pages read with the
    first's namespaces (an itwiki's [[Categoria:...]] links became entity links); joined as plain XML, its head was
    one malformed page."""
    other = b"<mediawiki><siteinfo><dbname>itwiki</dbname></siteinfo>\n"
    one, two = (SITEINFO_HEAD + small_page(1) + b"</mediawiki>\n", other + small_page(2) + b"</mediawiki>\n")
    path = tmp_path / name
    path.write_bytes(compress(one) + compress(two))
    with pytest.raises(InputError, match=rf"^KPR-INPUT-ERROR: {re.escape(str(path))} holds two exports \(a second "
                                         r"<mediawiki> and <siteinfo>, found (before any page was read|after 1 page "
                                         r"was read \(the last 'Page 1'\))\): two dumps joined into one file\?"):
        list(iter_pages(str(path)))
    path.write_bytes(compress(one))
    assert [page.page_id for page in iter_pages(str(path))] == [1]


def small_page(page_id: int) -> bytes:
    return (f"<page><title>Page {page_id}</title><ns>0</ns><id>{page_id}</id><revision><id>{page_id + 100}</id>"
            f"<text>text {page_id}</text></revision></page>\n").encode()


SITEINFO_HEAD = b"<mediawiki><siteinfo><dbname>enwiki</dbname></siteinfo>\n"


def test_a_page_whose_start_tag_is_damaged_is_a_problem_not_dropped(tmp_path):
    """A piece that ends with </page> but starts no page (<pgae>) is one malformed page, counted: it was passed over
    without a word in a whole-file read (a multistream read refused the stream)."""
    path = tmp_path / "dump.xml"
    path.write_bytes(SITEINFO_HEAD + small_page(1) + small_page(2).replace(b"<page>", b"<pgae>") + small_page(3)
                     + b"</mediawiki>")
    items = list(iter_pages(str(path)))
    assert [(type(item).__name__, item.page_id) for item in items] == [
        ("RawPage", 1), ("PageProblem", 2), ("RawPage", 3)]
    assert items[1].reason.startswith("malformed page XML")


def test_multistream_pages_the_index_does_not_reach_are_refused(tmp_path):
    """Pages in stream 0 (beside the <siteinfo>) and half a page after a stream's last </page> were passed over
    without a word; an index offset or id in other digits than 0-9 was a traceback."""
    dump, index = tmp_path / "x-multistream.xml.bz2", tmp_path / "x-multistream-index.txt.bz2"
    write_multistream(dump, index, SITEINFO_HEAD + small_page(1), [small_page(2), small_page(3)], [(2,), (3,)],
                      b"</mediawiki>")
    with pytest.raises(InputError, match=r"x-multistream\.xml\.bz2: its first stream holds pages, which .* does not "
                                         r"list"):
        read_stream_ranges(str(dump), str(index))
    starts = write_multistream(dump, index, SITEINFO_HEAD, [small_page(2), small_page(3) + small_page(4)[:40]],
                               [(2,), (3,)], b"</mediawiki>")
    siteinfo = read_siteinfo(str(dump))
    ranges = read_stream_ranges(str(dump), str(index))
    assert [page.page_id for page in iter_stream_pages(ranges[0], siteinfo)] == [2]
    with pytest.raises(InputError, match=rf"at byte {starts[1]}: the stream ends with 40 bytes that are no whole "
                                         r"page \(b'<page><title>Page 4"):
        list(iter_stream_pages(ranges[1], siteinfo))
    index.write_bytes(bz2.compress(f"{starts[0]}:2:t\n{starts[1]}:\u00b3:t\n".encode()))
    with pytest.raises(InputError, match=r"line 2 is not 'offset:page_id:title'"):
        read_stream_ranges(str(dump), str(index))
