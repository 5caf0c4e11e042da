"""One bucket's read from one file of each kind that embed-entities' reduce reads a bucket at a time from every
file, at English Wikipedia's shapes (112M mentions, 768 dims), as Arrow IPC (what the stage writes since
2026-11-29) and as Parquet with a row group per bucket (what it wrote before):

- pending files of the window store (``window_store``): every bucket of the store read from each;
- the mentions' window keys (``forward.RefWriter``), by bucket of the store;
- the mention vectors' parts (``entity_vectors.PartWriter``), by bucket of entity ids.

Each kind's file is written once at its full-scale size (random keys: every file holds every bucket), then
``--reads`` buckets picked at random are read from it, the file opened anew each time as the stage does. Prints
each format's time per read, its footer's size, and the reads and CPU hours of the whole reduce at that scale.

    python -m bench.reduce_reads [--reads 200] [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import fs, schemas
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


def parquet_read(path: Path, columns: list[str]) -> Callable[[int], int]:
    def read(group: int) -> int:
        with fs.open_read(str(path)) as handle:
            return pq.ParquetFile(handle).read_row_groups([group], columns=columns).num_rows
    return read


def timed(read: Callable[[int], int], groups: int, reads: int, rng: np.random.Generator) -> float:
    """Seconds per read of a random group."""
    picked = rng.integers(0, groups, reads).tolist()
    started = time.perf_counter()
    for group in picked:
        read(group)
    return (time.perf_counter() - started) / reads


def pending_files(work: Path, rng: np.random.Generator) -> tuple[str, int, int, dict[str, tuple[Path, Callable]]]:
    rows, bits = pending_rows(MENTIONS, DIM), store_bits(MENTIONS, DIM)
    keys, vectors = random_keys(rows, rng), random_vectors(rows, rng)
    arrow = Path(write_store_file(str(work / "pending.arrow"), keys, vectors, "salt", bits))
    table = store_table(keys, vectors)  # sorted by key
    parquet_by_bucket(work / "pending.parquet", table, key_buckets(table.column(KEY).to_numpy(), bits),
                      schemas.PARQUET_CODEC)
    return ("pending files of the window store", math.ceil(MENTIONS / rows), 1 << bits,
            {"Arrow IPC": (arrow, lambda group: read_groups(str(arrow), [group], [KEY, VECTOR]).num_rows),
             "Parquet": (work / "pending.parquet", parquet_read(work / "pending.parquet", [KEY, VECTOR]))})


def part_files(work: Path, name: str, table: pa.Table, buckets: np.ndarray,
               passes: list[list[str]]) -> dict[str, tuple[Path, Callable]]:
    """A part file of ``table`` by ``buckets`` in both formats, each read as the stage reads it: one pass over its
    files per list of columns in ``passes`` (the vector parts: their keys, then their vectors)."""
    order = np.argsort(buckets, kind="stable")
    arrow = work / f"{name}.arrow"
    write_bucketed_part(str(arrow), table, buckets)
    parquet_by_bucket(work / f"{name}.parquet", table.take(order), buckets[order], "snappy")
    by_pass = [parquet_read(work / f"{name}.parquet", columns) for columns in passes]
    return {"Arrow IPC": (arrow, lambda batch: sum(part.num_rows for columns in passes
                                                   for part in read_parts([Part(str(arrow), batch)], columns))),
            "Parquet": (work / f"{name}.parquet", lambda group: sum(read(group) for read in by_pass))}


def ref_files(work: Path, rng: np.random.Generator) -> tuple[str, int, int, dict[str, tuple[Path, Callable]]]:
    bits = store_bits(MENTIONS, DIM)
    refs = np.zeros(REF_ROWS, dtype=WINDOW_REF)
    refs["entity_id"], refs["page_id"] = rng.integers(0, 7_000_000, REF_ROWS), rng.integers(0, 70_000_000, REF_ROWS)
    refs["window_key"] = random_keys(REF_ROWS, rng)
    table = pa.table({name: refs[name] for name in WINDOW_REF.names})
    return ("the mentions' window keys", math.ceil(MENTIONS / REF_ROWS), 1 << bits,
            part_files(work, "refs", table, key_buckets(refs["window_key"], bits), [list(WINDOW_REF.names)]))


def vector_files(work: Path, rng: np.random.Generator) -> tuple[str, int, int, dict[str, tuple[Path, Callable]]]:
    buckets = vector_buckets(MENTIONS, DIM)
    rows = part_bytes(buckets) // (DIM * np.dtype(STORE_DTYPE).itemsize)
    keys = np.zeros(rows, dtype=MENTION_KEY)
    keys["entity_id"], keys["page_id"] = rng.integers(0, 7_000_000, rows), rng.integers(0, 70_000_000, rows)
    table = mention_vector_table(keys, random_vectors(rows, rng))
    return ("the mention vectors' parts", math.ceil(MENTIONS / rows), buckets,
            part_files(work, "vectors", table, bucket_of(keys["entity_id"], buckets),
                       [list(MENTION_KEY.names), ["vector"]]))


def footer_bytes(path: Path) -> int:
    """The footer's length, from the last bytes of a Parquet or Arrow IPC file (both: 4-byte length, 6-byte magic)."""
    with open(path, "rb") as handle:
        handle.seek(-10 if path.suffix == ".arrow" else -8, 2)
        return int.from_bytes(handle.read(4), "little")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200, help="buckets read from each file")
    parser.add_argument("--work", type=Path, default=None, help="a directory for the files (default: a temporary one)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.work) as directory:
        for build in (pending_files, ref_files, vector_files):
            kind, files, buckets, formats = build(Path(directory), rng)
            print(f"{kind}: {files:,} files of {buckets:,} buckets at {MENTIONS:,} mentions: "
                  f"{files * buckets:,} reads")
            for name, (path, read) in formats.items():
                seconds = timed(read, buckets, args.reads, rng)
                size, footer = path.stat().st_size / 1e6, footer_bytes(path) / 1e6
                print(f"  {name:<9} {size:7.1f} MB file, footer {footer:5.2f} MB: {seconds * 1e3:6.2f} ms a read,"
                      f" {files * buckets * seconds / 3600:5.2f} CPU hours in all",
                      flush=True)


if __name__ == "__main__":
    main()
