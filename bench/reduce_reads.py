"""One bucket's read from one file of each kind that embed-entities' reduce reads a bucket at a time from every
file, at English Wikipedia's shapes (112M mentions, 768 dims), as Arrow IPC (what the stage writes since
2026-11-29) and as Parquet with a row group per bucket (what it wrote before):

- pending files of the window store (``window_store``): every bucket of the store read from each;
- the mentions' window keys (``forward.RefWriter``), by bucket of the store;
- the mention vectors' parts (``entity_vectors.PartWriter``), by bucket of entity ids.

Each kind's file is written once at its full-scale size (random keys: every file holds every bucket), then
``--reads`` buckets picked at random are read from it, the file opened anew each time as the stage does. Prints
each format's time per read, its footer's size, and the reads and CPU hours of the whole reduce at that scale.
Then the Arrow IPC file read as from an object store (``bench.object_store``: Beam's S3 reader over the local
file, each request counted): the bytes and requests a read fetches through Beam's reader as it is (16 MB at each
read outside its buffer) and through ``fs.open_ranges`` (what the stage reads with since 2026-11-29), and the time
a read takes when each request is answered after ``--latency`` seconds, one at a time and as the stage reads a
bucket's files (``fs.read_each``). Buckets are read from ``LINKS`` hard links of each file at once, as the stage
reads a bucket from many files.

    python -m bench.reduce_reads [--reads 200] [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import fs, schemas
from bench.object_store import MirrorFileSystem, mirrored
from transforms.common.packed import bucket_of
from transforms.common.spill import Part, read_parts
from transforms.embed_entities.entity_vectors import (
    MENTION_KEY,
    mention_vector_table,
    part_bytes,
    vector_buckets,
    write_bucketed_part,
)
from transforms.embed_entities.forward import REF_ROWS
from transforms.embed_entities.inputs import WINDOW_REF
from transforms.embed_entities.window_store import (
    KEY,
    STORE_DTYPE,
    VECTOR,
    group_bounds,
    key_buckets,
    pending_rows,
    read_groups,
    store_bits,
    store_table,
    write_store_file,
)

MENTIONS, DIM = 112_000_000, 768


def random_keys(rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, np.iinfo(np.uint64).max, rows, dtype=np.uint64)


def random_vectors(rows: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((rows, DIM), dtype=np.float32) * 0.05).astype(STORE_DTYPE)


def parquet_by_bucket(path: Path, table: pa.Table, buckets: np.ndarray, compression: str) -> None:
    """``table`` (rows sorted by bucket) as Parquet with a row group per bucket: the stage's files before."""
    with pq.ParquetWriter(path, table.schema, compression=compression, use_compliant_nested_type=False,
                          **schemas.writer_options(table.schema)) as writer:
        for start, stop in group_bounds(buckets, len(buckets)):
            writer.write_table(table.slice(start, stop - start), row_group_size=stop - start)


Reader = Callable[[str], Callable[[int], int]]  # a file's path -> a read of one of its groups (-> the files read)
# Copies (hard links) of a part file whose bucket a read takes at once, as the stage reads a bucket's parts of many
# files in one call (the columns' indices looked up in its first file only).
LINKS = 32


def parquet_read(passes: list[list[str]]) -> Reader:
    """A row group read once with each list of columns of ``passes``, the file opened anew each time."""
    def reader(path: str) -> Callable[[int], int]:
        def read(group: int) -> int:
            for columns in passes:
                with fs.open_read(path) as handle:
                    pq.ParquetFile(handle).read_row_groups([group], columns=columns)
            return 1
        return read
    return reader


def ipc_part_read(passes: list[list[str]]) -> Reader:
    """A bucket read from the ``LINKS`` copies of a part file at once (``read_parts``), once with each list of
    columns of ``passes``."""
    def reader(path: str) -> Callable[[int], int]:
        def read(batch: int) -> int:
            for columns in passes:
                for _ in read_parts([Part(copy, batch) for copy in linked(path)], columns):
                    pass
            return LINKS
        return read
    return reader


def linked(path: str) -> list[str]:
    """``path`` and its ``LINKS - 1`` hard links (``link_copies``)."""
    return [path, *(f"{path[:-len('.arrow')]}-{copy}.arrow" for copy in range(1, LINKS))]


