"""embed-entities' store of mention-window vectors: one [MASK] vector per distinct model input, kept so that no
window is encoded twice, neither by the rerun of a killed stage nor by a refresh of the next dump.

A vector is keyed by ``window_key``: 64 bits of blake2b over the model's identity (``salt``: the model, its files,
the layer and the dtype) and the model's input itself (token ids and [MASK] position). It changes exactly when the
input would (a character outside the token budget changes nothing) or the model would. 64 bits: the odds that
two of English Wikipedia's 112M windows share a key are ~3e-4 per store, and such a pair costs one mention vector.

Every store file holds rows (``window_key``, ``embedding``: float16) sorted by key in row groups of one bucket of
keys each (the key's top ``bits`` bits: the buckets of stores of other sizes nest; a bucket's rows in groups of at
most ``ROW_GROUP_BYTES`` of vectors), the bucket of each row group and the salt in its metadata.
A stage's committed store (``mention_vectors/``) has one Parquet file per bucket; the followers of a running stage
write ``pending`` files as they encode (each written whole: a kill loses only what was not yet written), which its
rerun reads as a store. A bucket is read from every file that has it, and written, one at a time.

Pending files are Arrow IPC files (``PENDING_SUFFIX``), a record batch where a Parquet file has a row group: the
reduce reads each bucket from every pending file, and a bucket's read from a Parquet file parses the file's whole
footer (a row group per bucket: ~0.8 MB for English Wikipedia's 4,096 buckets, ~5 ms) where an IPC file's footer
is a list of batch offsets (~0.1 MB; ~0.1 ms with the batch: ``bench/reduce_reads.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from artifacts import fs, schemas
from artifacts.arrays import group_starts
from encoders.mask_inputs import PackedMaskInputs
from transforms.common.article_shards import parquet_file
from transforms.common.spill import IpcColumns

KEY, VECTOR = schemas.mention_vectors(1).names
STORE_DTYPE = np.float16  # stored vectors: entity vectors from them keep a cosine >= 0.99999 (README "Resume")
KNOWN_BITS = 6  # the known keys are gathered a 64th of the key range at a time
MIN_BITS = 4  # buckets of a store at least 2**MIN_BITS: the units of work of the reduce
BUCKET_BYTES = 64 << 20  # stored vectors of one bucket, at most about (the reduce holds them as float32: x2)
# Stored vectors of one row group, at most: Parquet's writer turns a row group's every float16 into two 16-bit
# levels (a vector is a list) before it writes a page; a 52 MB bucket written as one group took 233 MB more.
ROW_GROUP_BYTES = 8 << 20
PENDING_BYTES, PENDING_SHARE = 256 << 20, 400  # a pending file: at most this many bytes, and this share of a stage
SALT, BITS, BUCKETS = b"kpr_store_salt", b"kpr_store_bits", b"kpr_store_buckets"  # file metadata keys
PENDING_PREFIX, PENDING_SUFFIX = "pending-", ".arrow"
STORE_SUFFIXES = (".parquet", PENDING_SUFFIX)


def model_salt(identity: Sequence[object]) -> str:
    """What a model contributes to every key (hex): the JSON of ``identity`` (model, files, layer, dtype) hashed."""
    return hashlib.blake2b(json.dumps(list(identity), sort_keys=True).encode(), digest_size=16).hexdigest()


def window_keys(salt: str, packed: PackedMaskInputs) -> np.ndarray:
    """The ``window_key`` (uint64) of each of ``packed``'s inputs under the model of ``salt``."""
    seed = hashlib.blake2b(bytes.fromhex(salt), digest_size=8)
    ids = packed.ids.astype("<i4", copy=False)
    keys = np.empty(len(packed), dtype=np.uint64)
    for row, (start, stop, position) in enumerate(zip(packed.offsets[:-1].tolist(), packed.offsets[1:].tolist(),
                                                      packed.positions.tolist(), strict=True)):
        digest = seed.copy()
        digest.update(position.to_bytes(4, "little"))
        digest.update(ids[start:stop].tobytes())
        keys[row] = int.from_bytes(digest.digest(), "little")
    return keys


def store_bits(mentions: int, dim: int) -> int:
    """The bucket bits of a store of ``mentions`` vectors of ``dim``: a bucket within ``BUCKET_BYTES``."""
    buckets = mentions * dim * np.dtype(STORE_DTYPE).itemsize / BUCKET_BYTES
    return max(MIN_BITS, math.ceil(math.log2(buckets)) if buckets > 1 else 0)


