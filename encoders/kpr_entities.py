"""The entities a KPR encoder knows: the ids with an embedding in ``entity_embeddings/``, and their vectors as a
table by entity_id (the inputs that name them: ``encoders/kpr_inputs.py``)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence

import numpy as np

from artifacts import fs, layout, tables
from encoders.errors import MissingRunArtifactError


class KnownEntities:
    """The entity ids that have an embedding in ``entity_embeddings/`` (one bit each: what linking needs, without
    the vectors)."""

    def __init__(self, directory: str) -> None:
        ids = [batch.column(0).to_numpy().astype(np.int64)
               for batch in tables.iter_file_batches(embedding_files(directory), ["entity_id"])]
        known = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        self.present = np.zeros(int(known.max(initial=0)) + 1, dtype=bool)
        self.present[known] = True

    def has(self, entity_id: int) -> bool:
        return 0 < entity_id < len(self.present) and bool(self.present[entity_id])


class EntityTable:
    """Entity vectors by entity_id (row 0 = padding, zeros), built once per worker from
    ``entity_embeddings/*.parquet`` into a scratch mapping (``scratch_array``): 7M x 768 vectors cost page cache
    that the kernel can write out and drop, not process memory, and no file is left behind. With a ``norm``, every
    vector is L2-normalized and scaled to it (only the direction of an entity vector carries meaning)."""

    def __init__(self, output_dir: str, norm: float | None = None) -> None:
        self.directory = output_dir
        files = embedding_files(output_dir)
        largest, self.dim, value_type = embedding_layout(files)
        self.vectors = scratch_array(value_type, (largest + 1, self.dim))
        self.present = np.zeros(largest + 1, dtype=bool)
        for batch in tables.iter_file_batches(files, ["entity_id", "embedding"]):
            ids = batch.column(0).to_numpy().astype(np.int64)
            vectors = batch.column(1).flatten().to_numpy(zero_copy_only=False).reshape(len(ids), self.dim)
            self.vectors[ids] = vectors if norm is None else scaled_to(vectors, norm)
            self.present[ids] = True

    def has(self, entity_id: int) -> bool:
        return 0 < entity_id < len(self.present) and bool(self.present[entity_id])

    def lookup(self, entity_ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors[entity_ids], dtype=np.float32)


def scaled_to(vectors: np.ndarray, norm: float) -> np.ndarray:
    """Each row L2-normalized (in float32) and scaled to ``norm``; a zero row stays zero."""
    rows = vectors.astype(np.float32)
    lengths = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows * np.float32(norm), lengths, out=np.zeros_like(rows), where=lengths > 0)


def embedding_layout(files: Sequence[str]) -> tuple[int, int, type[np.generic]]:
    """(largest entity_id, vector size, value type) of ``entity_embeddings`` files (ids read batch by batch)."""
    embedding = tables.file_schema(files[0]).field("embedding").type
    largest = max((int(batch.column(0).to_numpy().max(initial=0))
                   for batch in tables.iter_file_batches(files, ["entity_id"])), default=0)
    value_type = np.float16 if str(embedding.value_type) in ("halffloat", "float16") else np.float32
    return largest, int(embedding.list_size), value_type


def scratch_array(dtype: type[np.generic], shape: tuple[int, int]) -> np.ndarray:
    """A zeroed, writable array mapped from a temporary file that never has a name (Linux's O_TMPFILE; elsewhere
    it is removed as soon as it is made): its pages can go to disk under memory pressure, and the file goes with
    the mapping, even when the process is killed, so nothing is left in the temp directory."""
    with tempfile.TemporaryFile(prefix="kpr-entities-") as handle:
        return np.memmap(handle, dtype=dtype, mode="w+", shape=shape)  # the mapping outlives the handle


def embedding_files(directory: str) -> list[str]:
    """The Parquet files of an ``entity_embeddings/`` directory; a ``MissingRunArtifactError`` when there are none."""
    files = fs.list_files(directory, "*.parquet")
    if not files:
        raise MissingRunArtifactError(f"no entity embeddings in {directory}", layout.EMBED_ENTITIES_STAGE)
    return files
