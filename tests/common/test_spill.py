"""Spilled aggregations: tables written by bucket where they are made, each bucket reduced from its parts."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts import fs
from tests.builders import MirrorFileSystem, mirrored
from transforms.common.spill import IpcColumns, Part, SpillAndGroup, read_parts, reduce_parts, write_part

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64())])


def table(pairs: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"key": [key for key, _ in pairs], "value": [value for _, value in pairs]}, schema=SCHEMA)


def smallest_two_per_key(rows: pa.Table) -> pa.Table:
    """A compaction that is not a sum: per key, its two smallest values, sorted."""
    ordered = rows.sort_by([("key", "ascending"), ("value", "ascending")])
    keys = ordered.column("key").to_numpy()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, dtype=np.int64)
    rank = np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
    return ordered.filter(pa.array(rank < 2))


def test_a_part_file_holds_a_batch_per_bucket_and_leaves_out_empty_ones(tmp_path):
    written = write_part(str(tmp_path / "part.arrow"), [(3, table([(1, 5)])), (4, table([])),
                                                          (7, table([(2, 6), (2, 7)]))])
    assert written == [(3, Part(str(tmp_path / "part.arrow"), 0)), (7, Part(str(tmp_path / "part.arrow"), 1))]
    assert [part.to_pylist() for part in read_parts([part for _, part in written][::-1])] == [
        [{"key": 1, "value": 5}], [{"key": 2, "value": 6}, {"key": 2, "value": 7}]]
    assert write_part(str(tmp_path / "none.arrow"), [(1, table([]))]) == []
    assert not (tmp_path / "none.arrow").exists()


def test_a_part_is_read_with_the_columns_asked_only(tmp_path):
    """Only the asked columns' buffers are fetched from the file (a reduce reads the keys, then the vectors)."""
    rng = np.random.default_rng(0)  # random bytes: the file's compression leaves them as large
    wide = pa.table({"key": pa.array(range(1000), pa.int64()), "payload": [rng.bytes(4000) for _ in range(1000)]})
    written = write_part(str(tmp_path / "part.arrow"), [(0, wide.slice(0, 10)), (1, wide.slice(10))])
    part = Part(mirrored(written[1][1].path), written[1][1].batch)
    MirrorFileSystem.log.clear()
    [keys] = read_parts([part], ["key"])
    assert keys.column_names == ["key"] and keys.column("key").to_pylist() == list(range(10, 1000))
    assert sum(MirrorFileSystem.log.fetched) < 2 * fs.RANGE_READ_BYTES  # the payload's ~4 MB was not fetched
    [whole] = read_parts([part])
    assert whole.column_names == ["key", "payload"] and sum(MirrorFileSystem.log.fetched) > 3_960_000
    for columns in (["key", "payload"], ["payload", "key"]):  # in the file's order
        assert next(read_parts([part], columns)).equals(whole)


def test_columns_are_found_by_name_in_every_file_and_a_later_footer_read_once(tmp_path):
    """The columns' indices come from the first file; a file of the same schema then opens once (its footer read
    once: a request less from an object store), and one whose columns lie in another order is looked up again."""
    first = write_part(str(tmp_path / "a.arrow"), [(0, table([(1, 10)]))])[0][1]
    same = write_part(str(tmp_path / "b.arrow"), [(0, table([(2, 20)]))])[0][1]
    swapped = write_part(str(tmp_path / "c.arrow"), [(0, pa.table({"value": [30], "key": [3]}))])[0][1]
    opener, footers = IpcColumns(["value"]), []
    for part, value in ((first, 10), (same, 20), (swapped, 30)):
        MirrorFileSystem.log.clear()
        with fs.open_ranges(mirrored(part.path)) as handle:
            assert opener.open(handle).get_batch(0).to_pylist() == [{"value": value}]
        footers.append(MirrorFileSystem.log.fetched.count(10))  # each open reads the file's last 10 bytes
    assert footers == [2, 1, 3]  # the last: opened as the one before, then whole, then with its own indices
    parts = [Part(mirrored(part.path), part.batch) for part in (first, same, swapped)]
    assert [piece.to_pylist() for piece in read_parts(parts, ["value"])] == [[{"value": 10}], [{"value": 20}],
                                                                              [{"value": 30}]]


