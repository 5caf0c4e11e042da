"""Reading a passage corpus as unique passages: DPR's ``psgs_w100.tsv`` files, or ~100-word passages cut from
OUT/articles; malformed rows (invalid UTF-8 included) and duplicate ids are counted and dead-lettered with their
file and line."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import layout, tables
from artifacts.errors import InputError
from artifacts.passages import Passage
from transforms.dead_letters import count, dead_letter
from transforms.dump_io import matching_files
from transforms.dump_reader import ARCHIVE_ERRORS, open_xml
from transforms.passages import (
    MAX_REPORTED_CHARS,
    BadRow,
    article_passages,
    decode_corpus_line,
    header_columns,
    parse_dpr_row,
    pick_duplicate,
    too_many_chunks,
)

Position = tuple[str, int]  # (file, line) of a corpus row; ("", 0) for passages cut from articles


def check_corpus(pattern: str) -> tuple[int, int, int]:
    """Every file of the corpus exists and starts with the DPR header; returns the column positions."""
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputError(f"corpus {pattern} not found")
    columns = None
    for match in sorted(matches, key=lambda item: item.path):
        with FileSystems.open(match.path, compression_type=CompressionTypes.AUTO) as handle:
            header = handle.readline().decode("utf-8", errors="replace")
        try:
            found = header_columns(header)
        except ValueError as error:
            raise InputError(f"{match.path}: {error}") from error
        if columns is not None and found != columns:
            raise InputError(f"{match.path}: its header orders the columns differently from the other files")
        columns = found
    return columns


def corpus_lines(path: str) -> Iterator[tuple[str, int, bytes]]:
    """The lines after the header of one corpus file as bytes, with their line numbers. One worker reads a file
    from its start, so that dead letters and the duplicate rule know each row's file and line."""
    with open_xml(path) as handle:  # Python's own gzip/bz2 readers: a cut-short archive raises, Beam's ends quietly
        number = 1
        try:
            handle.readline()
            while raw := handle.readline():
                number += 1
                yield path, number, raw
        except ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive after line {number}: "
                             f"{str(error).strip().splitlines()[0]}") from error


def parsed_row(source: str, number: int, raw: bytes, columns: tuple[int, int, int] = (0, 1, 2)) -> Iterator[Any]:
    """One corpus line -> ((file, line), Passage), or a dead letter naming the file and line."""
    where = {"source": source, "line_number": number}
    try:
        line, had_nul = decode_corpus_line(raw)
    except UnicodeDecodeError as error:
        yield dead_letter("invalid_utf8", f"not UTF-8 at byte {error.start}: {error.reason}", **where,
                          line=raw.rstrip(b"\r\n")[:MAX_REPORTED_CHARS].decode("utf-8", errors="replace"))
        return
    if had_nul:
        count("passages_with_nul_bytes")  # cleaned, not dropped: the NULs are removed from the row
    row = parse_dpr_row(line, columns)
    if isinstance(row, BadRow):
        yield dead_letter(row.reason, row.detail, **where, line=row.line)
        return
    count("passages_read")
    yield (source, number), row


def cut_article(article: dict[str, Any], words_per_passage: int) -> Iterator[Any]:
    text = article["text"] or ""
    if not text.strip():
        count("articles_without_text")
        return
    if too_many_chunks(text, words_per_passage):
        yield dead_letter("too_long_articles", "more words than passage ids per page allow",
                          page_id=article["page_id"], title=article["title"])
    passages = article_passages(article["page_id"], article["title"], text, words_per_passage)
    count("passages_read", len(passages))
    for passage in passages:  # ids are unique by construction: the position only matches the corpus rows'
        yield ("", 0), passage


def unique_passage(passage_id: int, rows: list[tuple[Position, Passage]], keep: str = "first"
                   ) -> Iterator[Any]:
    ((kept_source, kept_line), kept), others = pick_duplicate(list(rows), keep)
    for (source, number), other in others:
        yield dead_letter("duplicate_ids", f"line {kept_line} of {kept_source} has this id (the {keep} row is kept)",
                          passage_id=passage_id, source=source, line_number=number, title=other.title,
                          text=other.text[:MAX_REPORTED_CHARS])
    yield kept


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
        unique = (rows.passages
                  | "ById" >> beam.MapTuple(lambda position, passage: (passage.passage_id, (position, passage)))
                  | "GroupById" >> beam.GroupByKey()
                  | "DropDuplicateIds" >> beam.FlatMapTuple(unique_passage, self._keep).with_outputs(
                      "dead_letter", main="passages"))
        dead = (rows.dead_letter, unique.dead_letter) | "DeadLetters" >> beam.Flatten()
        return unique.passages, dead

    def _corpus_rows(self, pipeline: beam.Pipeline) -> beam.pvalue.DoOutputsTuple:
        return (pipeline
                | "CorpusPattern" >> beam.Create([self._corpus])
                | "CorpusFiles" >> beam.FlatMap(matching_files)
                | "SpreadFiles" >> beam.Reshuffle()
                | "ReadCorpus" >> beam.FlatMap(corpus_lines)
                | "SpreadLines" >> beam.Reshuffle()
                | "ParseRows" >> beam.FlatMapTuple(parsed_row, self._columns).with_outputs(
                    "dead_letter", main="passages"))

    def _article_rows(self, pipeline: beam.Pipeline) -> beam.pvalue.DoOutputsTuple:
        return (pipeline
                | "ReadArticles" >> beam.io.ReadFromParquet(tables.parquet_pattern(self._output, layout.ARTICLES),
                                                            columns=["page_id", "title", "text"])
                | "CutPassages" >> beam.FlatMap(cut_article, self._words).with_outputs("dead_letter", main="passages"))
