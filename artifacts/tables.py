"""Read Parquet artifacts under OUT without Beam (for runtimes, validation, tests and small global objects)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.errors import InputError, first_line
from artifacts.schemas import PARQUET_CODEC, writer_options


class MissingArtifactError(InputError):
    """An artifact another stage should have written is not there (a one-line error for the user)."""


class DamagedParquetError(InputError):
    """A Parquet file whose footer or pages pyarrow cannot read: damaged, or changed after it was written (a stage
    checks its inputs' content before it reads them only where its launcher hashes them)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path} cannot be read as Parquet ({problem}): it is damaged or was changed after the stage "
                         "that wrote it; `python run_pipeline.py validate --output OUT` checks every file of a run "
                         "against its manifest")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


@contextlib.contextmanager
def reading_parquet(path: str) -> Iterator[None]:
    """What pyarrow raises in the block, reading the Parquet file ``path``, as a ``DamagedParquetError`` naming it
    (pyarrow says only what it found, e.g. "ZSTD decompression failed", not where)."""
    try:
        yield
    except (OSError, pa.ArrowException) as error:
        raise DamagedParquetError(path, first_line(error)) from error


@contextlib.contextmanager
def open_parquet(path: str) -> Iterator[pq.ParquetFile]:
    """The Parquet file ``path`` (any Beam filesystem) opened for reading, its footer read (``reading_parquet``)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle, reading_parquet(path):
        yield pq.ParquetFile(handle)


def require_columns(parquet: pq.ParquetFile, path: str, columns: list[str] | None) -> None:
    """``DamagedParquetError`` naming the first of ``columns`` the file ``path`` lacks (pyarrow raises a KeyError)."""
    missing = [column for column in columns or () if column not in parquet.schema_arrow.names]
    if missing:
        raise DamagedParquetError(path, f"column {missing[0]} is missing")


def artifact_dir(output: str, name: str) -> str:
    return fs.join(output, name)


def parquet_files(output: str, name: str) -> list[str]:
    """The Parquet files of artifact ``name`` under ``output``, sorted; an error naming the stage if none."""
    files = fs.list_files(artifact_dir(output, name), "*.parquet")
    if not files:
        raise MissingArtifactError(f"no {name}/*.parquet under {output}")
    return files


def parquet_row_count(path: str) -> int:
    with open_parquet(path) as opened:
        return opened.metadata.num_rows


def total_rows(output: str, name: str) -> int:
    """Rows of artifact ``name`` from the Parquet footers alone (no data is read)."""
    return sum(parquet_row_count(path) for path in parquet_files(output, name))


def read_file(path: str, columns: list[str] | None = None) -> pa.Table:
    with open_parquet(path) as parquet:
        require_columns(parquet, path, columns)
        return parquet.read(columns=columns)


def parquet_bytes(table: pa.Table, compression: str | dict[str, str] = PARQUET_CODEC) -> bytes:
    """``table`` as the bytes of one Parquet file (to be written in one piece), compressed as every artifact unless
    told otherwise (``schemas.scratch_compression``)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression, **writer_options(table.schema))
    return sink.getvalue().to_pybytes()


def write_file(path: str, table: pa.Table, schema: pa.Schema | None = None) -> None:
    """One Parquet file at ``path`` (any Beam filesystem), compressed as every artifact; with ``schema``, the
    table's columns are chosen and cast to it."""
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        pq.write_table(table, handle, compression=PARQUET_CODEC, **writer_options(table.schema))


def read_table(output: str, name: str, columns: list[str] | None = None) -> pa.Table:
    """All rows of artifact ``name`` as one table (only for small artifacts or tests)."""
    tables = [read_file(path, columns) for path in parquet_files(output, name)]
    return pa.concat_tables(tables) if tables else pa.table({})


def read_files(paths: Iterable[str], schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """The rows of the Parquet files ``paths`` (in path order) as one table; an empty one of ``schema`` if none."""
    read = [read_file(path, columns) for path in sorted(paths)]
    empty = schema.empty_table() if columns is None else schema.empty_table().select(columns)
    return pa.concat_tables(read) if read else empty


def iter_batches(output: str, name: str, columns: list[str] | None = None,
                 batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """Stream artifact ``name`` batch by batch with bounded memory."""
    return iter_file_batches(parquet_files(output, name), columns, batch_size)


def iter_file_batches(files: Iterable[str], columns: list[str] | None = None,
                      batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """Stream the given Parquet files batch by batch, one row group decoded at a time: what is held is one row
    group, which every writer here keeps small (pyarrow's own batch reader reads ahead over several row groups:
    3 times the memory on the index's shard files, a share of the shard that grew with it)."""
    for path in files:
        with open_parquet(path) as parquet:
            require_columns(parquet, path, columns)
            for group in range(parquet.num_row_groups):
                yield from parquet.read_row_group(group, columns=columns).to_batches(max_chunksize=batch_size)


def file_schema(path: str) -> pa.Schema:
    """The Arrow schema of one Parquet file (from its footer)."""
    with open_parquet(path) as opened:
        return opened.schema_arrow


def file_metadata(path: str) -> dict[str, str]:
    """The key/value metadata of one Parquet file, decoded."""
    raw = file_schema(path).metadata or {}
    return {key.decode(): value.decode() for key, value in raw.items()}
