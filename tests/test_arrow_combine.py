"""Sums of Arrow tables by key: against a plain dict count, whatever the batches, buckets and merge order."""

from __future__ import annotations

import random
import zlib
from collections import Counter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.arrow_combine import (
    MAX_TABLES,
    ArrowTableCoder,
    SumTables,
    bucketed_sums,
    split_by_bucket,
    stable_bucket,
    stable_buckets,
    sum_by,
)

SCHEMA = pa.schema([("name", pa.string()), ("target", pa.string()), ("count", pa.int64()), ("weight", pa.int64())])
KEYS, VALUES = ("name", "target"), ("count", "weight")
WORDS = ["mercury", "venus", "earth", "mars", "Straße", "İstanbul", "東京", ""]


def random_rows(seed: int, rows: int) -> list[tuple[str, str | None, int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(WORDS), rng.choice([*WORDS[:4], None]), rng.randint(0, 5), rng.randint(-3, 3))
            for _ in range(rows)]


def table_of(rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row, strict=True)) for row in rows], schema=SCHEMA)


def dict_sums(rows: list[tuple]) -> dict[tuple, tuple[int, int]]:
    counts, weights = Counter(), Counter()
    for name, target, count, weight in rows:
        counts[(name, target)] += count
        weights[(name, target)] += weight
    return {key: (counts[key], weights[key]) for key in counts}


def table_sums(table: pa.Table) -> dict[tuple, tuple[int, int]]:
    return {(row["name"], row["target"]): (row["count"], row["weight"]) for row in table.to_pylist()}


def batches(rows: list[tuple], seed: int) -> list[pa.Table]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(rows)), 20))
    return [table_of(rows[start:end]) for start, end in zip([0, *cuts], [*cuts, len(rows)], strict=True)]


def test_sum_by_is_a_dict_count_with_null_keys():
    rows = random_rows(0, 500)
    summed = sum_by(table_of(rows), KEYS, VALUES)
    assert summed.column_names == list(SCHEMA.names)
    assert summed.num_rows == len(dict_sums(rows))
    assert table_sums(summed) == dict_sums(rows)


@pytest.mark.parametrize("seed", range(5))
def test_sum_tables_equals_a_dict_count_in_any_order_of_adds_and_merges(seed):
    """Batches added to accumulators in random groups, compacted at tiny sizes, merged in random order."""
    rows = random_rows(seed, 2000)
    rng = random.Random(seed)
    combine = SumTables(KEYS, VALUES, compact_rows=rng.choice([1, 7, 50]))
    accumulators = []
    for table in batches(rows, seed):
        if not accumulators or rng.random() < 0.3:
            accumulators.append(combine.create_accumulator())
        index = rng.randrange(len(accumulators))
        accumulators[index] = combine.add_input(accumulators[index], table)
    rng.shuffle(accumulators)
    coder = combine.get_accumulator_coder()
    decoded = [coder.decode(coder.encode(combine.compact(accumulator))) for accumulator in accumulators]
    result = combine.extract_output(combine.merge_accumulators(decoded))
    assert table_sums(result) == dict_sums(rows)
    keys = list(zip(result.column("name").to_pylist(), result.column("target").to_pylist(), strict=True))
    assert keys == sorted(keys, key=lambda key: (key[0], key[1] is None, key[1] or ""))  # key order, nulls last


@pytest.mark.parametrize("compact_rows", [100, 10**9])
def test_an_accumulator_stays_near_its_distinct_keys(compact_rows):
    combine = SumTables(KEYS, VALUES, compact_rows=compact_rows)
    accumulator = combine.create_accumulator()
    rows = random_rows(1, 50)
    bound = min(compact_rows, (MAX_TABLES + 1) * len(rows)) + len(rows)
    for _ in range(200):
        accumulator = combine.add_input(accumulator, table_of(rows))
        assert sum(table.num_rows for table in accumulator) <= bound
        assert len(accumulator) <= MAX_TABLES
    assert table_sums(combine.extract_output(accumulator)) == {
        key: (count * 200, weight * 200) for key, (count, weight) in dict_sums(rows).items()}


def test_stable_buckets_are_crc32_of_utf8():
    strings = pa.array(WORDS * 3)
    assert stable_buckets(strings, 7).tolist() == [stable_bucket(word, 7) for word in WORDS * 3]
    assert stable_bucket("mercury", 1 << 32) == zlib.crc32(b"mercury") == 3814719399  # not Python's salted hash
    chunked = pa.chunked_array([strings[:5], strings[5:]])
    assert stable_buckets(chunked, 7).tolist() == stable_buckets(strings, 7).tolist()


def test_split_by_bucket_keeps_every_row_once():
    table = table_of(random_rows(2, 300))
    buckets = np.array([random.Random(row).randrange(9) for row in range(table.num_rows)])
    parts = list(split_by_bucket(table, buckets))
    assert [bucket for bucket, _ in parts] == sorted(set(buckets.tolist()))
    for bucket, part in parts:
        assert part.to_pylist() == table.filter(pa.array(buckets == bucket)).to_pylist()
    assert list(split_by_bucket(table.slice(0, 0), buckets[:0])) == []


def test_bucketed_sums_put_every_key_in_its_bucket():
    rows = random_rows(3, 400)
    parts = list(bucketed_sums(table_of(rows), KEYS, VALUES, "name", 5))
    assert all(stable_bucket(name, 5) == bucket for bucket, part in parts for name in part.column("name").to_pylist())
    assert {key: value for _, part in parts for key, value in table_sums(part).items()} == dict_sums(rows)


def test_coder_round_trips_slices():
    table = table_of(random_rows(4, 100)).slice(10, 30)
    assert ArrowTableCoder().decode(ArrowTableCoder().encode(table)).equals(table)


def test_combine_per_bucket_in_a_pipeline():
    rows = random_rows(5, 3000)
    expected = dict_sums(rows)
    with TestPipeline() as pipeline:
        summed = (
            pipeline
            | beam.Create(batches(rows, 5))
            | beam.FlatMap(lambda table: bucketed_sums(table, KEYS, VALUES, "name", 4))
            | beam.CombinePerKey(SumTables(KEYS, VALUES, compact_rows=10))
            | beam.FlatMap(lambda bucket_table: sorted(table_sums(bucket_table[1]).items(), key=repr))
        )
        assert_that(summed, equal_to(sorted(expected.items(), key=repr)))
