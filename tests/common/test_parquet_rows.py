"""Reading Parquet rows by row range: every row once, in any cut of the row groups and batches."""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

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
