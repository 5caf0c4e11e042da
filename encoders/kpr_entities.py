"""KPR entity inputs: the linker's mentions turned into entity ids and token positions, and the entity vectors of
``entity_embeddings/`` as a table by entity_id."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from artifacts import fs, layout
from encoders.errors import MissingRunArtifactError


@dataclass(frozen=True)
class EntityInputs:
    """The entities of one text: ids and, per entity, its token positions (all > 0)."""

    entity_ids: tuple[int, ...]
    positions: tuple[tuple[int, ...], ...]


def mention_token_positions(start: int, end: int, offsets: Sequence[tuple[int, int]],
                            sequence_ids: Sequence[int | None], segment: int) -> tuple[int, ...]:
    """Token indices of ``segment`` whose character span overlaps [start, end) (special tokens never)."""
    pairs = enumerate(zip(offsets, sequence_ids, strict=True))
    return tuple(index for index, ((token_start, token_end), sequence) in pairs
                 if sequence == segment and token_end > token_start and token_start < end and token_end > start)


def entity_inputs(mentions_by_segment: Sequence[Sequence], offsets: Sequence[tuple[int, int]],
                  sequence_ids: Sequence[int | None], has_embedding: Callable[[int], bool],
                  max_entities: int) -> tuple[EntityInputs, int]:
    """Entity inputs of one tokenized text from the linker's mentions of each segment, in text order, every
    candidate of a mention with the mention's positions. Candidates without an embedding and mentions cut off by
    truncation are skipped; entities beyond ``max_entities`` are dropped. Returns (inputs, entities dropped)."""
    ids: list[int] = []
    positions: list[tuple[int, ...]] = []
    dropped = 0
    for segment, mentions in enumerate(mentions_by_segment):
        for mention in mentions:
            tokens = mention_token_positions(mention.start, mention.end, offsets, sequence_ids, segment)
            if not tokens:
                continue
            for candidate in mention.candidates:
                if not has_embedding(candidate.entity_id):
                    continue
                if len(ids) >= max_entities:
                    dropped += 1
                    continue
                ids.append(candidate.entity_id)
                positions.append(tokens)
    return EntityInputs(tuple(ids), tuple(positions)), dropped


class KnownEntities:
    """The entity ids that have an embedding in ``entity_embeddings/`` (one bit each: what linking needs, without
    the vectors)."""

    def __init__(self, directory: str) -> None:
        import pyarrow.parquet as pq
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        ids = []
        for path in embedding_files(directory):
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                ids.append(pq.read_table(handle, columns=["entity_id"]).column(0).to_numpy().astype(np.int64))
        known = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        self.present = np.zeros(int(known.max(initial=0)) + 1, dtype=bool)
        self.present[known] = True

    def has(self, entity_id: int) -> bool:
        return 0 < entity_id < len(self.present) and bool(self.present[entity_id])


class EntityTable:
    """Entity vectors by entity_id (row 0 = padding, zeros), memory-mapped from a local file so 7M x 768
    vectors cost page cache, not process memory; built once per worker from ``entity_embeddings/*.parquet``."""

    def __init__(self, output_dir: str) -> None:
        self.directory = output_dir
        files = embedding_files(output_dir)
        import pyarrow.parquet as pq
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        largest, dim, value_type = 0, None, np.float32
        for path in files:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                parquet = pq.ParquetFile(handle)
                embedding = parquet.schema_arrow.field("embedding").type
                dim = embedding.list_size
                value_type = np.float16 if str(embedding.value_type) in ("halffloat", "float16") else np.float32
                for batch in parquet.iter_batches(columns=["entity_id"]):
                    ids = batch.column(0).to_numpy()
                    largest = max(largest, int(ids.max()) if len(ids) else 0)
        self.dim = int(dim or 0)
        self._local = tempfile.mkdtemp(prefix="kpr-entities-")
        self.vectors = np.lib.format.open_memmap(os.path.join(self._local, "vectors.npy"), mode="w+",
                                                 dtype=value_type, shape=(largest + 1, self.dim))
        self.present = np.zeros(largest + 1, dtype=bool)
        for path in files:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                for batch in pq.ParquetFile(handle).iter_batches(columns=["entity_id", "embedding"]):
                    ids = batch.column(0).to_numpy().astype(np.int64)
                    values = batch.column(1).flatten().to_numpy(zero_copy_only=False).reshape(len(ids), self.dim)
                    self.vectors[ids] = values
                    self.present[ids] = True
        self.vectors.flush()

    def has(self, entity_id: int) -> bool:
        return 0 < entity_id < len(self.present) and bool(self.present[entity_id])

    def lookup(self, entity_ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors[entity_ids], dtype=np.float32)


def embedding_files(directory: str) -> list[str]:
    """The Parquet files of an ``entity_embeddings/`` directory; a ``MissingRunArtifactError`` when there are none."""
    files = fs.list_files(directory, "*.parquet") if fs.exists(directory) else []
    if not files:
        raise MissingRunArtifactError(f"no entity embeddings in {directory}", layout.EMBED_ENTITIES_STAGE)
    return files
