"""The names of the files inside OUT/index/ (relative to that directory)."""

from __future__ import annotations

from artifacts import fs

INDEX_JSON = "index.json"
TRAINED_NAME = "trained.faiss"
EMBEDDINGS_DIR = "embeddings"
BUCKETS_DIR = "buckets"  # encoded rows staged by hash bucket, outside OUT/index (artifacts/faiss/buckets.py)
BUCKET_LIST_NAME = "bucket-files"  # the records of the staged files, JSON lines


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


def shard_index_name(shard: str) -> str:
    """The FAISS file of shard ``shard`` (a ``shard_name``)."""
    return f"{shard}.faiss"


def shard_ids_name(shard: str) -> str:
    """The id map of shard ``shard``: row (insertion order) -> passage id."""
    return f"{shard}.ids.npy"


def shard_embedding_files(index_dir: str, shard: str) -> list[str]:
    return fs.list_files(fs.join(index_dir, EMBEDDINGS_DIR, shard), "*.parquet")
