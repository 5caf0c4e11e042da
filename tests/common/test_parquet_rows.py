"""Reading Parquet rows by row range: every row once, in any cut of the row groups and batches."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts import fs
from tests.builders import MirrorFileSystem, mirrored
from transforms.common.parquet_rows import (
    ReadParquetRowGroups,
    ReadParquetRows,
    RowRange,
    batch_rows,
    cut_row_groups,
    read_rows,
    row_ranges,
)

ROWS = [{"page_id": index, "text": f"text {index} " * (index % 7)} for index in range(1000)]


@pytest.fixture()
def parquet_file(tmp_path) -> str:
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=300)  # row groups of 300, 300, 300, 100
    return str(path)


def test_cut_row_groups_covers_every_row_once():
    ranges = list(cut_row_groups("f", [5, 0, 3], 2))
    assert ranges == [RowRange("f", 0, 0, 1), RowRange("f", 0, 1, 3), RowRange("f", 0, 3, 5),
                      RowRange("f", 2, 0, 1), RowRange("f", 2, 1, 3)]


def test_cut_row_groups_gives_equal_ranges():
    """Workers are dealt ranges in turn: a row group's ranges must not alternate long and short."""
    sizes = [unit.stop - unit.start for unit in cut_row_groups("f", [384] * 4, 256)]
    assert sizes == [192] * 8
    sizes = [unit.stop - unit.start for unit in cut_row_groups("f", [1000], 256)]
    assert sizes == [250] * 4


def test_batch_rows_takes_a_range_across_batches():
    table = pa.Table.from_pylist(ROWS[:50])
    for size in (1, 7, 50):
        for start, stop in ((0, 50), (3, 4), (6, 29), (49, 50)):
            assert list(batch_rows(iter(table.to_batches(max_chunksize=size)), start, stop)) == ROWS[start:stop]


@pytest.mark.parametrize("unit_rows", [1000, 300, 128, 7])
def test_ranges_of_a_file_read_every_row_once(parquet_file, unit_rows):
    ranges = list(row_ranges(parquet_file, unit_rows))
    assert {unit.row_group for unit in ranges} == {0, 1, 2, 3}
    rows = [row for unit in ranges for row in read_rows(unit, ["page_id", "text"], batch_size=64)]
    assert rows == ROWS
    last = ranges[-1]  # in row group 3: rows 900..999
    assert list(read_rows(last, ["page_id"])) == [{"page_id": 900 + row} for row in range(last.start, last.stop)]


def test_in_a_pipeline(parquet_file, tmp_path):
    other = tmp_path / "part-1.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:10]), other)
    with TestPipeline() as pipeline:
        rows = pipeline | ReadParquetRows([parquet_file, str(other)], ["page_id"], unit_rows=128)
        assert_that(rows, equal_to([{"page_id": row["page_id"]} for row in ROWS + ROWS[:10]]))


def test_row_groups_in_a_pipeline_one_table_each(parquet_file):
    with TestPipeline() as pipeline:
        found = (pipeline | ReadParquetRowGroups([parquet_file], ["page_id"])
                 | beam.Map(lambda table: table.column("page_id").to_pylist()))
        assert_that(found, equal_to([list(range(start, min(start + 300, 1000))) for start in range(0, 1000, 300)]))


def test_a_row_range_read_from_an_object_store_fetches_its_row_group_not_the_file(tmp_path):
    """A worker reads its ranges of articles/ by row group: from an object store a read fetches about the row
    group's column chunks, not the 16 MB Beam's reader fetches at each read outside its buffer."""
    rng = np.random.default_rng(0)
    rows = pa.table({"page_id": np.arange(4096), "text": [rng.bytes(1000).hex() for _ in range(4096)]})
    path = tmp_path / "articles.parquet"
    pq.write_table(rows, path, row_group_size=128, compression="none")  # 32 row groups of ~256 KB of text
    MirrorFileSystem.log.clear()
    [read] = list(read_rows(RowRange(mirrored(path), 20, 32, 96), ["page_id", "text"]))[:1]
    assert read == {"page_id": 20 * 128 + 32, "text": rows.column("text")[20 * 128 + 32].as_py()}
    group_bytes = pq.ParquetFile(path).metadata.row_group(20).total_byte_size
    assert sum(MirrorFileSystem.log.fetched) < group_bytes + 2 * fs.RANGE_READ_BYTES
    MirrorFileSystem.log.clear()
    with fs.open_read(mirrored(path)) as handle:  # Beam's reader as it is: what each read cost before
        pq.ParquetFile(handle).read_row_group(20, columns=["page_id", "text"])
    assert sum(MirrorFileSystem.log.fetched) > 10 * group_bytes
