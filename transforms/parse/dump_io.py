"""Beam sources for dumps: whole files, multistream byte ranges read in parallel, and SQL table dumps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam

from artifacts import fs
from artifacts.counters import declare, error, processed
from artifacts.errors import InputError
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, count_some, dead_letter
from transforms.parse.dump_reader import PageProblem, RawPage, SiteInfo, iter_pages
from transforms.parse.multistream import (
    IndexMismatchError,
    StreamRange,
    index_page_count,
    read_stream_ranges,
    stream_pages,
)
from transforms.parse.sql_dump import SqlRow, iter_sql_rows

COUNTERS = declare(
    processed("files_read", "dump files read"),
    processed("streams_read", "bz2 streams read"),
    processed("pages_read", "pages read"),
    error("malformed_pages", "pages whose XML could not be read"),
    error("bad_streams", "corrupt bz2 streams skipped (--skip-bad-streams)"),
    error("pages_in_bad_streams", "pages inside the skipped bz2 streams", detail=True),
    processed("sql_rows_read", "SQL dump rows read"),
)


def pages_or_dead_letters(items: Iterator[RawPage | PageProblem]) -> Iterator[Any]:
    """RawPages pass; PageProblems become counted dead letters."""
    for item in items:
        if isinstance(item, PageProblem):
            yield dead_letter("malformed_pages", item.reason, source=item.source, page_id=item.page_id,
                              title=item.title)
        else:
            count("pages_read")
            yield item


def read_whole_file(path: str, siteinfo: SiteInfo, skip_bad_streams: bool) -> Iterator[Any]:
    """The pages of a file read whole: a corrupt or cut archive stops the run, ``skip_bad_streams`` or not (it has
    no stream of its own to skip: the message says so where the flag was given)."""
    count("files_read")
    try:
        yield from pages_or_dead_letters(iter_pages(path, siteinfo))
    except InputError as error:
        if not skip_bad_streams:
            raise
        raise InputError(f"{error.message} (--skip-bad-streams skips the streams of a multistream dump read by its "
                         "index; this file was read whole)") from error


def read_stream(stream: StreamRange, siteinfo: SiteInfo, skip_bad_streams: bool) -> Iterator[Any]:
    """The pages of one bz2 stream; a bad stream (or a damaged end of the dump after the last) stops the run, or
    with ``skip_bad_streams`` is counted. An index that does not match the dump stops it whatever the flag."""
    try:
        pages, end_problem = stream_pages(stream, siteinfo)  # one stream is ~100 pages: check it whole first
    except IndexMismatchError:
        raise
    except InputError as error:
        if not skip_bad_streams:
            raise
        yield dead_letter("bad_streams", error.message, source=stream.path, offset=stream.start,
                          page_ids=list(stream.page_ids))
        count("pages_in_bad_streams", len(stream.page_ids))
        return
    if end_problem is not None:
        if not skip_bad_streams:
            raise InputError(end_problem)
        yield dead_letter("bad_streams", end_problem, source=stream.path, offset=stream.start, page_ids=[])
    count("streams_read")
    yield from pages_or_dead_letters(iter(pages))


def dump_units(dump: str, index_path: str | None) -> Iterator[StreamRange | str]:
    """What one worker reads at a time: each bz2 stream of a multistream dump with an index (the index is read
    here, in a worker: only stream offsets and packed page ids travel), or the whole file."""
    if index_path is None:
        yield dump
    else:
        yield from read_stream_ranges(dump, index_path)


def read_unit(unit: StreamRange | str, siteinfo: SiteInfo, skip_bad_streams: bool) -> Iterator[Any]:
    if isinstance(unit, StreamRange):
        yield from read_stream(unit, siteinfo, skip_bad_streams)
    else:
        yield from read_whole_file(unit, siteinfo, skip_bad_streams)


class ReadDumpPages(beam.PTransform):
    """Dump files -> {"pages": RawPage, "dead_letters": dict}.

    A multistream dump with an index becomes one element per bz2 stream, spread over workers, so one huge
    file is read by many workers at once; other files are read whole, one worker per file. Only file names and
    stream ranges go through the shuffle: pages stay in the worker that read them (the steps after this one are
    fused with it), so page text never crosses a shuffle.
    """

    def __init__(self, dumps: list[str], siteinfo: SiteInfo, index_paths: dict[str, str] | None = None,
                 skip_bad_streams: bool = False,
                 progress: Callable[[int | None], beam.PTransform] | None = None) -> None:
        super().__init__()
        self._dumps = dumps
        self._siteinfo = siteinfo
        self._index_paths = index_paths or {}
        self._skip_bad_streams = skip_bad_streams
        self._progress = progress  # a pass-through step given the page total (known only for multistream)

    def expand(self, pipeline: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        sources = [(dump, self._index_paths.get(dump)) for dump in self._dumps]
        read = (
            pipeline
            | "DumpFiles" >> beam.Create(sources)
            | "StreamsAndFiles" >> beam.FlatMapTuple(dump_units)
            | "SpreadStreams" >> beam.Reshuffle()
            | "ReadPages" >> beam.FlatMap(read_unit, self._siteinfo, self._skip_bad_streams).with_outputs(
                DEAD_LETTER_TAG, main="pages")
        )
        pages = read.pages
        if self._progress is not None:
            whole_files = any(index is None for _, index in sources)
            total = None if whole_files else sum(index_page_count(index) for _, index in sources if index)
            pages = pages | "Progress" >> self._progress(total)
        return {"pages": pages, "dead_letters": read[DEAD_LETTER_TAG]}


# Rows of an SQL table counted at a time (a counter's increment costs as much as reading a tenth of a row).
SQL_ROWS_COUNTED = 1 << 12


def read_table_rows(path: str, table: str, columns: tuple[str, ...]) -> Iterator[SqlRow]:
    """The rows of one SQL dump file of ``table`` with ``columns``, counted (a statement that cannot be read stops
    the run)."""
    read = 0
    for read, row in enumerate(iter_sql_rows(path, table, columns), start=1):
        if read % SQL_ROWS_COUNTED == 0:
            count("sql_rows_read", SQL_ROWS_COUNTED)
        yield row
    count_some("sql_rows_read", read % SQL_ROWS_COUNTED)


class ReadSqlRows(beam.PTransform):
    """Rows of MediaWiki SQL table dump files (a path, a glob or a list of them) as ``SqlRow``s.

    ``columns``: those every INSERT must give. One worker reads each file; the rows are not redistributed (a page
    table is tens of GB of dicts): the steps that follow, fused with the read, keep only the few fields they need.
    """

    def __init__(self, pattern_or_paths: str | list[str], table_name: str, columns: tuple[str, ...] = ()) -> None:
        super().__init__()
        self._patterns = [pattern_or_paths] if isinstance(pattern_or_paths, str) else list(pattern_or_paths)
        self._table, self._columns = table_name, columns

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pipeline
            | f"{self._table}Patterns" >> beam.Create(self._patterns)
            | f"Match{self._table}Files" >> beam.FlatMap(fs.matching_files)
            | f"Spread{self._table}Files" >> beam.Reshuffle()
            | f"Read{self._table}Rows" >> beam.FlatMap(read_table_rows, self._table, self._columns)
        )
