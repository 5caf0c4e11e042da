"""Reading dumps and SQL tables: exact expectations on the real files in ../shared/data."""

from __future__ import annotations

import bz2
import gzip

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.errors import InputError
from tests.conftest import BUNDLED_INDEX, BUNDLED_SAMPLE, DIRECT, GENSIM_SAMPLE, MINI, WIKIPEDIA
from transforms.dump_io import ReadDumpPages, ReadSqlRows
from transforms.dump_reader import (
    PageProblem,
    RawPage,
    find_multistream_index,
    iter_pages,
    iter_stream_pages,
    read_siteinfo,
    read_stream_ranges,
)
from transforms.sql_dump import iter_sql_rows, parse_values

pytestmark = pytest.mark.usefixtures("shared_data")
RAW = MINI / "inputs" / "wikipedia-raw-20210701"


def pages_of(path) -> list[RawPage]:
    return [page for page in iter_pages(str(path)) if isinstance(page, RawPage)]


def test_gensim_sample_pages():
    pages = pages_of(GENSIM_SAMPLE)
    assert len(pages) == 206
    assert sum(page.namespace == 0 for page in pages) == 205
    assert sum(page.redirect is not None for page in pages) == 100
    first = pages[0]
    assert (first.page_id, first.title, first.redirect) == (10, "AccessibleComputing", "Computer accessibility")
    albedo = next(page for page in pages if page.title == "Albedo")
    assert (albedo.page_id, albedo.revision_id) == (39, 715952044)


def test_multistream_ranges_equal_the_single_stream_read():
    index = find_multistream_index(str(BUNDLED_SAMPLE))
    assert index == str(BUNDLED_INDEX)
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), index)
    assert [len(stream.page_ids) for stream in ranges] == [100, 100, 6]
    siteinfo = read_siteinfo(str(BUNDLED_SAMPLE))
    from_streams = [page for stream in ranges for page in iter_stream_pages(stream, siteinfo)]
    single = pages_of(GENSIM_SAMPLE)
    assert [(p.page_id, p.title, p.text, p.redirect, p.namespace) for p in from_streams] == [
        (p.page_id, p.title, p.text, p.redirect, p.namespace) for p in single]


def test_schema_versions_namespaces_and_revisions():
    assert read_siteinfo(str(WIKIPEDIA / "itwiki-sample.xml.gz")).schema_version == "0.8"
    italian = read_siteinfo(str(WIKIPEDIA / "itwiki-sample.xml.gz")).namespaces
    assert (italian.lookup("Categoria"), italian.lookup("file"), italian.lookup("Immagine")) == (14, 6, 6)
    pair = pages_of(WIKIPEDIA / "edge-cases" / "pair-0.10.xml")
    assert [(page.title, page.namespace) for page in pair] == [("Çullu, Agdam", 0), ("Talk:Çullu, Agdam", 1)]
    assert pair[0].revision_id == 237383099  # the latest of its revisions
    pyrus = pages_of(WIKIPEDIA / "edge-cases" / "article-pyrus.xml.bz2")
    assert read_siteinfo(str(WIKIPEDIA / "edge-cases" / "article-pyrus.xml.bz2")).schema_version == "0.3"
    assert (pyrus[0].title, pyrus[0].namespace, pyrus[0].redirect) == ("Pyrus", 0, None)
    assert pyrus[0].text.lstrip().upper().startswith("#REDIRECT")
    aawiki = pages_of(WIKIPEDIA / "edge-cases" / "aawiki-20260101-pages-meta-current.xml.bz2")
    assert len(aawiki) == 507 and read_siteinfo(
        str(WIKIPEDIA / "edge-cases" / "aawiki-20260101-pages-meta-current.xml.bz2")).schema_version == "0.11"


def test_malformed_page_is_a_problem_not_a_crash(tmp_path):
    xml = (b"<mediawiki><page><title>Good</title><ns>0</ns><id>1</id><revision><id>5</id><text>x</text>"
           b"</revision></page><page><title>Bad</title><ns>0</ns><id>abc</id><revision><text>y</text></revision>"
           b"</page></mediawiki>")
    path = tmp_path / "dump.xml"
    path.write_bytes(xml)
    items = list(iter_pages(str(path)))
    assert isinstance(items[0], RawPage) and items[0].title == "Good"
    assert isinstance(items[1], PageProblem) and items[1].title == "Bad" and "not a number" in items[1].reason


def test_truncated_gzip_and_missing_file(tmp_path):
    data = gzip.compress((WIKIPEDIA / "edge-cases" / "article-pear-0.10.xml").read_bytes())
    truncated = tmp_path / "cut.xml.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.xml\.gz"):
        list(iter_pages(str(truncated)))
    with pytest.raises(InputError, match=r"missing\.xml"):
        list(iter_pages(str(tmp_path / "missing.xml")))


def test_index_that_does_not_match_its_dump(tmp_path):
    index = tmp_path / "x-multistream-index.txt.bz2"
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).decode().splitlines()
    shifted = [f"{int(line.split(':', 1)[0]) + 7}:{line.split(':', 1)[1]}" for line in lines]
    index.write_bytes(bz2.compress("\n".join(shifted).encode()))
    stream = read_stream_ranges(str(BUNDLED_SAMPLE), str(index))[0]
    with pytest.raises(InputError, match=f"at byte {stream.start}"):
        list(iter_stream_pages(stream, read_siteinfo(str(BUNDLED_SAMPLE))))


def test_sql_tables_of_the_mini_set():
    redirects = list(iter_sql_rows(str(next((RAW / "redirecttable").glob("*.sql.gz")))))
    assert len(redirects) == 138
    assert redirects[0] == {"rd_from": 10583, "rd_namespace": 0, "rd_title": "Frodo_Baggins", "rd_interwiki": "",
                            "rd_fragment": ""}
    assert sum(1 for row in redirects if row["rd_fragment"]) == 34
    props = list(iter_sql_rows(str(next((RAW / "pagepropstable").glob("*.sql.gz")))))
    assert {row["pp_page"]: row["pp_value"] for row in props if row["pp_propname"] == "wikibase_item"} == {
        53221: "Q177499", 61599: "Q219504", 62320: "Q219473", 76749: "Q95074", 450998: "Q6647660"}


def test_sql_value_syntax():
    statement = r"""(1,'it\'s','a\\b',NULL,-2.5),(2,'x,y)');"""
    assert list(parse_values(statement, 0)) == [[1, "it's", "a\\b", None, -2.5], [2, "x,y)"]]


def test_beam_sources_read_the_multistream_dump_and_sql():
    siteinfo = read_siteinfo(str(BUNDLED_SAMPLE))
    expected = sorted(page.page_id for page in pages_of(GENSIM_SAMPLE))
    with TestPipeline(argv=DIRECT) as pipeline:
        read = pipeline | ReadDumpPages([str(BUNDLED_SAMPLE)], siteinfo, {str(BUNDLED_SAMPLE): str(BUNDLED_INDEX)})
        assert_that(read["pages"] | beam.Map(lambda page: page.page_id), equal_to(expected), label="Pages")
        assert_that(read["dead_letters"], equal_to([]), label="NoDeadLetters")
        rows = pipeline | ReadSqlRows([str(next((RAW / "pagetable").glob("*.sql.gz")))], "page")
        assert_that(rows | beam.combiners.Count.Globally(), equal_to([10]), label="PageRows")
