"""transforms/common/packed.py: splitting record arrays by bucket, ranks in groups, the packed combine (compacting as it
goes equals compacting once), distinct counts."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.arrays import split_by
from tests.builders import run_counting
from transforms.common import packed
from transforms.common.packed import ENTITY_ID, CountEntities, PackedCombineFn, rank_in_group, split_by_bucket

ROW = np.dtype([("entity_id", "<i4"), ("value", "<i8")])


def rows(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.array(pairs, dtype=ROW)


def test_split_by_bucket_keeps_each_rows_order_within_its_bucket():
    found = [(bucket, part.tolist()) for bucket, part in split_by_bucket(rows([(4, 0), (1, 1), (7, 2), (3, 3)]),
                                                                         "entity_id", 3)]
    assert found == [(0, [(3, 3)]), (1, [(4, 0), (1, 1), (7, 2)])]
    assert list(split_by(rows([]), np.zeros(0))) == []


def test_rank_in_group_numbers_runs_of_equal_ids():
    assert rank_in_group(np.array([2, 2, 2, 5, 7, 7])).tolist() == [0, 1, 2, 0, 0, 1]
    assert rank_in_group(np.array([], dtype=np.int64)).tolist() == []


def smallest_two(found: np.ndarray) -> np.ndarray:
    """Per entity its two smallest values: a compaction (associative)."""
    found = found[np.lexsort((found["value"], found["entity_id"]))]
    return found[rank_in_group(found["entity_id"]) < 2]


def test_packed_combine_compacts_as_it_goes_and_equals_one_compaction(monkeypatch):
    monkeypatch.setattr(packed, "MIN_PENDING_ROWS", 4)
    rng = np.random.default_rng(0)
    parts = [rows([(int(entity), int(value)) for entity, value in zip(rng.integers(0, 5, 7), rng.integers(0, 99, 7),
                                                                      strict=True)]) for _ in range(30)]
    combine = PackedCombineFn(smallest_two, ROW)
    accumulator = combine.create_accumulator()
    for part in parts[:20]:
        accumulator = combine.add_input(accumulator, part)
        assert sum(len(piece) for piece in accumulator) <= 2 * 10 + 4 + 7  # kept (5 entities x 2) + pending
    other = combine.create_accumulator()
    for part in parts[20:]:
        other = combine.add_input(other, part)
    merged = combine.extract_output(combine.merge_accumulators([accumulator, other]))
    assert merged.tolist() == smallest_two(np.concatenate(parts)).tolist()
    assert combine.extract_output(combine.create_accumulator()).tolist() == []


def test_packed_combine_per_bucket_in_a_pipeline():
    parts = [(0, rows([(2, 5), (2, 1), (4, 9)])), (0, rows([(2, 3), (4, 8), (4, 7)])), (1, rows([(1, 6)]))]
    with TestPipeline(runner="DirectRunner") as pipeline:
        combined = (pipeline | beam.Create(parts) | beam.CombinePerKey(PackedCombineFn(smallest_two, ROW))
                    | beam.MapTuple(lambda bucket, found: (bucket, found.tolist())))
        assert_that(combined, equal_to([(0, [(2, 1), (2, 3), (4, 7), (4, 8)]), (1, [(1, 6)])]))


def test_count_entities_counts_distinct_ids_once():
    arrays = [np.array([(3,), (5,), (3,)], dtype=ENTITY_ID), np.array([(5,), (40,)], dtype=ENTITY_ID)]

    def build(pipeline: beam.Pipeline) -> None:
        _ = pipeline | beam.Create(arrays) | CountEntities("entities_recomputed")

    assert run_counting(build) == {"entities_recomputed": 3}
