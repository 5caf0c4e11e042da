"""Beam sources for dumps and SQL tables, on the real samples (explicit DirectRunner)."""

from __future__ import annotations

import bz2
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.errors import input_error_message
from tests.conftest import BUNDLED_INDEX, BUNDLED_SAMPLE, DIRECT, GENSIM_SAMPLE, MINI
from transforms.parse import dump_io
from transforms.parse.dump_io import ReadDumpPages, ReadSqlRows
from transforms.parse.dump_reader import RawPage, iter_pages, read_siteinfo
from transforms.parse.multistream import read_stream_ranges
from transforms.parse.sql_dump import iter_sql_rows

pytestmark = pytest.mark.usefixtures("shared_data")
RAW = MINI / "inputs" / "wikipedia-raw-20210701"


def content(page: RawPage) -> tuple:
    return page.page_id, page.namespace, page.title, page.text, page.redirect, page.revision_id


def kpr_counters(result) -> dict[str, int]:
    query = result.metrics().query(MetricsFilter().with_namespace("kpr"))
    totals: dict[str, int] = {}
    for counter in query["counters"]:  # one result per step that counted
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    return totals


def run_read(dumps: list[str], index_paths: dict[str, str] | None, skip_bad_streams: bool = False,
             expected_pages: list[tuple] | None = None, expected_dead: list[dict] | None = None) -> dict[str, int]:
    pipeline = TestPipeline(argv=DIRECT)
    read = pipeline | ReadDumpPages(dumps, read_siteinfo(str(GENSIM_SAMPLE)), index_paths, skip_bad_streams)
    assert_that(read["pages"] | beam.Map(content), equal_to(expected_pages or []), label="Pages")
    assert_that(read["dead_letters"], equal_to(expected_dead or []), label="DeadLetters")
    result = pipeline.run()
    result.wait_until_finish()
    return kpr_counters(result)


def test_multistream_by_ranges_equals_the_single_stream_read():
    expected = [content(page) for page in iter_pages(str(GENSIM_SAMPLE))]
    counters = run_read([str(BUNDLED_SAMPLE)], {str(BUNDLED_SAMPLE): str(BUNDLED_INDEX)}, expected_pages=expected)
    assert (counters["streams_read"], counters["pages_read"]) == (3, 206)
    assert "files_read" not in counters


def corrupt_copy(tmp_path: Path) -> tuple[Path, int]:
    """A copy of the multistream sample with bytes flipped inside its second page stream; that stream's offset."""
    dump = tmp_path / "copy-multistream.xml.bz2"
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    data = bytearray(BUNDLED_SAMPLE.read_bytes())
    middle = (ranges[1].start + ranges[1].end) // 2
    data[middle:middle + 16] = bytes(byte ^ 0xFF for byte in data[middle:middle + 16])
    dump.write_bytes(bytes(data))
    return dump, ranges[1].start


def test_bad_stream_is_skipped_counted_and_dead_lettered(tmp_path):
    dump, offset = corrupt_copy(tmp_path)
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    kept = set(ranges[0].page_ids) | set(ranges[2].page_ids)
    expected = [content(page) for page in iter_pages(str(GENSIM_SAMPLE)) if page.page_id in kept]
    assert len(expected) == 106
    dead = {"kind": "bad_streams", "source": str(dump), "offset": offset, "page_ids": list(ranges[1].page_ids),
            "reason": f"{dump} at byte {offset}: corrupt bz2 stream: Invalid data stream"}
    counters = run_read([str(dump)], {str(dump): str(BUNDLED_INDEX)}, skip_bad_streams=True,
                        expected_pages=expected, expected_dead=[dead])
    assert (counters["streams_read"], counters["bad_streams"], counters["pages_read"]) == (2, 1, 106)


def test_bad_stream_stops_the_run_with_a_one_line_error(tmp_path):
    dump, offset = corrupt_copy(tmp_path)
    with pytest.raises(Exception) as raised:
        run_read([str(dump)], {str(dump): str(BUNDLED_INDEX)})
    assert input_error_message(raised.value) == f"{dump} at byte {offset}: corrupt bz2 stream: Invalid data stream"


def test_a_corrupt_file_read_whole_says_the_flag_skips_only_indexed_streams(tmp_path):
    """Without its index a multistream dump is read whole: --skip-bad-streams has no stream to skip there, and the
    run stopped with the error alone, as if the flag had been ignored without a word."""
    dump, _ = corrupt_copy(tmp_path)
    with pytest.raises(Exception) as plain:
        run_read([str(dump)], None)
    assert "--skip-bad-streams" not in input_error_message(plain.value)
    with pytest.raises(Exception) as flagged:
        run_read([str(dump)], None, skip_bad_streams=True)
    assert input_error_message(flagged.value) == (
        f"{input_error_message(plain.value)} (--skip-bad-streams skips the streams of a multistream dump read by its "
        "index; this file was read whole)")
    assert input_error_message(plain.value).startswith(f"{dump}: truncated or corrupt archive after ")


