"""How far the vectors of entities present in two runs moved: a histogram of their cosine similarities.

Entities are matched by key (QID, else title: ``rows.entity_keys``), not by entity id, since ids may differ
between runs. The old run's vectors are held one hash bucket of keys at a time, at most ``VECTOR_BUDGET`` bytes;
each bucket is one pass over both tables (7M x 768 float32 vectors = 21.5 GB: 11 passes with the default budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from artifacts import faiss as faiss_shards
from artifacts import layout
from artifacts.run import manifest
from artifacts.run.diff.rows import BATCH, NO_KEY, Entities, keys_of_ids
from artifacts.run.validation import parquet_footer

ARTIFACT = layout.ENTITY_EMBEDDINGS
VECTOR_BUDGET = 2 << 30  # bytes of old vectors held at once
# lower edges, highest first: a cosine falls in the first bin whose edge it reaches; the last bin takes the rest
COSINE_EDGES = (0.9999, 0.999, 0.99, 0.9)
COSINE_BINS = ("[0.9999, 1]", "[0.999, 0.9999)", "[0.99, 0.999)", "[0.9, 0.99)", "< 0.9")


@dataclass(frozen=True)
class CosineHistogram:
    """Entities with a vector in both runs (``matched``) and how many fall in each of ``COSINE_BINS``; vectors of
    different dimensions (another model) are not compared: nothing matched, every count 0."""

    matched: int
    counts: tuple[int, ...]
    old_dim: int
    new_dim: int

    @property
    def comparable(self) -> bool:
        return self.old_dim == self.new_dim

    def not_compared(self) -> str:
        return (f"not compared: the old run's vectors have {self.old_dim} dimensions, the new run's {self.new_dim} "
                "(another model)")

    def as_dict(self) -> dict[str, int]:
        return dict(zip(COSINE_BINS, self.counts, strict=True))


def cosine_bins(cosines: np.ndarray) -> np.ndarray:
    """Counts per bin of ``COSINE_BINS``."""
    # float32 rounding can put an unchanged vector a hair below 1 or above it: both are "[0.9999, 1]"
    below = np.searchsorted(-np.asarray(COSINE_EDGES), -cosines, side="left")
    return np.bincount(below, minlength=len(COSINE_BINS))


def cosines(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two float32 matrices (a zero vector has cosine 0 with anything)."""
    norms = np.linalg.norm(old, axis=1) * np.linalg.norm(new, axis=1)
    dots = np.einsum("ij,ij->i", old.astype(np.float64), new.astype(np.float64))
    return np.divide(dots, norms, out=np.zeros(len(old)), where=norms > 0)


def _keyed_vectors(output: str, known: Entities, passes: int, bucket: int):
    """(key hashes, vectors) of the rows of ``output``'s embeddings whose key falls in ``bucket``, batch by batch."""
    for batch in manifest.recorded_batches(output, ARTIFACT, ["entity_id", "embedding"], BATCH):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        keys = keys_of_ids(ids, known.key_of_id)
        chosen = (keys != NO_KEY) & (keys.view(np.uint64) % np.uint64(passes) == bucket)
        if chosen.any():
            yield keys[chosen], faiss_shards.table_vectors(batch)[chosen]


def _one_pass(old_output: str, old: Entities, new_output: str, new: Entities, passes: int,
              bucket: int) -> tuple[int, np.ndarray]:
    parts = list(_keyed_vectors(old_output, old, passes, bucket))
    if not parts:
        return 0, np.zeros(len(COSINE_BINS), np.int64)
    old_keys = np.concatenate([keys for keys, _ in parts])
    order = np.argsort(old_keys, kind="stable")
    old_keys, old_vectors = old_keys[order], np.concatenate([vectors for _, vectors in parts])[order]
    matched, counts = 0, np.zeros(len(COSINE_BINS), np.int64)
    for keys, vectors in _keyed_vectors(new_output, new, passes, bucket):
        at = np.minimum(np.searchsorted(old_keys, keys), len(old_keys) - 1)
        found = old_keys[at] == keys
        matched += int(found.sum())
        counts += cosine_bins(cosines(old_vectors[at[found]], vectors[found]))
    return matched, counts


def vector_movement(old_output: str, old: Entities, new_output: str, new: Entities,
                    budget: int = VECTOR_BUDGET) -> CosineHistogram:
    """The cosine histogram between the old and new vector of every entity embedded in both runs."""
    footers = [parquet_footer(path) for path in manifest.recorded_files(old_output, ARTIFACT)]
    dim = footers[0][1].field("embedding").type.list_size
    new_dim = parquet_footer(manifest.recorded_files(new_output, ARTIFACT)[0])[1].field("embedding").type.list_size
    passes = max(1, math.ceil(sum(rows for rows, _ in footers) * dim * 4 / budget)) if dim == new_dim else 0
    matched, counts = 0, np.zeros(len(COSINE_BINS), np.int64)
    for bucket in range(passes):
        bucket_matched, bucket_counts = _one_pass(old_output, old, new_output, new, passes, bucket)
        matched, counts = matched + bucket_matched, counts + bucket_counts
    return CosineHistogram(matched, tuple(int(count) for count in counts), dim, new_dim)