def test_a_buckets_read_from_an_object_store_fetches_its_own_bytes(tmp_path):
    """A reduce reads one bucket of each of hundreds of part files: from an object store each read fetches about
    the bucket's bytes, not the 16 MB Beam's reader fetches at each read outside its buffer."""
    rng = np.random.default_rng(0)
    buckets = [(bucket, pa.table({"key": rng.integers(0, 1 << 62, 8192)})) for bucket in range(512)]  # 64 KB each
    path = str(tmp_path / "part.arrow")
    write_part(path, buckets)
    MirrorFileSystem.log.clear()
    [read] = read_parts([Part(mirrored(path), 300)])
    assert read.equals(buckets[300][1])
    ranged = sum(MirrorFileSystem.log.fetched)
    assert ranged < fs.RANGE_READ_BYTES + 65_536 + 40_000  # the batch (and what follows), the footer, its tail
    MirrorFileSystem.log.clear()
    with fs.open_read(mirrored(path)) as handle:  # Beam's reader as it is: what each read cost before
        assert pa.ipc.open_file(handle).get_batch(300).equals(read.to_batches()[0])
    assert sum(MirrorFileSystem.log.fetched) > 30 * ranged


def test_a_buckets_parts_are_read_several_at_a_time_from_an_object_store_in_their_order(tmp_path):
    parts = [part for index in range(24)
             for _, part in write_part(str(tmp_path / f"{index:02d}.arrow"), [(0, table([(index, index)])),
                                                                            (1, table([(index, -index)]))])]
    MirrorFileSystem.log.clear(delay=0.01)
    read = [piece.to_pylist() for piece in read_parts([Part(mirrored(part.path), part.batch) for part in parts])]
    assert read == [[{"key": index, "value": value}] for index in range(24) for value in (index, -index)]
    assert MirrorFileSystem.log.most_at_once > 4


def test_reduce_compacts_as_it_reads_and_equals_one_compaction_of_all_rows(tmp_path):
    rng = np.random.default_rng(0)
    pieces = [table([(int(key), int(value)) for key, value in rng.integers(0, 20, size=(30, 2))])
              for _ in range(12)]
    parts = [part for index, piece in enumerate(pieces)
             for _, part in write_part(str(tmp_path / f"{index}.arrow"), [(0, smallest_two_per_key(piece))])]
    expected = smallest_two_per_key(pa.concat_tables(pieces))
    for compact_rows in (1, 10, 10**6):
        assert reduce_parts(parts, smallest_two_per_key, compact_rows).equals(expected)
    assert reduce_parts([], smallest_two_per_key) is None


@pytest.mark.parametrize("remote", [False, True], ids=["local", "object-store"])
def test_spill_and_group_gives_every_bucket_its_parts_and_nothing_else_travels(tmp_path, remote):
    elements = [(bucket, table([(bucket * 100 + index, index)])) for index in range(40) for bucket in (0, 2)]
    MirrorFileSystem.log.clear(delay=0.005 if remote else 0.0)
    with TestPipeline() as pipeline:
        reduced = (pipeline | beam.Create(elements)
                   | SpillAndGroup(mirrored(tmp_path) if remote else str(tmp_path), smallest_two_per_key, buckets=4,
                                   spill_rows=7)
                   | beam.MapTuple(lambda bucket, parts: (
                       bucket, all(isinstance(part, Part) for part in parts),
                       sorted((reduce_parts(parts, smallest_two_per_key) or table([])).column("key").to_pylist()))))
        assert_that(reduced, equal_to([(0, True, list(range(40))), (1, True, []),
                                       (2, True, list(range(200, 240))), (3, True, [])]))
    assert len(list(tmp_path.glob("part-*.arrow"))) >= 80 // 7  # spilled every 7 rows, not once at the end
    assert (MirrorFileSystem.log.most_at_once > 1) == remote  # a bucket's parts read several at a time