def link_copies(path: Path) -> None:
    for copy in linked(str(path))[1:]:
        os.link(path, copy)


def timed(read: Callable[[int], int], groups: int, reads: int, rng: np.random.Generator) -> tuple[float, int]:
    """(seconds per file read, files read) of ``reads`` reads of a random group."""
    picked = rng.integers(0, groups, reads).tolist()
    started = time.perf_counter()
    files = sum(read(group) for group in picked)
    return (time.perf_counter() - started) / files, files


@dataclass(frozen=True)
class Kind:
    """A kind of file the reduce reads: ``files`` of ``buckets`` at full scale, each format's file and read, and
    the passes the stage makes over each file (the vector parts: their keys, then their vectors)."""

    what: str
    files: int
    buckets: int
    formats: dict[str, tuple[Path, Reader]]
    passes: int = 1


def pending_read(path: str) -> Callable[[int], int]:
    """A bucket read from the ``LINKS`` copies of a pending file at once, as the gather reads a bucket's files."""
    def read(group: int) -> int:
        for _ in fs.read_each(linked(path), lambda copy: read_groups(copy, [group], [KEY, VECTOR])):
            pass
        return LINKS
    return read


def pending_files(work: Path, rng: np.random.Generator) -> Kind:
    rows, bits = pending_rows(MENTIONS, DIM), store_bits(MENTIONS, DIM)
    keys, vectors = random_keys(rows, rng), random_vectors(rows, rng)
    arrow = Path(write_store_file(str(work / "pending.arrow"), keys, vectors, "salt", bits))
    link_copies(arrow)
    table = store_table(keys, vectors)  # sorted by key
    parquet_by_bucket(work / "pending.parquet", table, key_buckets(table.column(KEY).to_numpy(), bits),
                      schemas.PARQUET_CODEC)
    return Kind("pending files of the window store", math.ceil(MENTIONS / rows), 1 << bits,
                {"Arrow IPC": (arrow, pending_read),
                 "Parquet": (work / "pending.parquet", parquet_read([[KEY, VECTOR]]))})


def part_files(work: Path, name: str, table: pa.Table, buckets: np.ndarray,
               passes: list[list[str]]) -> dict[str, tuple[Path, Reader]]:
    """A part file of ``table`` by ``buckets`` in both formats, each read as the stage reads it: one pass over its
    files per list of columns in ``passes`` (the vector parts: their keys, then their vectors), the Arrow IPC file's
    bucket from ``LINKS`` copies at once."""
    order = np.argsort(buckets, kind="stable")
    arrow = work / f"{name}.arrow"
    write_bucketed_part(str(arrow), table, buckets)
    link_copies(arrow)
    parquet_by_bucket(work / f"{name}.parquet", table.take(order), buckets[order], "snappy")
    return {"Arrow IPC": (arrow, ipc_part_read(passes)), "Parquet": (work / f"{name}.parquet", parquet_read(passes))}


def ref_files(work: Path, rng: np.random.Generator) -> Kind:
    bits = store_bits(MENTIONS, DIM)
    refs = np.zeros(REF_ROWS, dtype=WINDOW_REF)
    refs["entity_id"], refs["page_id"] = rng.integers(0, 7_000_000, REF_ROWS), rng.integers(0, 70_000_000, REF_ROWS)
    refs["window_key"] = random_keys(REF_ROWS, rng)
    table = pa.table({name: refs[name] for name in WINDOW_REF.names})
    return Kind("the mentions' window keys", math.ceil(MENTIONS / REF_ROWS), 1 << bits,
                part_files(work, "refs", table, key_buckets(refs["window_key"], bits), [list(WINDOW_REF.names)]))


def vector_files(work: Path, rng: np.random.Generator) -> Kind:
    buckets = vector_buckets(MENTIONS, DIM)
    rows = part_bytes(buckets) // (DIM * np.dtype(STORE_DTYPE).itemsize)
    keys = np.zeros(rows, dtype=MENTION_KEY)
    keys["entity_id"], keys["page_id"] = rng.integers(0, 7_000_000, rows), rng.integers(0, 70_000_000, rows)
    table = mention_vector_table(keys, random_vectors(rows, rng))
    passes = [list(MENTION_KEY.names), ["vector"]]
    return Kind("the mention vectors' parts", math.ceil(MENTIONS / rows), buckets,
                part_files(work, "vectors", table, bucket_of(keys["entity_id"], buckets), passes), len(passes))


