"""Sums over Arrow tables by key columns, combined per bucket: what a combine holds is bounded by the distinct keys.

A count over millions of keys (anchor pairs, link targets, name occurrences) is not a ``CombinePerKey`` over those
keys: Beam's local runner pre-combines at most 100,000 keys per bundle and sends the evicted accumulators on one
by one, so the shuffle grows with the rows read. Here the rows of a batch are summed into an Arrow table, split by
a stable hash of their key into a few hundred buckets, and the tables of a bucket are combined by ``SumTables``:
its accumulator is the bucket's table of distinct keys with their sums (compacted as it grows), so a bucket holds
its distinct keys, never one element per row.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Rows an accumulator may gather before it is summed (also once it has doubled since its last sum).
COMPACT_ROWS = 1 << 18
# Tables an accumulator may hold before the newer ones are summed together (keeps adding a table cheap).
MAX_TABLES = 64


def sum_by(table: pa.Table, keys: Sequence[str], values: Sequence[str]) -> pa.Table:
    """One row per distinct combination of ``keys`` (nulls are a key value like any other) with the int64 sums of
    ``values``; the columns are ``keys`` then ``values``, rows in order of first occurrence."""
    grouped = table.group_by(list(keys), use_threads=False).aggregate([(value, "sum") for value in values])
    return grouped.select([*keys, *(f"{value}_sum" for value in values)]).rename_columns([*keys, *values])


def stable_bucket(text: str, buckets: int) -> int:
    """The bucket of a string: the CRC-32 of its UTF-8 bytes modulo ``buckets`` (Python's ``hash`` differs between
    processes, this does not)."""
    return zlib.crc32(text.encode("utf-8")) % buckets


def stable_buckets(strings: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """``stable_bucket`` of every string of an Arrow string array (each distinct string hashed once)."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    encoded = pc.dictionary_encode(strings)
    distinct = encoded.dictionary.to_pylist()
    of_distinct = np.fromiter((stable_bucket(text, buckets) for text in distinct), dtype=np.int64,
                              count=len(distinct))
    return of_distinct[encoded.indices.to_numpy(zero_copy_only=False)]


def split_by_bucket(table: pa.Table, buckets: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """(bucket, its rows) for every bucket present in ``buckets`` (one bucket number per row), in bucket order."""
    if not table.num_rows:
        return
    order = np.argsort(buckets, kind="stable")
    ordered, table = buckets[order], table.take(order)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ordered)) + 1])
    ends = np.concatenate([starts[1:], [len(ordered)]])
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(ordered[start]), table.slice(start, end - start)


def bucketed_sums(table: pa.Table, keys: Sequence[str], values: Sequence[str], bucket_column: str,
                  buckets: int) -> Iterator[tuple[int, pa.Table]]:
    """The rows of ``table`` summed by ``keys`` and split by the stable bucket of the string column
    ``bucket_column``: the elements ``SumTables`` combines per bucket."""
    summed = sum_by(table, keys, values)
    return split_by_bucket(summed, stable_buckets(summed.column(bucket_column), buckets))


class ArrowTableCoder(beam.coders.Coder):
    """An Arrow table as one IPC stream: its buffers as they are, no per-row objects (decoding is zero-copy)."""

    def encode(self, table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.Table:
        return pa.ipc.open_stream(encoded).read_all()

    def is_deterministic(self) -> bool:
        return False


class SumTables(beam.CombineFn):
    """Sum the ``values`` columns of Arrow tables by their ``keys`` columns (every input has those columns).

    The accumulator is a list of tables, summed into one whenever it holds ``compact_rows`` rows and twice as many as
    after its last sum (and the newer tables summed among themselves when there are more than ``MAX_TABLES``): its
    size stays within about twice the distinct keys (plus ``compact_rows``). The output is one table, one row per
    distinct key, in key order."""

    def __init__(self, keys: Sequence[str], values: Sequence[str], compact_rows: int = COMPACT_ROWS) -> None:
        super().__init__()
        self._keys, self._values = tuple(keys), tuple(values)
        self._compact_rows = compact_rows

    def create_accumulator(self) -> list[pa.Table]:
        return []

    def add_input(self, accumulator: list[pa.Table], table: pa.Table) -> list[pa.Table]:
        accumulator.append(table)
        return self._bounded(accumulator)

    def merge_accumulators(self, accumulators: Iterable[list[pa.Table]]) -> list[pa.Table]:
        return self._bounded([table for accumulator in accumulators for table in accumulator])

    def compact(self, accumulator: list[pa.Table]) -> list[pa.Table]:
        return [self._summed(accumulator)] if len(accumulator) > 1 else accumulator

    def extract_output(self, accumulator: list[pa.Table]) -> pa.Table:
        return self._summed(accumulator).sort_by([(key, "ascending") for key in self._keys])

    def get_accumulator_coder(self) -> beam.coders.Coder:
        return beam.coders.ListCoder(ArrowTableCoder())

    def _bounded(self, accumulator: list[pa.Table]) -> list[pa.Table]:
        if len(accumulator) > MAX_TABLES:  # the tables added since the last sum, summed among themselves
            accumulator = [accumulator[0], self._summed(accumulator[1:])]
        rows = sum(table.num_rows for table in accumulator)
        if len(accumulator) > 1 and rows >= max(self._compact_rows, 2 * accumulator[0].num_rows):
            return [self._summed(accumulator)]
        return accumulator

    def _summed(self, accumulator: list[pa.Table]) -> pa.Table:
        if not accumulator:
            raise ValueError("SumTables has no table to sum: a bucket exists only once a table is added to it")
        return sum_by(pa.concat_tables(accumulator), self._keys, self._values)

