"""Where each article lies: ``articles/`` as shards of (file, row group), and the page map that tells the shard of
a page_id, built once in a worker from the page_id columns alone (8 + 4 bytes a page: ~80 MB for English
Wikipedia) and memory-mapped by every worker process. Joins with article text go by shard: the refs of a shard
travel to one worker, which reads that one row group."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import fs, tables
from transforms.common.worker_files import load_array, save_array

PAGE_IDS_FILE, SHARDS_FILE, FILES_FILE = "page_ids.npy", "page_shards.npy", "files.json"


@contextlib.contextmanager
def parquet_file(path: str) -> Iterator[pq.ParquetFile]:
    """A Parquet file opened for reading (its footer read) by row groups and columns, on any Beam filesystem."""
    with fs.open_ranges(path) as handle, tables.reading_parquet(path):
        yield pq.ParquetFile(handle)


def row_group_count(path: str) -> int:
    """Row groups of one Parquet file, from its footer."""
    with parquet_file(path) as opened:
        return opened.metadata.num_row_groups


def read_row_group(path: str, row_group: int, columns: list[str]) -> pa.Table:
    """``columns`` of one row group of one Parquet file."""
    with parquet_file(path) as opened:
        return opened.read_row_group(row_group, columns=columns)


@dataclass(frozen=True)
class PageMap:
    """Shard of every page: ``shards[i]`` (a number over all row groups of ``files`` in order) of ``page_ids[i]``
    (sorted); ``first_shard[f]``: the number of file ``f``'s first row group."""

    files: list[str]
    first_shard: np.ndarray
    page_ids: np.ndarray
    shards: np.ndarray

    def shards_of(self, page_ids: np.ndarray) -> np.ndarray:
        """The shard of each page id, -1 for a page not in articles/."""
        if not len(self.page_ids):
            return np.full(len(page_ids), -1, dtype=np.int32)
        where = np.minimum(np.searchsorted(self.page_ids, page_ids), len(self.page_ids) - 1)
        return np.where(self.page_ids[where] == page_ids, self.shards[where], -1)

    def location(self, shard: int) -> tuple[str, int]:
        """(file, row group) of a shard."""
        file = int(np.searchsorted(self.first_shard, shard, side="right")) - 1
        return self.files[file], shard - int(self.first_shard[file])


def page_map(files: Sequence[str]) -> PageMap:
    """The page map of the Parquet files ``files`` of articles/ (reading their page_id columns only)."""
    page_ids, shards, first = [], [], [0]
    for path in files:
        with parquet_file(path) as opened:
            for row_group in range(opened.metadata.num_row_groups):
                ids = opened.read_row_group(row_group, columns=["page_id"]).column("page_id").to_numpy()
                page_ids.append(ids)
                shards.append(np.full(len(ids), first[-1] + row_group, dtype=np.int32))
            first.append(first[-1] + opened.metadata.num_row_groups)
    ids = np.concatenate(page_ids) if page_ids else np.zeros(0, dtype=np.int64)
    of = np.concatenate(shards) if shards else np.zeros(0, dtype=np.int32)
    order = np.argsort(ids, kind="stable")
    return PageMap(list(files), np.array(first[:-1], dtype=np.int64), ids[order], of[order])


def save_page_map(pages: PageMap, directory: str) -> str:
    """Write ``pages`` under ``directory``; returns ``directory``."""
    save_array(fs.join(directory, PAGE_IDS_FILE), pages.page_ids)
    save_array(fs.join(directory, SHARDS_FILE), pages.shards)
    fs.write_json_atomic(fs.join(directory, FILES_FILE), {"files": pages.files,
                                                          "first_shard": pages.first_shard.tolist()})
    return directory


def load_page_map(directory: str) -> PageMap:
    """The page map written by ``save_page_map``, its arrays memory-mapped."""
    listing = fs.read_json(fs.join(directory, FILES_FILE))
    return PageMap(listing["files"], np.array(listing["first_shard"], dtype=np.int64),
                   load_array(fs.join(directory, PAGE_IDS_FILE)), load_array(fs.join(directory, SHARDS_FILE)))
