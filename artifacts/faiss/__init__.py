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
``info`` (index.json), ``search`` (shard-by-shard search and passage lookup). This package re-exports their
public names for readers that take the index as one thing.
"""

from artifacts.faiss.build import add_batches, build_shard, gpu_count, new_index, read_train_sample, train_index
from artifacts.faiss.choice import (
    MAX_TRAIN_SAMPLE,
    MemoryEstimate,
    check_factory,
    default_factory,
    ivf_lists,
    memory_estimate,
    needs_training,
    training_sample_size,
)
from artifacts.faiss.files import (
    EMBEDDINGS_DIR,
    INDEX_JSON,
    TRAINED_NAME,
    shard_embedding_files,
    shard_name,
)
from artifacts.faiss.info import IndexInfo, load_index_info
from artifacts.faiss.search import DEFAULT_EF_SEARCH, DEFAULT_NPROBE, PassageLookup, ShardedIndex, merge_top_k
from artifacts.faiss.storage import (
    DamagedIndexError,
    read_index,
    read_npy,
    upload,
    write_index,
    write_npy,
)
from artifacts.faiss.vectors import (
    ADD_CHUNK,
    embedding_schema,
    embedding_table,
    iter_parquet_batches,
    table_vectors,
)

__all__ = [
    "ADD_CHUNK", "DEFAULT_EF_SEARCH", "DEFAULT_NPROBE", "EMBEDDINGS_DIR", "INDEX_JSON", "MAX_TRAIN_SAMPLE",
    "TRAINED_NAME", "DamagedIndexError", "IndexInfo", "MemoryEstimate", "PassageLookup",
    "ShardedIndex", "add_batches", "build_shard", "check_factory", "default_factory",
    "embedding_schema", "embedding_table", "gpu_count", "iter_parquet_batches", "ivf_lists", "load_index_info",
    "memory_estimate", "merge_top_k", "needs_training", "new_index", "read_index", "read_npy", "read_train_sample",
    "shard_embedding_files", "shard_name", "table_vectors", "train_index", "training_sample_size", "upload",
    "write_index", "write_npy",
]
