"""Encoded passages staged in hash buckets until the exact count decides the number of shards.

A passage's bucket is ``shard_of(passage_id, buckets)``; with ``shards`` dividing ``buckets``, bucket ``b`` belongs
to shard ``b % shards``, which is ``shard_of(passage_id, shards)``: the shard files are exactly those of hashing by
shard, whatever the number of shards chosen afterwards. Each writer (one per worker bundle) appends a bucket's rows
to its own Parquet file as small row groups, so a worker holds a few thousand rows, never a bucket; the files it
closed are listed as ``BucketFile`` records, and only the listed files are used (a failed bundle's files are not).

Once the shards are known, each bucket is read back, sorted by passage id (its vectors put at their rows as its row
groups are read) and written as one file of its shard: the shard's files and its FAISS insertion order are then the
same whatever the runner or worker count.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs, tables
from artifacts.arrays import group_starts, split_by
from artifacts.faiss.files import EMBEDDINGS_DIR
from artifacts.faiss.vectors import embedding_schema, table_vectors, with_vectors
from artifacts.passages import sample_key, shard_of
from artifacts.schemas import PARQUET_CODEC, scratch_compression, writer_options

BUFFERED_ROWS = 16_384  # rows a writer holds over all its buckets (~60 MB at 768 dims)
MIN_GROUP_ROWS, MAX_GROUP_ROWS = 64, 4096  # rows per row group of a staged file
SAMPLE_KEY = "sample_key"  # staged files only: the training sample's key, hashed where the row was encoded


def bucket_name(bucket: int) -> str:
    return f"bucket-{bucket:05d}"


def staged_schema(dim: int) -> pa.Schema:
    """The contract's embedding columns plus the row's training-sample key."""
    return embedding_schema(dim).append(pa.field(SAMPLE_KEY, pa.int64()))


@dataclass(frozen=True)
class BucketFile:
    """One closed staged file: its bucket, path and row count."""

    bucket: int
    path: str
    rows: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> BucketFile:
        return cls(**json.loads(line))


def group_rows(buckets: int) -> int:
    """Rows per row group: the writer's buffer shared by its buckets."""
    return min(MAX_GROUP_ROWS, max(MIN_GROUP_ROWS, BUFFERED_ROWS // buckets))


Row = tuple[int, str, str, np.ndarray]  # a staged row: (passage_id, title, text, vector)


class BucketWriter:
    """Rows hashed into ``buckets`` buckets under ``directory`` (``bucket-NNNNN/<unique>.parquet``, one file per
    bucket per writer); ``close`` returns the files written."""

    def __init__(self, directory: str, buckets: int, dim: int) -> None:
        self._directory, self._buckets, self._dim = directory, buckets, dim
        self._group_rows = group_rows(buckets)
        self._buffers: dict[int, list[pa.Table]] = {}
        self._held: dict[int, int] = {}  # rows in each bucket's buffer
        self._buffered = 0  # rows in all buffers
        self._files: dict[int, tuple[str, object, pq.ParquetWriter]] = {}  # bucket -> (path, handle, writer)
        self._rows: dict[int, int] = {}

    def add_table(self, table: pa.Table) -> None:
        """Stage rows (an ``embedding_schema`` table), each in its bucket with its sample key: a bucket's buffer is
        written as a row group once it holds a row group's rows, and the fullest whenever the writer holds
        ``BUFFERED_ROWS``, so that it never holds more."""
        ids = table.column("passage_id").to_pylist()
        staged = table.append_column(pa.field(SAMPLE_KEY, pa.int64()),
                                     pa.array([sample_key(passage_id) for passage_id in ids], pa.int64()))
        of_row = np.fromiter((shard_of(passage_id, self._buckets) for passage_id in ids), np.int64, len(ids))
        for bucket, rows in split_by(np.arange(len(ids)), of_row):
            self._buffers.setdefault(bucket, []).append(staged.take(rows))
            self._held[bucket] = self._held.get(bucket, 0) + len(rows)
            self._buffered += len(rows)
            if self._held[bucket] >= self._group_rows:
                self._flush(bucket)
        while self._buffered >= BUFFERED_ROWS:  # many buckets: the fullest goes
            self._flush(max(self._held, key=self._held.__getitem__))

    def _flush(self, bucket: int) -> None:
        parts, held = self._buffers.pop(bucket, []), self._held.pop(bucket, 0)
        if not held:
            return
        self._buffered -= held
        if bucket not in self._files:
            path = fs.join(self._directory, bucket_name(bucket), f"{uuid.uuid4().hex}.parquet")
            handle = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
            schema = staged_schema(self._dim)
            self._files[bucket] = path, handle, pq.ParquetWriter(handle, schema,
                                                                 compression=scratch_compression(schema),
                                                                 **writer_options(schema))
        self._files[bucket][2].write_table(pa.concat_tables(parts), row_group_size=self._group_rows)
        self._rows[bucket] = self._rows.get(bucket, 0) + held

    def close(self) -> list[BucketFile]:
        for bucket in list(self._buffers):
            self._flush(bucket)
        written = []
        for bucket, (path, handle, writer) in sorted(self._files.items()):
            writer.close()
            handle.close()
            written.append(BucketFile(bucket, path, self._rows[bucket]))
        self._files.clear()
        return written


def read_bucket_files(paths: Iterable[str]) -> list[BucketFile]:
    """The records of the JSON-lines files ``paths`` (what the writers listed)."""
    records = []
    for path in paths:
        records += [BucketFile.from_json(line) for line in fs.read_bytes(path).decode().splitlines() if line]
    return sorted(records, key=lambda record: (record.bucket, record.path))


def shard_buckets(records: Iterable[BucketFile], shards: int) -> dict[int, list[tuple[int, list[str]]]]:
    """shard -> [(bucket, its files)] in bucket order, for the non-empty buckets (bucket b is in shard b % shards)."""
    files: dict[int, list[str]] = {}
    for record in records:
        if record.rows:
            files.setdefault(record.bucket, []).append(record.path)
    grouped: dict[int, list[tuple[int, list[str]]]] = {}
    for bucket in sorted(files):
        grouped.setdefault(bucket % shards, []).append((bucket, sorted(files[bucket])))
    return grouped


def read_bucket(paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of a bucket's staged rows."""
    parts = []
    for path in paths:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            parts.append(pq.read_table(handle, columns=list(columns)))
    return pa.concat_tables(parts)


def fill_bucket(paths: Sequence[str], ids: np.ndarray, vectors: np.ndarray) -> None:
    """Each staged row's vector written at its passage id's row of ``vectors`` (a row per id of ``ids``, the
    bucket's ids in order), one staged row group at a time: the bucket's vectors are held once, where they go."""
    for batch in tables.iter_file_batches(paths, ["passage_id", "embedding"]):
        vectors[np.searchsorted(ids, batch.column(0).to_numpy())] = table_vectors(batch)


def write_shard_bucket(index_dir: str, shard: str, bucket: int, paths: Sequence[str],
                       dim: int) -> tuple[np.ndarray, int]:
    """Write one bucket's rows, sorted by passage id, each passage once, as ``embeddings/SHARD/bucket-NNNNN.parquet``;
    returns its passage ids in that order and how many staged rows repeated one (a passage's input file written
    twice: a cluster retries a failed bundle of the inputs' job, and a follower may have taken the failed
    attempt's file before the job ended; both rows are the passage encoded by the same encoder). Holds the bucket's
    vectors once (put in order as they are read) and its other columns twice while their chunks are combined (a
    take from many chunks costs ~20 times more), then once."""
    passages = read_bucket(paths, ["passage_id", "title", "text"]).combine_chunks()
    order = pc.sort_indices(passages.column("passage_id"))
    ids = passages.column("passage_id").take(order).to_numpy()
    first = group_starts(ids)  # each passage id's first row
    repeated = len(ids) - len(first)
    if repeated:
        order, ids = order.take(pa.array(first)), ids[first]
    vectors = np.empty((len(ids), dim), np.float32)
    fill_bucket(paths, ids, vectors)
    path = fs.join(index_dir, EMBEDDINGS_DIR, shard, f"{bucket_name(bucket)}.parquet")
    schema = embedding_schema(dim)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle, \
            pq.ParquetWriter(handle, schema, compression=PARQUET_CODEC,
                             **writer_options(schema)) as writer:
        for start in range(0, len(ids), MAX_GROUP_ROWS):
            rows = slice(start, start + MAX_GROUP_ROWS)
            writer.write_table(with_vectors(passages.take(order[rows]), vectors[rows]))
    del passages, order, vectors
    pa.default_memory_pool().release_unused()  # Arrow's pool would keep the bucket's pages from the index build
    return ids, repeated
