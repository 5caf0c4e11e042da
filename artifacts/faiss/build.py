"""Building the index: train once on the sample, then add each shard's vectors to a copy of the trained index."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from artifacts import fs
from artifacts.faiss.files import EMBEDDINGS_DIR, shard_embedding_files, shard_ids_name, shard_index_name
from artifacts.faiss.storage import read_index, write_index, write_npy
from artifacts.faiss.vectors import iter_parquet_batches, table_vectors


def gpu_count() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu or without a device."""
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


def new_index(factory: str, dim: int):
    """An empty index that takes passage ids: IVF indexes store ids; others get an IDMap."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    try:
        faiss.extract_index_ivf(index)
        return index
    except RuntimeError:
        return faiss.index_factory(dim, "IDMap," + factory, faiss.METRIC_INNER_PRODUCT)


def train_index(factory: str, dim: int, sample: np.ndarray, use_gpu: bool = False):
    """The trained, empty index; k-means of IVF on every GPU when asked for and available."""
    import faiss

    index = new_index(factory, dim)
    if index.is_trained:
        return index
    if use_gpu and gpu_count():
        try:
            ivf = faiss.extract_index_ivf(index)
            ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(dim))
        except RuntimeError:
            pass  # not IVF: trains on the CPU
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def add_batches(index, batches: Iterable[tuple[np.ndarray, np.ndarray]], use_gpu: bool = False):
    """Add (ids, vectors) batches; on the GPUs when asked for, available and supported by the index type.
    Returns the index (a CPU index) and the ids in insertion order."""
    import faiss

    target = index
    if use_gpu and gpu_count():
        try:
            target = faiss.index_cpu_to_all_gpus(index)
        except RuntimeError:  # an index type faiss-gpu does not support: add on the CPU
            target = index
    added = []
    for ids, vectors in batches:
        target.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, np.int64))
        added.append(np.asarray(ids, dtype=np.int64))
    result = faiss.index_gpu_to_cpu(target) if target is not index else index
    return result, (np.concatenate(added) if added else np.zeros(0, dtype=np.int64))


def build_shard(index_dir: str, shard: str, trained_path: str, use_gpu: bool = False) -> dict[str, Any]:
    """Add one shard's embeddings to a copy of the trained index; write its index file and id map."""
    files = shard_embedding_files(index_dir, shard)
    batches = ((batch.column(0).to_numpy(), table_vectors(batch))
               for batch in iter_parquet_batches(files, ["passage_id", "embedding"]))
    index, ids = add_batches(read_index(trained_path, mmap=False), batches, use_gpu)
    write_index(index, fs.join(index_dir, shard_index_name(shard)))
    write_npy(fs.join(index_dir, shard_ids_name(shard)), ids)
    return {"name": shard, "index": shard_index_name(shard), "ids": shard_ids_name(shard), "count": len(ids),
            "embeddings": f"{EMBEDDINGS_DIR}/{shard}"}


def read_train_sample(sample_dir: str, size: int) -> np.ndarray:
    """The ``size`` sample rows with the smallest keys, in key order (the same sample whatever the files)."""
    files = fs.list_files(sample_dir, "*.parquet")
    if not files or size == 0:
        return np.zeros((0, 0), dtype=np.float32)
    keys = np.concatenate([batch.column(0).to_numpy() for batch in iter_parquet_batches(files, ["sample_key"])])
    if len(keys) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    threshold = np.partition(keys, min(size, len(keys)) - 1)[min(size, len(keys)) - 1]
    kept_keys, kept = [], []
    for batch in iter_parquet_batches(files, ["sample_key", "embedding"]):
        batch_keys = batch.column(0).to_numpy()
        chosen = batch_keys <= threshold
        kept_keys.append(batch_keys[chosen])
        kept.append(table_vectors(batch)[chosen])
    order = np.argsort(np.concatenate(kept_keys), kind="stable")
    return np.concatenate(kept)[order]

