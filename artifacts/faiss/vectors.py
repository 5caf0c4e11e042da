"""The index stage's vector tables: ``embeddings/`` rows (passage_id, title, text, embedding) as Arrow tables and
back as float32 matrices."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

VECTOR_BATCH = 8192  # vectors read back at a time where a worker holds a shard or a sample (~25 MB at 768 dims)


def embedding_schema(dim: int) -> pa.Schema:
    return pa.schema([("passage_id", pa.int64()), ("title", pa.string()), ("text", pa.string()),
                      ("embedding", pa.list_(pa.float32(), dim))])


def embedding_table(rows: Sequence[tuple[int, str, str, np.ndarray]], dim: int) -> pa.Table:
    """(passage_id, title, text, vector) rows as one Arrow table (vectors as one flat float32 buffer)."""
    vectors = np.asarray([row[3] for row in rows], dtype=np.float32).reshape(len(rows), dim)
    return with_vectors(pa.table([pa.array([row[0] for row in rows], pa.int64()),
                                  pa.array([row[1] for row in rows], pa.string()),
                                  pa.array([row[2] for row in rows], pa.string())],
                                 names=["passage_id", "title", "text"]), vectors)


def with_vectors(passages: pa.Table, vectors: np.ndarray) -> pa.Table:
    """The ``embedding_schema`` table of passages (a table with their passage_id, title and text columns) and
    their vectors (rows of ``vectors``, float32)."""
    dim = vectors.shape[1]
    columns = [passages.column(name) for name in ("passage_id", "title", "text")]
    return pa.Table.from_arrays([*columns, _vector_array(np.asarray(vectors, dtype=np.float32), dim)],
                                schema=embedding_schema(dim))


def _vector_array(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)


def table_vectors(table: pa.Table | pa.RecordBatch, column: str = "embedding") -> np.ndarray:
    values = table.column(column)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    dim = values.type.list_size
    return values.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(values), dim)




