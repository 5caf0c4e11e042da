"""Reading a passage corpus as unique passages: DPR's ``psgs_w100.tsv`` files, or ~100-word passages cut from
OUT/articles; malformed rows (invalid UTF-8 included) and duplicate ids are counted and dead-lettered with their
file and line.

Passage text never goes through a shuffle. A corpus file is cut into byte ranges aligned on line starts
(transforms/index/line_ranges.py; a compressed file is one range, read by one worker from its start); only range
descriptors, line counts, packed (id, line) arrays and the duplicate decisions travel between workers:

    files -> ranges -> CountLines -> NumberLines (prefix sums per file) -> ScanIds -> FindDuplicates (by id group)
          -> JoinDrops (per range) -> ReadRanges: each range read again, its duplicate rows dropped as it is read

Passages cut from articles have unique ids by construction (page ids are unique after parse): no duplicate pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs, layout, tables
from artifacts.errors import InputError, first_line
from artifacts.passages import Passage
from transforms.common.article_shards import parquet_file
from transforms.common.dead_letters import count, dead_letter
from transforms.common.parquet_rows import ReadParquetRows
from transforms.index.duplicate_ids import IdBlock, duplicate_drops, grouped_blocks
from transforms.index.line_ranges import LineRange, numbered, numbered_lines, range_lines, split_file
from transforms.index.passages import (
    MAX_REPORTED_CHARS,
    BadRow,
    article_passages,
    corpus_row,
    header_columns,
    too_many_chunks,
)

HEADER_LINE = 1
# Bytes of input per passage, on the low side (DPR's psgs_w100.tsv: ~620 per line), to estimate the count from the
# file sizes before reading: the estimate only sizes the hash buckets, the exact count chooses the shards.
TSV_BYTES_PER_PASSAGE = 400
# ... and as DPR's files have them (psgs_w100.tsv's lines: 631 bytes in the bundled sample, 637 in the shared
# subset): what the progress lines expect.
TYPICAL_TSV_BYTES_PER_PASSAGE = 630
COMPRESSION_RATIO = 4  # of a .gz/.bz2 corpus, and of article text in Parquet
CHARS_PER_WORD = 6


def corpus_files(pattern: str) -> list[Any]:
    """The files (Beam FileMetadata: path, size) a corpus pattern names, by path; InputError when there is none."""
    matches = fs.matching(pattern)
    if not matches:
        raise InputError(f"corpus {pattern} not found")
    return matches


def check_corpus(pattern: str) -> tuple[int, int, int]:
    """Every file of the corpus exists and starts with the DPR header; returns the column positions."""
    columns = None
    for match in corpus_files(pattern):
        try:
            with fs.open_decompressed(match.path) as handle:  # as the lines are read: .gz, .bz2 by their suffix
                header = handle.readline().decode("utf-8", errors="replace")
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{match.path}: truncated or corrupt archive before its header's end: "
                             f"{first_line(error)}") from error
        try:
            found = header_columns(header)
        except ValueError as error:
            raise InputError(f"{match.path}: {error}") from error
        if columns is not None and found != columns:
            raise InputError(f"{match.path}: its header orders the columns differently from the other files")
        columns = found
    return columns


@dataclass(frozen=True)
class PassageCounts:
    """About how many passages a corpus (or the articles cut into passages) holds, before it is read: ``high`` errs
    on the high side by design (about twice the count: it sizes the hash buckets and the input files), ``expected``
    as likely more as fewer (the progress lines' total)."""

    high: int
    expected: int


def passage_counts(corpus: str | None, articles_dir: str, words_per_passage: int) -> PassageCounts:
    """``PassageCounts`` of the corpus files from their sizes, or of the articles from their files' sizes (high)
    and their text's bytes, which their Parquet footers give (expected)."""
    if corpus:
        size = corpus_bytes(corpus)
        return PassageCounts(size // TSV_BYTES_PER_PASSAGE, size // TYPICAL_TSV_BYTES_PER_PASSAGE)
    paths = fs.list_files(articles_dir, "*.parquet")
    per_passage = CHARS_PER_WORD * words_per_passage
    return PassageCounts(sum(map(fs.size, paths)) * COMPRESSION_RATIO // per_passage,
                         sum(map(text_column_bytes, paths)) // per_passage)


def corpus_bytes(pattern: str) -> int:
    """About the uncompressed bytes of the corpus files, from their sizes (a compressed file's times
    ``COMPRESSION_RATIO``)."""
    return sum(match.size_in_bytes * (COMPRESSION_RATIO if fs.is_compressed(match.path) else 1)
               for match in corpus_files(pattern))


def text_column_bytes(path: str) -> int:
    """The uncompressed bytes of an articles file's ``text`` column, from its footer."""
    with parquet_file(path) as opened:
        metadata = opened.metadata
        return sum(chunk.total_uncompressed_size for group in range(metadata.num_row_groups)
                   for chunk in map(metadata.row_group(group).column, range(metadata.num_columns))
                   if chunk.path_in_schema == "text")


def corpus_ranges(pattern: str) -> list[LineRange]:
    """The line ranges of every file of the corpus (compressed files whole)."""
    return [line_range for match in corpus_files(pattern)
            for line_range in split_file(match.path, match.size_in_bytes, fs.is_compressed(match.path))]


def lines_of(line_range: LineRange) -> Iterator[bytes]:
    """The lines of a range as bytes (a compressed file's every line, decompressed)."""
    if line_range.compressed:
        yield from archive_lines(line_range.path)
        return
    with FileSystems.open(line_range.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        yield from range_lines(handle, line_range.start, line_range.end)


def archive_lines(path: str) -> Iterator[bytes]:
    """Every line of a compressed corpus file; a cut-short or corrupt archive stops with its file and line."""
    with fs.open_decompressed(path) as handle:
        number = 0
        try:
            while raw := handle.readline():
                number += 1
                yield raw
        except fs.ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive after line {number}: "
                             f"{first_line(error)}") from error


def count_lines(line_range: LineRange) -> tuple[str, tuple[LineRange, int]]:
    """(file, (range, its line count)); a compressed file is one range and needs no count."""
    lines = 0 if line_range.compressed else sum(1 for _ in lines_of(line_range))
    return line_range.path, (line_range, lines)


def data_lines(line_range: LineRange) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a numbered range, without the file's header line."""
    for number, raw in numbered_lines(line_range, lines_of(line_range)):
        if number != HEADER_LINE:
            yield number, raw


def scan_ids(line_range: LineRange, columns: tuple[int, int, int]) -> Iterator[tuple[int, IdBlock]]:
    """(id group, packed ids and line numbers) of the range's valid rows: all that duplicate detection needs."""
    ids, lines = [], []
    for number, raw in data_lines(line_range):
        row, _ = corpus_row(raw, columns)
        if isinstance(row, Passage):
            ids.append(row.passage_id)
            lines.append(number)
    yield from grouped_blocks(line_range.path, line_range.start, ids, lines)


def group_drops(group: int, blocks: Iterable[IdBlock], keep: str = "first") -> Iterator[tuple[tuple[str, int], Any]]:
    """The drops decided in one id group (``duplicate_drops``)."""
    return duplicate_drops(blocks, keep)


def range_with_drops(key: tuple[str, int], joined: dict[str, list[Any]]) -> Iterator[tuple[LineRange, dict]]:
    """The range of ``key`` with its rows to drop, line -> (file, line) of the kept row of the same id."""
    drops: dict[int, tuple[str, int]] = {}
    for part in joined["drops"]:
        drops.update(part.by_line())
    for line_range in joined["range"]:
        yield line_range, drops


def read_range(line_range: LineRange, drops: dict[int, tuple[str, int]],
               columns: tuple[int, int, int] = (0, 1, 2), keep: str = "first") -> Iterator[Any]:
    """The passages of a range; dead letters: its malformed rows and the rows ``drops`` names."""
    for number, raw in data_lines(line_range):
        yield from parsed_row(line_range.path, number, raw, columns, drops.get(number), keep)


def parsed_row(source: str, number: int, raw: bytes, columns: tuple[int, int, int] = (0, 1, 2),
               kept: tuple[str, int] | None = None, keep: str = "first") -> Iterator[Any]:
    """One corpus line -> its Passage, or a dead letter naming the file and line (a malformed row, or a row whose
    id the row at ``kept`` (file, line) has)."""
    where = {"source": source, "line_number": number}
    row, had_nul = corpus_row(raw, columns)
    if had_nul:
        count("passages_with_nul_bytes")  # cleaned, not dropped: the NULs are removed from the row
    if isinstance(row, BadRow):
        yield dead_letter(row.reason, row.detail, **where, line=row.line)
        return
    count("passages_read")
    if kept is None:
        yield row
        return
    kept_source, kept_line = kept
    yield dead_letter("duplicate_ids", f"line {kept_line} of {kept_source} has this id (the {keep} row is kept)",
                      passage_id=row.passage_id, **where, title=row.title, text=row.text[:MAX_REPORTED_CHARS])


def cut_article(article: dict[str, Any], words_per_passage: int) -> Iterator[Any]:
    """An article's passages (ids unique by construction); dead letters: articles too long for their ids."""
    text = article["text"] or ""
    if not text.strip():
        count("articles_without_text")
        return
    if too_many_chunks(text, words_per_passage):
        yield dead_letter("too_long_articles", "more words than passage ids per page allow",
                          page_id=article["page_id"], title=article["title"])
    passages = article_passages(article["page_id"], article["title"], text, words_per_passage)
    count("passages_read", len(passages))
    yield from passages


class FindDuplicateIds(beam.PTransform):
    """Numbered ranges -> ((file, start) of a range, Drops): the rows each range must drop, decided from packed
    (id, line) arrays grouped by a hash of the id; never the rows' text."""

    def __init__(self, columns: tuple[int, int, int], keep: str) -> None:
        super().__init__()
        self._columns, self._keep = columns, keep

    def expand(self, ranges: beam.PCollection) -> beam.PCollection:
        return (ranges
                | "ScanIds" >> beam.FlatMap(scan_ids, self._columns)
                | "ByIdGroup" >> beam.GroupByKey()
                | "DecideDrops" >> beam.FlatMapTuple(group_drops, self._keep))


class ReadPassages(beam.PTransform):
    """The corpus (DPR TSV files matching ``corpus`` with the given ``columns``, or, with ``columns`` None, the
    articles under ``output`` cut into passages) as unique passages; tagged ``dead_letter``: malformed rows
    (invalid UTF-8 included) and duplicate ids, each with its file and line. Of rows sharing an id, the first in
    file and line order is kept (``keep="last"``: the last)."""

    def __init__(self, corpus: str | None, columns: tuple[int, int, int] | None, output: str,
                 words_per_passage: int, keep: str = "first") -> None:
        super().__init__()
        self._corpus, self._columns = corpus, columns
        self._output, self._words, self._keep = output, words_per_passage, keep

    def expand(self, pipeline: beam.Pipeline) -> tuple[beam.PCollection, beam.PCollection]:
        rows = self._corpus_rows(pipeline) if self._columns is not None else self._article_rows(pipeline)
        return rows.passages, rows.dead_letter

    def _corpus_rows(self, pipeline: beam.Pipeline) -> beam.pvalue.DoOutputsTuple:
        ranges = (pipeline
                  | "CorpusPattern" >> beam.Create([self._corpus])
                  | "LineRanges" >> beam.FlatMap(corpus_ranges)
                  | "SpreadRanges" >> beam.Reshuffle()
                  | "CountLines" >> beam.Map(count_lines)
                  | "ByFile" >> beam.GroupByKey()
                  | "NumberLines" >> beam.FlatMapTuple(lambda _, counted: numbered(counted))
                  | "SpreadNumbered" >> beam.Reshuffle())
        drops = ranges | "FindDuplicateIds" >> FindDuplicateIds(self._columns, self._keep)
        return ({"range": ranges | "ByRange" >> beam.Map(lambda line_range: (line_range.key, line_range)),
                 "drops": drops}
                | "JoinDrops" >> beam.CoGroupByKey()
                | "WithDrops" >> beam.FlatMapTuple(range_with_drops)
                | "ReadRanges" >> beam.FlatMapTuple(read_range, self._columns, self._keep).with_outputs(
                    "dead_letter", main="passages"))

    def _article_rows(self, pipeline: beam.Pipeline) -> beam.pvalue.DoOutputsTuple:
        # Spread over the workers by row range: Beam's local runner gives a whole file read to one worker, and
        # here everything after the read (cutting, tokenizing, encoding) is fused with it.
        return (pipeline
                | "ReadArticles" >> ReadParquetRows(tables.parquet_files(self._output, layout.ARTICLES),
                                                    ["page_id", "title", "text"])
                | "CutPassages" >> beam.FlatMap(cut_article, self._words).with_outputs("dead_letter", main="passages"))

