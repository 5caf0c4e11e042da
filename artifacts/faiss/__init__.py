"""Sharded FAISS indexes under OUT/index/: training once on a sample, adding shard by shard, exact top-k merge.

Layout of ``index/``::

    index.json                      factory, metric, dim, counts, shard list, the encoder options
    trained.faiss                   the trained, empty index (every shard starts from it)
    shard-00003.faiss               one FAISS index per shard; FAISS ids are passage ids (int64, unique)
    shard-00003.ids.npy             the shard's id map: row (insertion order) -> passage id
    embeddings/shard-00003/*.parquet  passage_id, title, text, embedding: the vectors, and the passages'
                                    text for evaluation (a passage's shard is ``shard_of(passage_id)``); one
                                    file per hash bucket, rows in passage-id order

Only inner-product metrics: ``dot`` and ``cosine`` (vectors already L2-normalized by the encoder).

One concept per module: ``files`` (names inside index/), ``vectors`` (the vector tables), ``buckets`` (encoded
rows staged by hash bucket, then sorted into shard files), ``choice`` (which index, how many shards, how much
memory), ``storage`` (FAISS and numpy files on any Beam filesystem), ``build`` (train and add),
``info`` (index.json), ``search`` (shard-by-shard search and passage lookup). This package gives their
public names to readers that take the index as one thing, each module imported when one of its names is first
asked for (PEP 562): a reader of one module (the command line, of ``choice``'s defaults) does not import FAISS,
pyarrow and Beam.
"""

from importlib import import_module
from typing import Any

# module -> the public names it gives the package
_NAMES = {
    "build": ("add_batches", "add_shard_files", "flat_rows", "gpu_count", "new_index", "read_train_sample",
              "train_index", "trained_file_reason", "untrained_reason"),
    "choice": ("DEFAULT_EF_SEARCH", "DEFAULT_NPROBE", "MAX_TRAIN_SAMPLE", "MemoryEstimate", "check_factory",
               "default_factory", "faiss_reason", "ivf_lists", "memory_estimate", "needs_training",
               "training_sample_size"),
    "files": ("EMBEDDINGS_DIR", "INDEX_JSON", "TRAINED_NAME", "shard_embedding_files", "shard_name"),
    "info": ("IndexInfo", "load_index_info"),
    "search": ("PassageLookup", "ShardedIndex", "merge_top_k", "searches_a_graph", "set_search_parameters"),
    "storage": ("DamagedIndexError", "read_index", "read_npy", "stored_ids", "write_index", "write_npy"),
    "vectors": ("embedding_schema", "embedding_table", "table_vectors"),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """A public name (or a module) of the package, importing its module on first use."""
    if name in _NAMES:
        return import_module(f"{__name__}.{name}")
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
