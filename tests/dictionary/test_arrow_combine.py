"""Sums of Arrow tables by key: against a plain dict count, whatever the batches, buckets, spills and part order."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from functools import partial
from unittest import mock

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.common.spill import SpillAndGroup, reduce_parts, write_part
from transforms.dictionary.arrow_combine import (
    bucket_sums,
    bucketed_sums,
    split_by_bucket,
    stable_bucket,
    stable_buckets,
    sum_by,
    summed_by,
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
def test_bucket_sums_equal_a_dict_count_in_any_order_of_parts(seed, tmp_path):
    """Batches spilled in random groups to part files, reduced from the parts in random order and compacted at
    tiny sizes: the sums of a dict count, in key order."""
    rows = random_rows(seed, 2000)
    rng = random.Random(seed)
    parts = []
    for index, table in enumerate(batches(rows, seed)):
        parts += [part for _, part in write_part(str(tmp_path / f"part-{index}.arrow"),
                                                 [(0, sum_by(table, KEYS, VALUES))])]
    rng.shuffle(parts)
    with mock.patch("transforms.dictionary.arrow_combine.reduce_parts",
                    partial(reduce_parts, compact_rows=rng.choice([1, 7, 50]))):
        result = bucket_sums(parts, KEYS, VALUES)
    assert table_sums(result) == dict_sums(rows)
    keys = list(zip(result.column("name").to_pylist(), result.column("target").to_pylist(), strict=True))
    assert keys == sorted(keys, key=lambda key: (key[0], key[1] is None, key[1] or ""))  # key order, nulls last


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


def test_spilled_sums_per_bucket_in_a_pipeline(tmp_path):
    rows = random_rows(5, 3000)
    expected = dict_sums(rows)
    with TestPipeline() as pipeline:
        summed = (
            pipeline
            | beam.Create(batches(rows, 5))
            | beam.FlatMap(lambda table: bucketed_sums(table, KEYS, VALUES, "name", 4))
            | SpillAndGroup(str(tmp_path), summed_by(KEYS, VALUES), spill_rows=50)
            | beam.FlatMap(lambda bucket_parts: sorted(table_sums(bucket_sums(bucket_parts[1], KEYS, VALUES)).items(),
                                                       key=repr))
        )
        assert_that(summed, equal_to(sorted(expected.items(), key=repr)))