def beam_reader_read(path: str, passes: int) -> Callable[[int], int]:
    """A batch of the Arrow IPC file at ``path`` read through Beam's reader as it is (``fs.open_read``), the file
    opened anew for each of ``passes``."""
    def read(batch: int) -> int:
        for _ in range(passes):
            with fs.open_read(path) as handle:
                pa.ipc.open_file(handle).get_batch(batch)
        return 1
    return read


def fetched_per_read(read: Callable[[int], int], groups: int, reads: int, rng: np.random.Generator,
                     latency: float = 0.0) -> tuple[float, float, float]:
    """(bytes, requests, seconds) of a file's read of a random group from an object store that answers each
    request after ``latency`` seconds, on average."""
    MirrorFileSystem.log.clear(delay=latency)
    seconds, files = timed(read, groups, reads, rng)
    fetched, requests = sum(MirrorFileSystem.log.fetched), len(MirrorFileSystem.log.fetched)
    MirrorFileSystem.log.clear()
    return fetched / files, requests / files, seconds


def print_object_store_reads(kind: Kind, reads: int, latency: float, rng: np.random.Generator) -> None:
    path, reader = kind.formats["Arrow IPC"]
    remote = mirrored(path)
    files, buckets = kind.files, kind.buckets
    for name, read in (("Beam's reader", beam_reader_read(remote, kind.passes)), ("ranged reads", reader(remote))):
        fetched, requests, _ = fetched_per_read(read, buckets, reads, rng)
        print(f"  from an object store, {name:<13}: {fetched / 1e6:7.2f} MB and {requests:4.1f} requests a read, "
              f"{files * buckets * fetched / 1e12:8.2f} TB and {files * buckets * requests / 1e6:5.1f}M requests "
              "in all", flush=True)
    _, requests, seconds = fetched_per_read(reader(remote), buckets, max(1, reads // LINKS), rng, latency)
    print(f"  at {latency * 1e3:.0f} ms a request: {requests * latency * 1e3:6.1f} ms a read one at a time, "
          f"{seconds * 1e3:5.1f} ms as the stage reads a bucket's files ({fs.REMOTE_READS} at a time): "
          f"{files * buckets * seconds / 3600:5.1f} hours of a worker thread in all", flush=True)


def footer_bytes(path: Path) -> int:
    """The footer's length, from the last bytes of a Parquet or Arrow IPC file (both: 4-byte length, 6-byte magic)."""
    with open(path, "rb") as handle:
        handle.seek(-10 if path.suffix == ".arrow" else -8, 2)
        return int.from_bytes(handle.read(4), "little")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200, help="buckets read from each file")
    parser.add_argument("--store-reads", type=int, default=20,
                        help="buckets read from each Arrow IPC file as from an object store")
    parser.add_argument("--latency", type=float, default=0.03,
                        help="seconds an object store takes to answer a request (assumed)")
    parser.add_argument("--work", type=Path, default=None, help="a directory for the files (default: a temporary one)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.work) as directory:
        for build in (pending_files, ref_files, vector_files):
            kind = build(Path(directory), rng)
            files, buckets = kind.files, kind.buckets
            print(f"{kind.what}: {files:,} files of {buckets:,} buckets at {MENTIONS:,} mentions: "
                  f"{files * buckets:,} reads")
            for name, (path, reader) in kind.formats.items():
                seconds, _ = timed(reader(str(path)), buckets, args.reads, rng)
                size, footer = path.stat().st_size / 1e6, footer_bytes(path) / 1e6
                print(f"  {name:<9} {size:7.1f} MB file, footer {footer:5.2f} MB: {seconds * 1e3:6.2f} ms a read,"
                      f" {files * buckets * seconds / 3600:5.2f} CPU hours in all",
                      flush=True)
            print_object_store_reads(kind, args.store_reads, args.latency, rng)


if __name__ == "__main__":
    main()
