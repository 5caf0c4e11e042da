"""Sums over Arrow tables by key columns, by bucket: what a bucket holds is bounded by its distinct keys.

A count over millions of keys (anchor pairs, link targets, name occurrences) is not a ``CombinePerKey`` over those
keys: Beam's local runner pre-combines at most 100,000 keys per bundle and sends the evicted accumulators on one
by one, so the shuffle grows with the rows read. Here the rows of a batch are summed into an Arrow table and split
by a stable hash of their key into a few hundred buckets; the tables of a bucket are summed where they are made and
spilled (``transforms/common/spill.py``), then each bucket's parts are summed on their own (``bucket_sums``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.common.spill import Part, reduce_parts


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
    ``bucket_column``: the elements spilled and summed per bucket."""
    summed = sum_by(table, keys, values)
    return split_by_bucket(summed, stable_buckets(summed.column(bucket_column), buckets))


def summed_by(keys: Sequence[str], values: Sequence[str]) -> Callable[[pa.Table], pa.Table]:
    """``sum_by`` with its key and value columns bound: what ``SpillAndGroup`` compacts a bucket with."""
    return partial(sum_by, keys=tuple(keys), values=tuple(values))


def bucket_sums(parts: Iterable[Part], keys: Sequence[str], values: Sequence[str]) -> pa.Table | None:
    """The sums of a bucket's spilled parts, one row per distinct key, in key order (None: no rows)."""
    table = reduce_parts(parts, summed_by(keys, values))
    return None if table is None else table.sort_by([(key, "ascending") for key in keys])
