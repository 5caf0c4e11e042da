"""Read the rows of Parquet files where they lie, spread over the workers by row range, a few rows at a time.

Beam's ReadFromParquet splits a file by byte ranges of 64 MB (a smaller file is one piece: one worker reads it all)
and turns a whole row group into Python objects at once. Here only file names enter the graph; a worker step
reads their footers and cuts each row group into ranges of at most ``unit_rows`` rows, the ranges are
reshuffled (descriptors, not rows) so every worker gets some, and each range is read and converted
``batch_rows`` rows at a time (the memory of one row group's columns at most, never a file's).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa

from artifacts.schemas import PARQUET_CODEC
from transforms.common.article_shards import parquet_file

UNIT_ROWS = 256  # rows per unit of work: small enough that a sample's few row groups still spread over workers
BATCH_ROWS = 64  # rows converted from Arrow to Python at a time (and from Python to Arrow when writing)
ROW_GROUP_BYTES = 2 << 20  # Arrow bytes per written row group: a reader decodes at most one row group at a time


@dataclass(frozen=True)
class RowRange:
    """Rows ``start`` to ``stop`` (exclusive) of row group ``row_group`` of the Parquet file ``path``."""

    path: str
    row_group: int
    start: int
    stop: int


def cut_row_groups(path: str, row_group_rows: Sequence[int], unit_rows: int) -> Iterator[RowRange]:
    """Ranges of at most ``unit_rows`` rows covering every row group (of ``row_group_rows[i]`` rows) once, a row
    group's ranges of equal size (within a row). Beam's local runner deals the ranges to its workers in turn: a
    384-row group cut 256 + 128 gave one of two workers every long range and twice the other's work."""
    for row_group, rows in enumerate(row_group_rows):
        pieces = -(-rows // unit_rows)
        for piece in range(pieces):
            yield RowRange(path, row_group, rows * piece // pieces, rows * (piece + 1) // pieces)


def row_ranges(path: str, unit_rows: int = UNIT_ROWS) -> Iterator[RowRange]:
    """The row ranges of one Parquet file, from its footer."""
    with parquet_file(path) as opened:
        metadata = opened.metadata
    rows = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
    return cut_row_groups(path, rows, unit_rows)


def batch_rows(batches: Iterator[pa.RecordBatch], start: int, stop: int) -> Iterator[dict[str, Any]]:
    """Rows ``start`` to ``stop`` of a stream of record batches, as dicts, one batch converted at a time."""
    offset = 0
    for batch in batches:
        begin, end = max(start - offset, 0), min(stop - offset, batch.num_rows)
        if begin < end:
            yield from batch.slice(begin, end - begin).to_pylist()
        offset += batch.num_rows
        if offset >= stop:
            return


def read_table(unit: RowRange, columns: list[str] | None) -> pa.Table:
    """The rows of one range as one Arrow table."""
    with parquet_file(unit.path) as opened:
        return opened.read_row_group(unit.row_group, columns=columns).slice(unit.start, unit.stop - unit.start)


def read_rows(unit: RowRange, columns: list[str] | None, batch_size: int = BATCH_ROWS) -> Iterator[dict[str, Any]]:
    """The rows of one range as dicts (only the row group's pages up to ``stop`` are decoded)."""
    with parquet_file(unit.path) as opened:
        batches = opened.iter_batches(batch_size=batch_size, row_groups=[unit.row_group], columns=columns)
        yield from batch_rows(batches, unit.start, unit.stop)


class SpreadRowRanges(beam.PTransform):
    """A pipeline's root -> the ``RowRange``s of the Parquet files ``paths`` (at most ``unit_rows`` rows each),
    reshuffled so that every worker reads some: Beam's local runner gives a file read all to one worker."""

    def __init__(self, paths: Sequence[str], unit_rows: int = UNIT_ROWS) -> None:
        super().__init__()
        self._paths, self._unit_rows = list(paths), unit_rows

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            root
            | "Files" >> beam.Create(self._paths)
            | "CutRowGroups" >> beam.FlatMap(row_ranges, self._unit_rows)
            | "SpreadRanges" >> beam.Reshuffle()
        )


class ReadParquetRows(beam.PTransform):
    """A pipeline's root -> the rows (dicts of ``columns``) of the Parquet files ``paths``, spread over workers."""

    def __init__(self, paths: Sequence[str], columns: list[str] | None = None, unit_rows: int = UNIT_ROWS) -> None:
        super().__init__()
        self._paths, self._columns, self._unit_rows = list(paths), columns, unit_rows

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (root | "Ranges" >> SpreadRowRanges(self._paths, self._unit_rows)
                | "ReadRanges" >> beam.FlatMap(read_rows, self._columns))


class ReadParquetRowGroups(beam.PTransform):
    """A pipeline's root -> one Arrow table of ``columns`` per row group of the Parquet files ``paths``, spread
    over workers."""

    def __init__(self, paths: Sequence[str], columns: list[str] | None = None) -> None:
        super().__init__()
        self._paths, self._columns = list(paths), columns

    def expand(self, root: beam.pvalue.PBegin) -> beam.PCollection:
        return (root | "RowGroups" >> SpreadRowRanges(self._paths, unit_rows=1 << 62)
                | "ReadRowGroups" >> beam.Map(read_table, self._columns))


def write_parquet_rows(prefix: str, schema: pa.Schema) -> beam.PTransform:
    """Rows (dicts) -> Parquet files under ``prefix``, compressed as every artifact. Rows are turned into Arrow
    ``BATCH_ROWS`` at a time (Beam's default, 1000, holds 1000 articles with their links as Python objects) and
    written in row groups of about ``ROW_GROUP_BYTES``."""
    return beam.io.WriteToParquet(prefix, schema, file_name_suffix=".parquet", codec=PARQUET_CODEC,
                                  row_group_buffer_size=ROW_GROUP_BYTES, record_batch_size=BATCH_ROWS)
