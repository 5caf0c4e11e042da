"""The report's figures of ``entities/`` and ``entity_embeddings/``, streamed with bounded memory.

Only the files the manifest records are read (``manifest.recorded_batches``), batch by batch, into numpy
aggregates: exact value counts of small integer columns and bounded top-k selections. Nothing holds a whole
table as Python objects, so full Wikipedia (7M entities, millions of names) is fine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from artifacts import faiss as faiss_shards
from artifacts import layout, tables
from artifacts.run import manifest
from artifacts.run.report.stats import TopK, ValueCounts

BATCH = 65_536  # rows per streamed batch


@dataclass(frozen=True)
class TopEntity:
    entity_id: int
    title: str
    link_count: int


@dataclass
class EntityStats:
    count: int
    with_qid: int
    link_count_values: np.ndarray  # distinct inbound link counts, ascending
    link_count_entities: np.ndarray  # entities with each of them
    top: list[TopEntity]

    @property
    def total_links(self) -> int:
        return int((self.link_count_values * self.link_count_entities).sum())

    @property
    def without_links(self) -> int:
        return int(self.link_count_entities[self.link_count_values <= 0].sum())

    def quantile(self, q: float) -> int:
        """The inbound link count below which a fraction ``q`` of the entities lie."""
        if not len(self.link_count_values):
            return 0
        cumulative = np.cumsum(self.link_count_entities)
        return int(self.link_count_values[np.searchsorted(cumulative, q * cumulative[-1])])


def entity_stats(output: str, top: int = 15, batch_size: int = BATCH) -> EntityStats:
    """Inbound link counts of ``entities/``: the exact distribution and the most linked entities."""
    distribution = ValueCounts()
    best: TopK[tuple[int, int]] = TopK(top)
    count = with_qid = 0
    columns = ["entity_id", "title", "qid", "link_count"]
    for batch in manifest.recorded_batches(output, layout.ENTITIES, columns, batch_size):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        links = batch.column("link_count").to_numpy(zero_copy_only=False).astype(np.int64)
        count += batch.num_rows
        with_qid += batch.num_rows - batch.column("qid").null_count
        distribution.add(links)
        for row in np.lexsort((ids, -links))[:top]:
            key = (-int(links[row]), int(ids[row]))
            if best.worst() is None or key < best.worst():
                best.offer(key, TopEntity(int(ids[row]), batch.column("title")[int(row)].as_py(), int(links[row])))
    values, entities = distribution.result()
    return EntityStats(count, with_qid, values, entities, best.items())


def entity_titles(output: str, entity_ids: set[int]) -> dict[int, str]:
    """Titles of a few entities, by id (one streaming pass over ``entities/``)."""
    wanted = np.fromiter(sorted(entity_ids), dtype=np.int64)
    titles: dict[int, str] = {}
    if not len(wanted):
        return titles
    for batch in manifest.recorded_batches(output, layout.ENTITIES, ["entity_id", "title"]):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.nonzero(np.isin(ids, wanted))[0]
        if len(rows):
            picked = batch.column("title").take(pa.array(rows)).to_pylist()
            titles.update(zip(ids[rows].tolist(), picked, strict=True))
    return titles


@dataclass
class EmbeddingStats:
    count: int
    dim: int
    value_type: str  # of the stored values (float32, float16)
    metadata: dict[str, str]  # of the first file: model, layer, target_norm, dtype, ...
    norms: np.ndarray  # float64, one per entity (8 bytes each: 56 MB for 7M entities)
    mentions_per_entity: np.ndarray  # [m] = entities embedded from m mentions

    @property
    def target_norm(self) -> float | None:
        try:
            return float(self.metadata["target_norm"])
        except (KeyError, ValueError):
            return None


def embedding_stats(output: str) -> EmbeddingStats:
    """Norms of the stored entity vectors and the mentions each was averaged over."""
    files = manifest.recorded_files(output, layout.ENTITY_EMBEDDINGS)
    metadata = tables.file_metadata(files[0])
    norms: list[np.ndarray] = []
    mentions = np.zeros(1, dtype=np.int64)
    vector_type = tables.file_schema(files[0]).field("embedding").type  # the table's, rows or none
    for batch in tables.iter_file_batches(files, ["embedding", "mention_count"], 16384):
        # in float64: the float32 vectors' norms differ from their target below float32's resolution
        norms.append(np.linalg.norm(faiss_shards.table_vectors(batch).astype(np.float64), axis=1))
        counts = np.bincount(batch.column("mention_count").to_numpy(zero_copy_only=False).astype(np.int64))
        if len(counts) > len(mentions):
            mentions = np.pad(mentions, (0, len(counts) - len(mentions)))
        mentions[:len(counts)] += counts
    all_norms = np.concatenate(norms) if norms else np.zeros(0, np.float64)
    if not np.isfinite(all_norms).all():  # a stage commits no such vector: the files changed since
        raise ValueError(f"{layout.ENTITY_EMBEDDINGS}/ holds vectors that are not finite: run validate")
    return EmbeddingStats(len(all_norms), vector_type.list_size, str(vector_type.value_type), metadata, all_norms,
                          mentions)


