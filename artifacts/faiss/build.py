"""Building the index: train once on the sample, then add each shard's vectors to a copy of the trained index."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from artifacts import fs, tables
from artifacts.errors import InputError, first_line
from artifacts.faiss.choice import FactoryError, faiss_reason
from artifacts.faiss.files import EMBEDDINGS_DIR, shard_embedding_files, shard_ids_name, shard_index_name
from artifacts.faiss.storage import read_index, write_index, write_npy
from artifacts.faiss.vectors import VECTOR_BATCH, table_vectors

# FAISS's k-means warning (written by its C++ code to stderr); the index stage says it in its own words
# (``choice.thin_training``)
_KMEANS_WARNING = re.compile(rb"^WARNING clustering \d+ points to \d+ centroids: please provide at least \d+ "
                             rb"training points\n?$")


@contextlib.contextmanager
def kmeans_warnings_dropped() -> Iterator[None]:
    """Inside the block, what is written to this process's stderr (its file descriptor, as C++ code writes) is held
    back; afterwards every line of it but FAISS's k-means warnings is written there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not _KMEANS_WARNING.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def gpu_count() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu or without a device."""
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


def new_index(factory: str, dim: int):
    """An empty index that takes passage ids: IVF indexes and IDMaps store ids; others get an IDMap."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if isinstance(index, faiss.IndexIDMap):
        return index
    if not isinstance(index, faiss.IndexRefine):  # a refined IVF takes no ids of its own (add_with_ids fails)
        try:
            faiss.extract_index_ivf(index)
            return index
        except RuntimeError:
            pass
    return faiss.index_factory(dim, "IDMap," + factory, faiss.METRIC_INNER_PRODUCT)


def untrained_reason(index, factory: str, dim: int) -> str | None:
    """Why ``index`` (a trained.faiss read back) is not the empty, trained index of ``factory`` x ``dim`` every
    shard starts from, as a clause ("is not trained"); None when it is."""
    expected = type(new_index(factory, dim)).__name__  # every FAISS index class is named Index...
    if type(index).__name__ != expected or index.d != dim:
        return f"is an {type(index).__name__} of {index.d} dims where {factory} x {dim} makes an {expected} of {dim}"
    if not index.is_trained:
        return "is not trained"
    return f"holds {index.ntotal} vectors where a trained index holds none" if index.ntotal else None


def trained_file_reason(path: str, factory: str, dim: int) -> str | None:
    """``untrained_reason`` of the trained.faiss at ``path``, or why faiss cannot read it."""
    try:
        index = read_index(path)
    except (RuntimeError, InputError) as error:
        return f"does not load with faiss ({first_line(error)})"
    return untrained_reason(index, factory, dim)


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
    with kmeans_warnings_dropped(), refused_by_faiss(factory, "train"):
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


@contextlib.contextmanager
def refused_by_faiss(factory: str, step: str) -> Iterator[None]:
    """FAISS's refusal to ``step`` an index of ``factory`` (what the up-front checks could not foresee) as a
    one-line ``FactoryError``, not a C++ assertion's traceback."""
    try:
        yield
    except RuntimeError as error:
        raise FactoryError(factory, f"FAISS could not {step} it: {faiss_reason(error)}") from error


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


def reserve(index, count: int) -> None:
    """Room for ``count`` vectors in a flat index (alone or under an IDMap), allocated once: adding chunk by chunk
    otherwise doubles the storage as it grows, and the copy at the last doubling holds up to twice the vectors.
    Other index types (IVF lists grow list by list) are left as they are."""
    import faiss

    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(index, faiss.IndexIDMap):
        index.id_map.resize(index.ntotal + count)  # a resize down keeps the capacity
        index.id_map.resize(index.ntotal)
    if isinstance(inner, faiss.IndexFlatCodes):
        inner.codes.resize((inner.ntotal + count) * inner.code_size)
        inner.codes.resize(inner.ntotal * inner.code_size)


def flat_rows(index, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Room for ``count`` vectors in an empty exact index (a flat index under an IDMap: what ``Flat`` builds), as
    writable views of its vectors (``count`` x dim float32, zeros) and ids, to be filled in place from any thread in
    any order; None for other index types, which vectors are added to. (A flat index's add is a copy: a GPU would
    only add two.)"""
    import faiss

    if type(index) is not faiss.IndexIDMap or index.ntotal:
        return None
    inner = faiss.downcast_index(index.index)
    if type(inner) not in (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2) or not count:
        return None
    inner.codes.resize(count * inner.code_size)
    index.id_map.resize(count)
    inner.ntotal = index.ntotal = count
    return (faiss.rev_swig_ptr(inner.get_xb(), count * inner.d).reshape(count, inner.d),
            faiss.rev_swig_ptr(index.id_map.data(), count))


def add_shard_files(index, index_dir: str, shard: str, use_gpu: bool = False, factory: str = "") -> dict[str, Any]:
    """Add one shard's embeddings (its files in name order) to ``index`` (the trained index of ``factory``, empty)
    and write its index file and id map. Holds the index and one batch of vectors."""
    files = shard_embedding_files(index_dir, shard)
    batches = ((batch.column(0).to_numpy(), table_vectors(batch))
               for batch in tables.iter_file_batches(files, ["passage_id", "embedding"], VECTOR_BATCH))
    reserve(index, sum(tables.parquet_row_count(path) for path in files))
    with refused_by_faiss(factory or type(index).__name__, f"add the passages of {shard} to"):
        index, ids = add_batches(index, batches, use_gpu)
    return write_shard(index, ids, index_dir, shard)


def write_shard(index, ids: np.ndarray, index_dir: str, shard: str) -> dict[str, Any]:
    """Write a shard's index file and id map (its passage ids in insertion order); its index.json entry."""
    write_index(index, fs.join(index_dir, shard_index_name(shard)))
    write_npy(fs.join(index_dir, shard_ids_name(shard)), ids)
    return {"name": shard, "index": shard_index_name(shard), "ids": shard_ids_name(shard), "count": len(ids),
            "embeddings": f"{EMBEDDINGS_DIR}/{shard}"}


def smallest_keys(batches: Iterable[np.ndarray], size: int) -> np.ndarray:
    """The ``size`` smallest of the keys of all ``batches``, holding at most about ``2 * size`` keys at a time."""
    kept = np.zeros(0, np.int64)
    for keys in batches:
        kept = np.concatenate([kept, keys])
        if len(kept) > 2 * size:
            kept = np.partition(kept, size - 1)[:size]
    return np.sort(kept)[:size]


def read_train_sample(files: Sequence[str], size: int) -> np.ndarray:
    """The vectors of the ``size`` rows of ``files`` with the smallest ``sample_key``, in key order (the same sample
    whatever the files): the keys alone first, then only the chosen rows' vectors are kept."""
    if not files or size == 0:
        return np.zeros((0, 0), dtype=np.float32)
    keys = (batch.column(0).to_numpy() for batch in tables.iter_file_batches(files, ["sample_key"]))
    chosen_keys = smallest_keys(keys, size)
    if len(chosen_keys) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    threshold = chosen_keys[-1]
    kept_keys, kept = [], []
    for batch in tables.iter_file_batches(files, ["sample_key", "embedding"], VECTOR_BATCH):
        batch_keys = batch.column(0).to_numpy()
        chosen = np.flatnonzero(batch_keys <= threshold)
        if len(chosen):
            kept_keys.append(batch_keys[chosen])
            kept.append(table_vectors(batch.take(chosen)))
    order = np.argsort(np.concatenate(kept_keys), kind="stable")
    return np.concatenate(kept)[order]

