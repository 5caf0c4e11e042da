"""How artifact files are written: every column dictionary-encoded and with statistics, vectors never."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from artifacts import schemas, tables
from artifacts.errors import first_line
from artifacts.faiss.vectors import embedding_schema
from tests.builders import first_row_group_columns


def test_vectors_are_not_dictionary_encoded_and_other_columns_are() -> None:
    vectors = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    table = pa.Table.from_arrays(
        [pa.array(range(300), pa.int64()), pa.array(["title"] * 300), pa.array(["text"] * 300),
         pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 8)], schema=embedding_schema(8))
    assert schemas.writer_options(table.schema) == {"use_dictionary": ["passage_id", "title", "text"],
                                                     "write_statistics": ["passage_id", "title", "text"]}
    data = tables.parquet_bytes(table)
    columns = first_row_group_columns(io.BytesIO(data))
    encodings = {name: column.encodings for name, column in columns.items()}
    assert "RLE_DICTIONARY" not in encodings["embedding"]
    assert all("RLE_DICTIONARY" in encodings[name] for name in ("passage_id", "title", "text"))
    with_statistics = {name: column.is_stats_set for name, column in columns.items()}
    assert with_statistics == {"passage_id": True, "title": True, "text": True, "embedding": False}
    assert pq.read_table(io.BytesIO(data)).equals(table)


def test_lists_of_integers_and_float16_vectors() -> None:
    schema = pa.schema([("ids", pa.list_(pa.int32())), ("half", pa.list_(pa.float16(), 4)),
                        ("scores", pa.list_(pa.float32()))])
    # token ids repeat (a vocabulary): kept; a variable-length list of floats is not a vector column
    assert schemas.writer_options(schema)["use_dictionary"] == ["ids", "scores"]


def test_a_missing_column_is_named_with_its_file(tmp_path) -> None:
    """A reader asking for a column the file lacks: the file and the column, not pyarrow's KeyError (a traceback
    out of diff)."""
    path = tmp_path / "part-00000-of-00001.parquet"
    pq.write_table(pa.table({"title": ["A"]}), path)
    for read in (lambda: tables.read_file(str(path), ["title", "target"]),
                 lambda: list(tables.iter_file_batches([str(path)], ["title", "target"]))):
        with pytest.raises(tables.DamagedParquetError) as refused:
            read()
        assert (refused.value.path, refused.value.problem) == (str(path), "column target is missing")
    assert tables.read_file(str(path), ["title"]).column("title").to_pylist() == ["A"]


def test_a_library_message_is_one_printable_line() -> None:
    """pyarrow quotes the byte it could not read (``don't know what type: \\x0f``): escaped, as a table's cell."""
    assert first_line(OSError("Couldn't deserialize thrift: type: \x0f\t more\nsecond line")) == (
        "Couldn't deserialize thrift: type: \\x0f\\t more")
    assert first_line(OSError("")) == "OSError"