def test_a_damaged_or_missing_dump_end_costs_no_page_and_an_index_mismatch_is_never_skipped(tmp_path):
    """The dump's closing stream (``</mediawiki>``) damaged, or cut off: the last page stream's pages were dropped
    with it under --skip-bad-streams (and, cut off, read as complete without a word); now the end alone is a bad
    stream, and without the flag a one-line error. An index that does not match its dump is no damaged stream:
    it stops the run with the flag too (it was counted as a bad stream of the index's page count)."""
    ranges = read_stream_ranges(str(BUNDLED_SAMPLE), str(BUNDLED_INDEX))
    data = BUNDLED_SAMPLE.read_bytes()
    last_page_stream = bz2.BZ2Decompressor()
    last_page_stream.decompress(data[ranges[-1].start:])
    last_stream_end = len(data) - len(last_page_stream.unused_data)  # where the closing stream starts
    expected = [content(page) for page in iter_pages(str(GENSIM_SAMPLE))]
    for name, damaged, problem in (
            ("flipped", data[:-20] + bytes(byte ^ 0xFF for byte in data[-20:]), "corrupt closing bz2 stream"),
            ("cut", data[:last_stream_end], "the dump ends before </mediawiki>")):
        dump = tmp_path / f"{name}-multistream.xml.bz2"
        dump.write_bytes(damaged)
        with pytest.raises(Exception) as raised:
            run_read([str(dump)], {str(dump): str(BUNDLED_INDEX)})
        assert problem in input_error_message(raised.value)
        counters = run_read([str(dump)], {str(dump): str(BUNDLED_INDEX)}, skip_bad_streams=True,
                            expected_pages=expected, expected_dead=[
                                {"kind": "bad_streams", "source": str(dump), "offset": ranges[-1].start,
                                 "page_ids": [], "reason": input_error_message(raised.value)}])
        assert (counters["pages_read"], counters["bad_streams"]) == (206, 1)
        assert "pages_in_bad_streams" not in counters
    short_index = tmp_path / "short-index.txt.bz2"
    short_index.write_bytes(bz2.compress(b"\n".join(bz2.decompress(BUNDLED_INDEX.read_bytes()).splitlines()[:-1])))
    with pytest.raises(Exception) as raised:
        run_read([str(BUNDLED_SAMPLE)], {str(BUNDLED_SAMPLE): str(short_index)}, skip_bad_streams=True)
    assert "but the index lists" in input_error_message(raised.value)
    # The last offset 7 bytes off: no stream starts there, and the stream before it ends short of it (both were
    # skipped as bad streams, 106 of 206 pages read, rc 0).
    lines = bz2.decompress(BUNDLED_INDEX.read_bytes()).decode().splitlines()
    last = str(ranges[-1].start)
    shifted = tmp_path / "shifted-index.txt.bz2"
    shifted.write_bytes(bz2.compress("\n".join(
        f"{int(line.split(':')[0]) + 7}:{line.split(':', 1)[1]}" if line.startswith(last + ":") else line
        for line in lines).encode()))
    with pytest.raises(Exception) as raised:
        run_read([str(BUNDLED_SAMPLE)], {str(BUNDLED_SAMPLE): str(shifted)}, skip_bad_streams=True)
    assert "(the index does not match the dump)" in input_error_message(raised.value) or \
        "the stream ends before the next index offset" in input_error_message(raised.value)


def test_part_files_and_malformed_pages(tmp_path):
    parts = sorted(str(path) for path in (RAW / "articlesdump").glob("*.bz2"))
    broken = tmp_path / "broken.xml"
    broken.write_text("<mediawiki><page><title>Fine</title><ns>0</ns><id>7</id><revision><id>8</id><text>ok</text>"
                      "</revision></page><page><title>No id</title><ns>0</ns><id>x1</id><revision><id>9</id>"
                      "<text>t</text></revision></page></mediawiki>")
    expected = [content(page) for path in parts for page in iter_pages(path)] + [(7, 0, "Fine", "ok", None, 8)]
    dead = {"kind": "malformed_pages", "reason": "page id 'x1' is not a number", "source": str(broken),
            "page_id": None, "title": "No id"}
    counters = run_read([*parts, str(broken)], None, expected_pages=expected, expected_dead=[dead])
    assert (counters["files_read"], counters["pages_read"], counters["malformed_pages"]) == (5, 11, 1)


def test_read_sql_rows_from_a_glob_and_a_list(monkeypatch):
    monkeypatch.setattr(dump_io, "SQL_ROWS_COUNTED", 16)  # rows counted 16 at a time: 138 = 8 x 16 + 10
    pattern = str(RAW / "redirecttable" / "*.sql.gz")
    page_table = str(RAW / "pagetable" / "enwiki-20210701-page.sql.gz")
    expected = [row.values for row in iter_sql_rows(str(RAW / "redirecttable" / "enwiki-20210701-redirect.sql.gz"))]
    pipeline = TestPipeline(argv=DIRECT)
    redirects = pipeline | "Redirects" >> ReadSqlRows(pattern, "redirect") | "RedirectValues" >> beam.Map(
        lambda row: row.values)
    assert_that(redirects, equal_to(expected), label="RedirectRows")
    pages = pipeline | "Pages" >> ReadSqlRows([page_table], "page")
    assert_that(pages | beam.Map(lambda row: row.values["page_id"]), equal_to(
        [row.values["page_id"] for row in iter_sql_rows(page_table)]), label="PageIds")
    result = pipeline.run()
    result.wait_until_finish()
    assert kpr_counters(result)["sql_rows_read"] == 138 + 10


def test_read_sql_rows_with_nothing_matching(tmp_path):
    pipeline = TestPipeline(argv=DIRECT)
    _ = pipeline | ReadSqlRows(str(tmp_path / "*.sql.gz"), "redirect")
    with pytest.raises(Exception) as raised:
        pipeline.run().wait_until_finish()
    assert input_error_message(raised.value) == f"no file matches {tmp_path / '*.sql.gz'}"
