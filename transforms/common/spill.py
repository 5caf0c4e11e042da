"""Aggregations whose state is as large as their output (anchor pairs, link targets, name counts, the bottom-k
samples of ~100M mentions), kept on disk by bucket instead of in a grouping.

Beam's local runner holds every grouping's whole input in its own process, and even a combine's accumulators are
as large as the aggregate. Here each worker gathers the Arrow tables it makes, ``compact``s each bucket's share
(sums by key, k smallest, ...) and writes them as one part file, an Arrow IPC file with a record batch per bucket,
where they were made (``SpillByBucket``). Only (bucket, ``Part``) descriptors go through the grouping; each bucket
is then reduced on its own from its parts (``reduce_parts``): one bucket in memory at a time, whatever the total.
(Arrow IPC, not Parquet: a reduce reads one batch of hundreds of files, and an IPC footer is a few bytes per batch
where a Parquet footer describes every column of every row group.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from artifacts import fs

# Rows a worker gathers before it compacts them and writes a part file (~12 MB of anchor pairs).
SPILL_ROWS = 1 << 18
# Rows a reduce reads before it compacts them (also once they reach what it has kept).
COMPACT_ROWS = 1 << 20
Compact = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True, order=True)
class Part:
    """One bucket's rows in a spilled part file: record batch ``batch`` of the Arrow IPC file ``path``."""

    path: str
    batch: int


def write_part(path: str, tables: Sequence[tuple[int, pa.Table]]) -> list[tuple[int, Part]]:
    """One Arrow IPC file at ``path`` with a record batch per (bucket, table) (empty tables left out; all of one
    schema); returns (bucket, its Part) of each."""
    written: list[tuple[int, Part]] = []
    kept = [(bucket, table) for bucket, table in tables if table.num_rows]
    if not kept:
        return written
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with fs.create(path) as handle, pa.ipc.new_file(handle, kept[0][1].schema, options=options) as writer:
        for batch, (bucket, table) in enumerate(kept):
            writer.write_batch(table.combine_chunks().to_batches()[0])
            written.append((bucket, Part(path, batch)))
    return written


