"""Searching a sharded index: every shard in turn (one in memory at a time), an exact top-k merge, and the
passages' title and text by id."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from artifacts import fs, tables
from artifacts.errors import InputError
from artifacts.faiss.choice import DEFAULT_EF_SEARCH, DEFAULT_NPROBE
from artifacts.faiss.files import shard_embedding_files, shard_name
from artifacts.faiss.info import IndexInfo, load_index_info
from artifacts.faiss.storage import DamagedIndexError, read_index
from artifacts.passages import shard_of


class DamagedShardError(InputError):
    """A shard of the index that exists but cannot be read."""

    def __init__(self, shard: str, path: str, reason: str) -> None:
        super().__init__(f"index shard {shard} ({path}) is damaged: {reason}")
        self.shard, self.path, self.reason = shard, path, reason


class QueryDimensionError(InputError):
    """Query vectors whose size is not the index's."""


def merge_top_k(scores: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k of several shards' top-k lists (rows = queries): highest score first, ties by smaller
    id; id -1 (a shard with fewer than k vectors) never wins. Missing places are (-inf, -1)."""
    all_scores = np.concatenate([np.asarray(part, dtype=np.float32) for part in scores], axis=1)
    all_ids = np.concatenate([np.asarray(part, dtype=np.int64) for part in ids], axis=1)
    all_scores = np.where(all_ids < 0, -np.inf, all_scores)
    order = np.lexsort((all_ids, -all_scores), axis=1)[:, :k]
    top_scores = np.take_along_axis(all_scores, order, axis=1)
    top_ids = np.where(np.isfinite(top_scores), np.take_along_axis(all_ids, order, axis=1), -1)
    if top_ids.shape[1] < k:
        padding = k - top_ids.shape[1]
        top_scores = np.pad(top_scores, ((0, 0), (0, padding)), constant_values=-np.inf)
        top_ids = np.pad(top_ids, ((0, 0), (0, padding)), constant_values=-1)
    return top_scores, top_ids


def top_k_with_ties(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """An index's top ``k`` of each query and every vector tied with its k-th score (FAISS keeps, of vectors tied
    at the cut, those it stored first; the merge wants the smallest ids, so that no result depends on the shards
    or on k): one place more than asked, then twice as deep while a query's last place still ties."""
    if index.ntotal <= k:
        return index.search(queries, k)
    depth = k + 1
    while True:
        scores, ids = index.search(queries, depth)
        still_tied = (ids[:, -1] >= 0) & (scores[:, -1] >= scores[:, k - 1])
        if depth >= index.ntotal or not still_tied.any():
            return scores, ids
        depth = min(depth * 2, index.ntotal)


def set_search_parameters(index, nprobe: int | None, ef_search: int | None) -> None:
    """``nprobe`` for an IVF index, ``ef_search`` for an HNSW graph: the index's own, or an IVF index's coarse
    quantizer's (``IVF…_HNSW…``), set through FAISS's ``ParameterSpace``; a parameter the index lacks is left."""
    import faiss

    space = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        if value:
            with contextlib.suppress(RuntimeError):  # no such parameter in this index: nothing to set
                space.set_index_parameter(index, name, value)


def searches_a_graph(factory: str) -> bool:
    """Whether an index of ``factory`` finds its vectors through an HNSW graph (``HNSW32,Flat``, ``IDMap,HNSW8``),
    not its IVF lists (``IVF64_HNSW4,Flat``: the graph there holds the lists' centroids)."""
    return "HNSW" in factory and "IVF" not in factory


class ShardedIndex:
    """Search every shard of ``OUT/index`` one after the other (one shard in memory at a time) and merge."""

    def __init__(self, index_dir: str, nprobe: int | None = None, ef_search: int | None = None) -> None:
        self.directory = index_dir
        self.info = load_index_info(index_dir)
        self.nprobe = nprobe or DEFAULT_NPROBE
        self.ef_search = ef_search or DEFAULT_EF_SEARCH

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the best ``k`` passages of each query, as many columns as the index has passages at
        most (a larger ``k`` asks for nothing more, and would size the arrays); missing places are (-inf, -1)."""
        k = min(k, max(self.info.count, 1))
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.info.dim:
            raise QueryDimensionError(f"query vectors have {queries.shape[-1]} dimensions but the index at "
                                      f"{self.directory} has {self.info.dim}: search with the encoder that built it")
        best = (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64))
        # an HNSW index returns at most efSearch vectors: its graph is searched at least as widely as places are
        # asked for (an IVF index's HNSW quantizer gives lists, as many as nprobe)
        ef_search = max(self.ef_search, k + 1) if searches_a_graph(self.info.factory) else self.ef_search
        for shard in self.info.shard_files:
            index = self._read_shard(shard)
            set_search_parameters(index, self.nprobe, ef_search)
            scores, ids = top_k_with_ties(index, queries, k)
            best = merge_top_k([best[0], scores], [best[1], ids], k)
        return best

    def _read_shard(self, shard: dict[str, Any]):
        try:
            return read_index(fs.join(self.directory, shard["index"]))
        except DamagedIndexError as error:
            raise DamagedShardError(shard["name"], error.path, error.reason) from error


class PassageLookup:
    """Title and text of passages by id, from the shards' embedding files (only the row groups needed)."""

    def __init__(self, index_dir: str, info: IndexInfo, files: frozenset[str] | None = None) -> None:
        self.directory = index_dir
        self.info = info
        self.files = files  # when given, only these embedding files are read (those the manifest records)
        self._ids: dict[str, list[tuple[str, np.ndarray]]] = {}  # shard -> [(file, passage ids)]

    def _shard_ids(self, shard: str) -> list[tuple[str, np.ndarray]]:
        if shard not in self._ids:
            self._ids[shard] = [(path, np.concatenate(
                [batch.column(0).to_numpy() for batch in tables.iter_file_batches([path], ["passage_id"])]
                or [np.zeros(0, np.int64)])) for path in shard_embedding_files(self.directory, shard)
                if self.files is None or path in self.files]
        return self._ids[shard]

    def get(self, passage_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
        wanted: dict[str, set[int]] = {}
        for passage_id in {int(value) for value in passage_ids if value >= 0}:
            wanted.setdefault(shard_name(shard_of(passage_id, self.info.shards)), set()).add(passage_id)
        found: dict[int, tuple[str, str]] = {}
        for shard, ids in sorted(wanted.items()):
            targets = np.array(sorted(ids), dtype=np.int64)
            for path, file_ids in self._shard_ids(shard):
                rows = np.nonzero(np.isin(file_ids, targets))[0]
                if len(rows):
                    found.update(_read_rows(path, rows))
        return found


def _read_rows(path: str, rows: np.ndarray) -> dict[int, tuple[str, str]]:
    with tables.open_parquet(path) as parquet:
        starts = np.cumsum([0] + [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        groups = sorted({int(np.searchsorted(starts, row, side="right") - 1) for row in rows})
        result = {}
        for group in groups:
            table = parquet.read_row_group(group, columns=["passage_id", "title", "text"])
            local = rows[(rows >= starts[group]) & (rows < starts[group + 1])] - starts[group]
            picked = table.take(pa.array(local)).to_pylist()
            result.update({row["passage_id"]: (row["title"], row["text"]) for row in picked})
        return result
