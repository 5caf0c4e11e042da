"""Packed numpy record arrays keyed by a small number of buckets (``id % buckets``): what per-entity aggregations
send through a shuffle instead of one Python object per entity (the local runner holds every grouping's input
whole, and its pre-combine over millions of keys would barely combine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import apache_beam as beam
import numpy as np

from artifacts.arrays import group_starts, split_by
from transforms.common.dead_letters import count_some

# A bucket's pending (not yet compacted) rows may reach this many before compacting, or as many as it keeps.
MIN_PENDING_ROWS = 1 << 18


def bucket_of(ids: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each id."""
    return np.asarray(ids, dtype=np.int64) % buckets


def split_by_bucket(rows: np.ndarray, key: str, buckets: int) -> Iterator[tuple[int, np.ndarray]]:
    """(bucket, the rows of ``rows`` in it) for every bucket that has rows; ``key``: the field of the id."""
    return split_by(rows, bucket_of(rows[key], buckets))


def found_in(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each of ``keys`` is in ``sorted_keys``, its position there where it is)."""
    where = np.searchsorted(sorted_keys, keys)
    inside = where < len(sorted_keys)
    found = np.zeros(len(keys), dtype=bool)
    found[inside] = sorted_keys[where[inside]] == keys[inside]
    return found, where


def rank_in_group(ids: np.ndarray) -> np.ndarray:
    """For sorted ``ids``: each position's rank among the positions of the same id (0, 1, 2, ...)."""
    starts = group_starts(ids)
    lengths = np.diff(np.r_[starts, len(ids)])
    return np.arange(len(ids)) - np.repeat(starts, lengths)


class PackedCombineFn(beam.CombineFn):
    """Combines record arrays of one dtype with ``compact`` (array -> array, e.g. a bottom-k per entity or a sum
    per entity). An accumulator is ``[kept, *pending]``: ``kept`` compacted, the pending parts compacted into it
    when they reach its size (at least ``MIN_PENDING_ROWS``), so it stays within about twice what ``compact``
    keeps. ``compact`` of a concatenation of compacted parts must equal ``compact`` of all their rows."""

    def __init__(self, compact: Callable[[np.ndarray], np.ndarray], dtype: np.dtype) -> None:
        self._compact = compact
        self._dtype = np.dtype(dtype)

    def create_accumulator(self) -> list[np.ndarray]:
        return [np.zeros(0, self._dtype)]

    def add_input(self, accumulator: list[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
        accumulator.append(rows)
        pending = sum(len(part) for part in accumulator[1:])
        return self.compact(accumulator) if pending >= max(len(accumulator[0]), MIN_PENDING_ROWS) else accumulator

    def merge_accumulators(self, accumulators) -> list[np.ndarray]:
        parts = [part for accumulator in accumulators for part in accumulator]
        return self.compact([np.zeros(0, self._dtype), *parts])

    def compact(self, accumulator: list[np.ndarray]) -> list[np.ndarray]:
        if len(accumulator) == 1:
            return accumulator
        return [self._compact(np.concatenate(accumulator))]

    def extract_output(self, accumulator: list[np.ndarray]) -> np.ndarray:
        return self.compact(accumulator)[0]


ENTITY_ID = np.dtype([("entity_id", "<i4")])
DISTINCT_BUCKETS = 16


def distinct_ids(rows: np.ndarray) -> np.ndarray:
    """The distinct ``ENTITY_ID`` rows of ``rows``, sorted."""
    return np.unique(rows)


def entity_ids_by_bucket(rows: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(bucket, distinct ``ENTITY_ID`` rows) of record arrays with an ``entity_id`` field."""
    ids = np.unique(rows["entity_id"]).astype(ENTITY_ID["entity_id"]).view(ENTITY_ID)
    return split_by_bucket(ids, "entity_id", DISTINCT_BUCKETS)


class CountEntities(beam.PTransform):
    """Record arrays with an ``entity_id`` field -> counts ``counter`` once per distinct entity id (a combine of
    packed ids over a few buckets)."""

    def __init__(self, counter: str) -> None:
        super().__init__()
        self._counter = counter

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        return (rows | "IdsByBucket" >> beam.FlatMap(entity_ids_by_bucket)
                | "DistinctPerBucket" >> beam.CombinePerKey(PackedCombineFn(distinct_ids, ENTITY_ID))
                | "Count" >> beam.MapTuple(lambda _, ids: count_some(self._counter, len(ids))))