def read_parts(parts: Iterable[Part], columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """``columns`` (None: all) of the tables of ``parts``, file by file, each file opened once (remote files several
    at a time: ``fs.read_each``)."""
    by_file: dict[str, list[int]] = {}
    for part in parts:
        by_file.setdefault(part.path, []).append(part.batch)
    opener = IpcColumns(columns)

    def read(path: str) -> list[pa.Table]:
        with fs.open_ranges(path) as handle:
            opened = opener.open(handle)
            return [pa.Table.from_batches([opened.get_batch(batch)]) for batch in sorted(by_file[path])]

    paths = sorted(by_file)
    if paths:  # the first file alone: the others find the columns' indices it looked up
        yield from read(paths[0])
    for tables in fs.read_each(paths[1:], read):
        yield from tables


class IpcColumns:
    """Opens Arrow IPC files for reading ``columns`` only (None: all; in the files' order): only their buffers are
    read. The columns' indices are found in the first file's schema; a later file of the same schema has its footer
    read once (from an object store each read is a request), one of another schema is looked up again."""

    def __init__(self, columns: Sequence[str] | None) -> None:
        self._columns = None if columns is None else list(columns)
        self._fields: list[int] | None = None

    def open(self, handle: Any) -> pa.ipc.RecordBatchFileReader:
        if self._columns is None:
            return pa.ipc.open_file(handle)
        if self._fields is not None:
            opened = self._with_fields(handle)
            if opened.schema.names == self._columns:
                return opened
        whole = pa.ipc.open_file(handle)
        if whole.schema.names == self._columns:
            return whole
        self._fields = [whole.schema.get_field_index(name) for name in self._columns]
        return self._with_fields(handle)

    def _with_fields(self, handle: Any) -> pa.ipc.RecordBatchFileReader:
        return pa.ipc.open_file(handle, options=pa.ipc.IpcReadOptions(included_fields=self._fields))


def reduce_parts(parts: Iterable[Part], compact: Compact, compact_rows: int = COMPACT_ROWS) -> pa.Table | None:
    """``compact`` of all the rows of ``parts`` (None if there are none), read a part at a time and compacted
    whenever the rows read reach what was kept (at least ``compact_rows``): about twice what ``compact`` keeps is
    held. ``compact`` of compacted pieces must equal ``compact`` of their rows."""
    kept: pa.Table | None = None
    pending: list[pa.Table] = []
    pending_rows = 0
    for table in read_parts(parts):
        pending.append(table)
        pending_rows += table.num_rows
        if pending_rows >= max(compact_rows, kept.num_rows if kept is not None else 0):
            kept = compact(pa.concat_tables([*([kept] if kept is not None else []), *pending]))
            pending, pending_rows = [], 0
    if pending:
        kept = compact(pa.concat_tables([*([kept] if kept is not None else []), *pending]))
    return kept


class GatheringDoFn(beam.DoFn):
    """A DoFn that gathers what it is given and emits it in batches: ``_flush()`` empties what was gathered into
    its outputs, which ``process`` yields when a batch is full and the bundle's end yields for the rest."""

    def _flush(self) -> list[Any]:
        raise NotImplementedError

    def finish_bundle(self) -> Iterator[object]:
        for element in self._flush():
            yield GlobalWindows.windowed_value(element)


class SpillByBucket(GatheringDoFn):
    """(bucket, Arrow table) -> (bucket, ``Part``): a worker's tables gathered until ``spill_rows``, each
    bucket's ``compact``ed, then written as one part file under ``directory``."""

    def __init__(self, directory: str, compact: Compact, spill_rows: int = SPILL_ROWS) -> None:
        self._directory, self._compact, self._spill_rows = directory, compact, spill_rows

    def start_bundle(self) -> None:
        self._tables: dict[int, list[pa.Table]] = {}
        self._rows = 0

    def process(self, element: tuple[int, pa.Table]) -> Iterator[tuple[int, Part]]:
        bucket, table = element
        self._tables.setdefault(bucket, []).append(table)
        self._rows += table.num_rows
        if self._rows >= self._spill_rows:
            yield from self._flush()

    def _flush(self) -> list[tuple[int, Part]]:
        tables, self._tables, self._rows = self._tables, {}, 0
        compacted = [(bucket, self._compact(pa.concat_tables(tables[bucket]))) for bucket in sorted(tables)]
        return write_part(fs.join(self._directory, f"part-{uuid.uuid4().hex}.arrow"), compacted)


def without_none(bucket: int, parts: Iterable[Part | None]) -> tuple[int, list[Part]]:
    return bucket, [part for part in parts if part is not None]


class SpillAndGroup(beam.PTransform):
    """(bucket, Arrow table) -> (bucket, [``Part``]): the tables spilled by ``SpillByBucket``, their parts grouped
    by bucket. With ``buckets``, each of buckets 0..buckets-1 appears (an empty list: no rows); otherwise only the
    buckets with rows do."""

    def __init__(self, directory: str, compact: Compact, buckets: int | None = None,
                 spill_rows: int = SPILL_ROWS) -> None:
        super().__init__()
        self._directory, self._compact, self._buckets, self._spill_rows = directory, compact, buckets, spill_rows

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        parts = tables | "Spill" >> beam.ParDo(SpillByBucket(self._directory, self._compact, self._spill_rows))
        if self._buckets is not None:
            every = (tables.pipeline | "EveryBucket" >> beam.Create(range(self._buckets))
                     | "NoPart" >> beam.Map(lambda bucket: (bucket, None)))
            parts = (parts, every) | "WithEveryBucket" >> beam.Flatten()
        return parts | "PartsByBucket" >> beam.GroupByKey() | "Parts" >> beam.MapTuple(without_none)
