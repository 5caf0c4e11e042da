"""Dump refreshes of the index: which passage vectors of a previous run can be taken as they are.

A passage's vector is a function of its id, title and text and the encoder, so an unchanged passage (same id, same
digest of title and text) keeps its old vector. A passage's text never travels: each old shard's (id, digest)
table is written once, as files, and memory-mapped by every worker, which decides while it reads a passage whether
its old vector can be taken; the ids to take (packed arrays) are grouped by old shard, and each group reads its
one old shard for their rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from artifacts import fs, tables
from artifacts.faiss.files import shard_embedding_files, shard_name
from artifacts.faiss.info import load_index_info
from artifacts.faiss.storage import write_npy
from artifacts.faiss.vectors import VECTOR_BATCH, table_vectors
from artifacts.passages import Passage, shard_of
from transforms.common.dead_letters import count
from transforms.common.per_worker import PerProcess

REUSED_TAG = "reused"
PACKED_IDS = 1 << 20  # reused ids a worker holds per old shard before it sends them on (8 MB)


def passage_digest(title: str, text: str) -> bytes:
    """16 bytes that differ when a passage's title or text does (length-prefixed: no separator ambiguity)."""
    encoded_title = title.encode("utf-8")
    return hashlib.blake2b(len(encoded_title).to_bytes(8, "little") + encoded_title + text.encode("utf-8"),
                           digest_size=16, person=b"kpr-passage").digest()


@dataclass(frozen=True)
class DigestTable:
    """The passages of one old shard: ids sorted, each with the digest of its title and text (ids present more
    than once are left out: such a passage is never reused)."""

    ids: np.ndarray  # int64, sorted, unique
    digests: np.ndarray  # uint8 (n, 16)

    @classmethod
    def of(cls, ids: np.ndarray, digests: np.ndarray) -> DigestTable:
        order = np.argsort(ids, kind="stable")
        ids, digests = ids[order], digests[order]
        repeated = np.zeros(len(ids), bool)
        if len(ids) > 1:
            same = ids[1:] == ids[:-1]
            repeated[1:] |= same
            repeated[:-1] |= same
        return cls(ids[~repeated], digests[~repeated])

    def unchanged(self, passage_id: int, digest: bytes) -> bool:
        """Whether the old shard has this passage with the same title and text."""
        position = int(np.searchsorted(self.ids, passage_id))
        return (position < len(self.ids) and int(self.ids[position]) == passage_id
                and self.digests[position].tobytes() == digest)


def old_shard_table(old_index: str, shard: str) -> DigestTable:
    """The digest table of one shard of a previous run's index (its ids, titles and texts read batch by batch)."""
    ids, digests = [], []
    for batch in tables.iter_file_batches(shard_embedding_files(old_index, shard), ["passage_id", "title", "text"]):
        ids.append(batch.column(0).to_numpy())
        digests += [passage_digest(title, text) for title, text in zip(
            batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True)]
    packed = np.frombuffer(b"".join(digests), np.uint8).reshape(-1, 16)
    return DigestTable.of(np.concatenate(ids) if ids else np.zeros(0, np.int64), packed)


def table_paths(directory: str, shard: str) -> tuple[str, str]:
    return fs.join(directory, f"{shard}.ids.npy"), fs.join(directory, f"{shard}.digests.npy")


def write_old_shard_table(shard: str, old_index: str, directory: str) -> str:
    """Write one old shard's digest table under ``directory``; returns the shard name."""
    table = old_shard_table(old_index, shard)
    ids_path, digests_path = table_paths(directory, shard)
    write_npy(ids_path, table.ids)
    write_npy(digests_path, table.digests)
    return shard


def load_tables(directory: str) -> dict[str, DigestTable]:
    """Every digest table under ``directory``, memory-mapped where it lies (a remote one from a local copy that is
    removed once mapped)."""
    tables = {}
    for ids_path in fs.list_files(directory, "*.ids.npy"):
        shard = fs.relative(ids_path, directory).removesuffix(".ids.npy")
        arrays = []
        for path in table_paths(directory, shard):
            with fs.local_copy(path) as local:
                arrays.append(np.load(local, mmap_mode="r"))
        tables[shard] = DigestTable(*arrays)
    return tables


