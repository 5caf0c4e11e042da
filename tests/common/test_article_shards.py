"""transforms/common/article_shards.py: the page map of articles/ (page -> file and row group) and reading one shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import schemas
from tests.builders import article
from transforms.common.article_shards import load_page_map, page_map, read_row_group, row_group_count, save_page_map


def write_articles(path: Path, page_ids: list[int], row_group_size: int) -> str:
    rows = [article(page_id, f"P{page_id}", f"text {page_id}", []) for page_id in page_ids]
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.ARTICLES), path, row_group_size=row_group_size)
    return str(path)


def test_the_page_map_finds_each_pages_row_group_across_files(tmp_path: Path):
    first = write_articles(tmp_path / "a.parquet", [50, 10, 30, 20, 40], row_group_size=2)  # 3 row groups
    second = write_articles(tmp_path / "b.parquet", [5, 60], row_group_size=10)  # 1 row group
    pages = load_page_map(save_page_map(page_map([first, second]), str(tmp_path / "map")))
    assert (row_group_count(first), row_group_count(second)) == (3, 1)
    shards = pages.shards_of(np.array([50, 10, 30, 20, 40, 5, 60, 7]))
    assert shards.tolist() == [0, 0, 1, 1, 2, 3, 3, -1]
    assert [pages.location(shard) for shard in range(4)] == [(first, 0), (first, 1), (first, 2), (second, 0)]
    table = read_row_group(*pages.location(1), ["page_id", "text"])
    assert table.to_pylist() == [{"page_id": 30, "text": "text 30"}, {"page_id": 20, "text": "text 20"}]
    assert page_map([]).shards_of(np.array([1])).tolist() == [-1]