def pending_rows(mentions: int, dim: int) -> int:
    """Windows a follower stores per pending file when the stage embeds ``mentions``: what a kill may lose."""
    return max(1, min(PENDING_BYTES // (dim * np.dtype(STORE_DTYPE).itemsize), mentions // PENDING_SHARE))


def key_buckets(keys: np.ndarray, bits: int) -> np.ndarray:
    """The bucket of each key: its top ``bits`` bits."""
    return (keys >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(len(keys), dtype=np.int64)


def covers(bucket: int, bits: int, other: int, other_bits: int) -> bool:
    """Whether bucket ``other`` of a store of ``other_bits`` holds keys of bucket ``bucket`` of ``bits``."""
    shift = min(bits, other_bits)
    return bucket >> (bits - shift) == other >> (other_bits - shift)


def store_table(keys: np.ndarray, vectors: np.ndarray) -> pa.Table:
    """Rows (``window_key``, ``embedding`` as ``STORE_DTYPE``: ``schemas.mention_vectors``), sorted by key (rows
    already in key order, as a bucket read from the store, are not copied)."""
    if len(keys) > 1 and not bool(np.all(keys[1:] >= keys[:-1])):
        order = np.argsort(keys, kind="stable")
        keys, vectors = keys[order], vectors[order]
    values = pa.array(np.ascontiguousarray(vectors, dtype=STORE_DTYPE).reshape(-1))
    return pa.table({KEY: pa.array(keys, pa.uint64()),
                     VECTOR: pa.FixedSizeListArray.from_arrays(values, vectors.shape[1])},
                    schema=schemas.mention_vectors(vectors.shape[1]))


def group_bounds(buckets: np.ndarray, most_rows: int) -> list[tuple[int, int]]:
    """(start, stop) of each row group of rows of the given (sorted) ``buckets``: each within one bucket, at most
    ``most_rows`` rows, a bucket's rows cut into groups of equal size (within a row)."""
    starts = group_starts(buckets).tolist()
    bounds = []
    for start, stop in zip(starts, [*starts[1:], len(buckets)][:len(starts)], strict=True):
        pieces = -(-(stop - start) // most_rows)
        bounds += [(start + (stop - start) * piece // pieces, start + (stop - start) * (piece + 1) // pieces)
                   for piece in range(pieces)]
    return bounds


def write_store_file(path: str, keys: np.ndarray, vectors: np.ndarray, salt: str, bits: int) -> str:
    """Write a store file at ``path`` (Parquet, or Arrow IPC for a path ending in ``PENDING_SUFFIX``), whole or not
    at all: the rows sorted by key, in row groups (record batches) of one bucket and at most ``ROW_GROUP_BYTES``
    (streamed to disk: the file is not held in memory); returns ``path``."""
    table = store_table(keys, vectors)
    buckets = key_buckets(table.column(KEY).to_numpy(), bits)
    groups = group_bounds(buckets, max(1, ROW_GROUP_BYTES // (vectors.shape[1] * np.dtype(STORE_DTYPE).itemsize)))
    schema = table.schema.with_metadata({SALT: salt.encode(), BITS: str(bits).encode(),
                                         BUCKETS: json.dumps([int(buckets[start]) for start, _ in groups]).encode()})
    pieces = (table.slice(start, stop - start).combine_chunks() for start, stop in groups)
    with fs.atomic_target(path) as local:
        if path.endswith(PENDING_SUFFIX):
            with ipc.new_file(local, schema) as writer:
                for piece in pieces:  # combined: one record batch each
                    writer.write_table(piece)
        else:
            with pq.ParquetWriter(local, schema, compression=schemas.PARQUET_CODEC, use_compliant_nested_type=False,
                                  **schemas.writer_options(schema)) as writer:
                for piece in pieces:
                    writer.write_table(piece, row_group_size=piece.num_rows)
    return path


def pending_path(directory: str) -> str:
    return fs.join(directory, f"{PENDING_PREFIX}{uuid.uuid4().hex}{PENDING_SUFFIX}")


def read_groups(path: str, groups: Sequence[int], columns: Sequence[str]) -> pa.Table:
    """``columns`` of row groups (record batches) ``groups`` of the store file at ``path``."""
    if not path.endswith(PENDING_SUFFIX):
        with parquet_file(path) as opened:
            return opened.read_row_groups(groups, columns=list(columns))
    with fs.open_ranges(path) as handle:
        opened = IpcColumns(columns).open(handle)
        return pa.Table.from_batches([opened.get_batch(group) for group in groups], opened.schema)


def store_metadata(path: str) -> dict[bytes, bytes]:
    """The schema metadata of a Parquet or Arrow IPC file."""
    if not path.endswith(PENDING_SUFFIX):
        with parquet_file(path) as opened:
            return opened.schema_arrow.metadata or {}
    with fs.open_ranges(path) as handle:
        return ipc.open_file(handle).schema.metadata or {}


@dataclass(frozen=True)
class StoreFile:
    """A store file: its ``path``, key ``bits`` and the bucket of each of its row groups."""

    path: str
    bits: int
    buckets: tuple[int, ...]

    def row_groups(self, bucket: int, bits: int) -> list[int]:
        """Its row groups that hold keys of ``bucket`` of a store of ``bits``."""
        return [group for group, own in enumerate(self.buckets) if covers(bucket, bits, own, self.bits)]


def store_file(path: str) -> tuple[str, StoreFile] | None:
    """(salt, StoreFile) of a store file; None for a file that is not one."""
    metadata = store_metadata(path)
    if SALT not in metadata:
        return None
    return metadata[SALT].decode(), StoreFile(path, int(metadata[BITS]), tuple(json.loads(metadata[BUCKETS])))


def store_files(directories: Iterable[str], salt: str | None) -> list[StoreFile]:
    """The store files under ``directories`` whose vectors are those of the model of ``salt`` (others ignored;
    None: every model's)."""
    found = []
    for directory in directories:
        for path in fs.list_files(directory):
            described = store_file(path) if path.endswith(STORE_SUFFIXES) else None
            if described is not None and salt in (None, described[0]):
                found.append(described[1])
    return found


def bucket_rows(files: Sequence[StoreFile], bucket: int, bits: int, columns: Sequence[str]) -> Iterator[pa.Table]:
    """``columns`` (``KEY`` among them) of the rows of bucket ``bucket`` of a store of ``bits`` in each of ``files``
    that has some (remote files several at a time: ``fs.read_each``)."""
    groups = {item.path: item.row_groups(bucket, bits) for item in files}

    def read(path: str) -> pa.Table:
        table = read_groups(path, groups[path], columns)
        return table.filter(pa.array(key_buckets(table.column(KEY).to_numpy(), bits) == bucket))

    yield from fs.read_each([path for path, own in groups.items() if own], read)


def bucket_keys(files: Sequence[StoreFile], bucket: int, bits: int) -> np.ndarray:
    """The keys of bucket ``bucket`` of a store of ``bits`` in ``files``, sorted, each once."""
    keys = [table.column(KEY).to_numpy() for table in bucket_rows(files, bucket, bits, [KEY])]
    return np.unique(np.concatenate([np.zeros(0, dtype=np.uint64), *keys]))


def write_known_keys(files: Sequence[StoreFile], path: str) -> str:
    """Write every key of ``files``, sorted and each once, as raw little-endian uint64 at ``path`` (``load_known``
    maps it), a range of keys at a time (``KNOWN_BITS``: what is held is 1/64th of the keys); returns ``path``."""
    with fs.local_target(path) as local, open(local, "wb") as out:
        for part in range(1 << KNOWN_BITS):
            out.write(bucket_keys(files, part, KNOWN_BITS).astype("<u8").tobytes())
    return path


def load_known(path: str) -> np.ndarray:
    """The keys ``write_known_keys`` wrote, memory-mapped (a remote file from a local copy, removed once mapped)."""
    with fs.local_copy(path) as local:
        if not os.path.getsize(local):
            return np.zeros(0, dtype=np.uint64)
        return np.memmap(local, dtype="<u8", mode="r")


def read_bucket(files: Sequence[StoreFile], bucket: int, bits: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys sorted, each once; their vectors) of bucket ``bucket`` of a store of ``bits`` from ``files``."""
    keys, vectors = [np.zeros(0, dtype=np.uint64)], [np.zeros((0, dim), dtype=STORE_DTYPE)]
    for table in bucket_rows(files, bucket, bits, [KEY, VECTOR]):
        keys.append(table.column(KEY).to_numpy())
        vectors.append(table.column(VECTOR).combine_chunks().flatten().to_numpy().reshape(-1, dim))
    found, rows = np.unique(np.concatenate(keys), return_index=True)
    return found, np.concatenate(vectors)[rows]