class SplitUnchangedFn(beam.DoFn):
    """Passages -> those to encode; tagged ``reused``: (old shard, packed ids) of the passages whose old shard has
    them with the same title and text (counted as ``passages_reused``)."""

    def __init__(self, directory: str, old_shards: int) -> None:
        self._directory, self._old_shards = directory, old_shards
        self._shared = PerProcess(load_tables)  # one mapping of the tables per worker process
        self._tables: dict[str, DigestTable] | None = None
        self._reused: dict[str, list[int]] = {}

    def start_bundle(self) -> None:
        self._reused = {}

    def process(self, passage: Passage, _written: list[str]) -> Iterator[Any]:
        if self._tables is None:  # the side input has said the tables are written
            self._tables = self._shared.get(self._directory)
        shard = shard_name(shard_of(passage.passage_id, self._old_shards))
        table = self._tables.get(shard)
        if table is None or not table.unchanged(passage.passage_id, passage_digest(passage.title, passage.text)):
            yield passage
            return
        count("passages_reused")
        ids = self._reused.setdefault(shard, [])
        ids.append(passage.passage_id)
        if len(ids) >= PACKED_IDS:
            yield beam.pvalue.TaggedOutput(REUSED_TAG, (shard, np.array(self._reused.pop(shard), np.int64)))

    def finish_bundle(self) -> Iterator[Any]:
        for shard, ids in sorted(self._reused.items()):
            yield beam.pvalue.TaggedOutput(REUSED_TAG, GlobalWindows.windowed_value((shard, np.array(ids, np.int64))))
        self._reused = {}


def reused_rows(shard: str, packed: Iterable[np.ndarray], old_index: str = "") -> Iterator[tuple]:
    """The rows (passage_id, title, text, vector) of the ids ``packed`` from old shard ``shard``."""
    wanted = np.unique(np.concatenate(list(packed)))
    columns = ["passage_id", "title", "text", "embedding"]
    for batch in tables.iter_file_batches(shard_embedding_files(old_index, shard), columns, VECTOR_BATCH):
        chosen = np.flatnonzero(np.isin(batch.column(0).to_numpy(), wanted))
        if len(chosen) == 0:
            continue
        picked = batch.take(chosen)
        vectors = table_vectors(picked)
        yield from zip(picked.column(0).to_pylist(), picked.column(1).to_pylist(), picked.column(2).to_pylist(),
                       vectors, strict=True)


class SplitPassagesForRefresh(beam.PTransform):
    """Passages -> ``encode`` (new or changed passages) and ``reused`` (the previous run's rows (passage_id, title,
    text, vector) of the unchanged ones), from the previous run's index at ``old_index``; removed passages are
    dropped. ``directory``: where the old shards' digest tables are written."""

    def __init__(self, old_index: str, directory: str) -> None:
        super().__init__()
        self._old_index, self._directory = old_index, directory

    def expand(self, passages: beam.PCollection) -> dict[str, beam.PCollection]:
        old = load_index_info(self._old_index)
        written = (passages.pipeline
                   | "OldShards" >> beam.Create([shard["name"] for shard in old.shard_files])
                   | "SpreadOldShards" >> beam.Reshuffle()
                   | "WriteDigestTables" >> beam.Map(write_old_shard_table, self._old_index, self._directory))
        split = passages | "SplitUnchanged" >> beam.ParDo(
            SplitUnchangedFn(self._directory, old.shards), beam.pvalue.AsList(written)).with_outputs(
            REUSED_TAG, main="encode")
        reused = (split[REUSED_TAG]
                  | "ByOldShard" >> beam.GroupByKey()
                  | "ReadReusedRows" >> beam.FlatMapTuple(reused_rows, self._old_index))
        return {"encode": split.encode, "reused": reused}
