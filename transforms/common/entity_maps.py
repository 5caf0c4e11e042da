"""Lookups into ``entities/`` built once in one worker and memory-mapped by every worker process.

The title -> entity_id map (``artifacts.trie_map``: a marisa trie of the titles and the entity id of each trie key);
about 7M titles for English Wikipedia: some 150 MB of trie and 28 MB of ids, shared by the processes of a machine.
The entity rows by id (``entities.arrow``): ``entity_id, title, qid`` sorted by id."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from artifacts import fs, tables
from artifacts.trie_map import build_trie_map, save_trie_map


def build_title_ids(entity_files: list[str], directory: str) -> str:
    """Write the title -> entity_id map of the entities in ``entity_files`` (entities/ Parquet files; one entity
    per title) under ``directory``; returns ``directory``. Holds every title once, in this one worker."""
    titles: list[pa.Array] = []
    ids: list[np.ndarray] = []
    for batch in tables.iter_file_batches(entity_files, ["entity_id", "title"]):
        titles.append(batch.column("title"))
        ids.append(batch.column("entity_id").to_numpy())
    save_trie_map(directory, build_trie_map(pa.chunked_array(titles, pa.string()),
                                            np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)))
    return directory


# --- entity rows by id -------------------------------------------------------------------------------------------

ROWS_FILE = "entities.arrow"
ROW_COLUMNS = ["entity_id", "title", "qid"]


@dataclass(frozen=True)
class EntityRows:
    """``entity_id, title, qid`` of every entity, sorted by id (an Arrow table, memory-mapped)."""

    table: pa.Table

    @property
    def entity_ids(self) -> np.ndarray:
        return self.table.column("entity_id").to_numpy()

    def of_bucket(self, bucket: int, buckets: int) -> pa.Table:
        """The rows of the entities whose id is ``bucket`` modulo ``buckets``."""
        return self.table.filter(pa.array(self.entity_ids % buckets == bucket))


def build_entity_rows(entity_files: list[str], directory: str) -> str:
    """Write the rows of the entities in ``entity_files`` (entities/ Parquet files) under ``directory`` as one
    Arrow file sorted by id; returns ``directory``. About 300 MB for English Wikipedia, in this one worker."""
    table = tables_of(entity_files, ROW_COLUMNS).sort_by("entity_id")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    fs.write_bytes(fs.join(directory, ROWS_FILE), sink.getvalue().to_pybytes())
    return directory


def tables_of(files: list[str], columns: list[str]) -> pa.Table:
    """``columns`` of the Parquet ``files`` as one table."""
    parts = [tables.read_file(path, columns) for path in files]
    return pa.concat_tables(parts).combine_chunks()


def load_entity_rows(directory: str) -> EntityRows:
    """The rows written by ``build_entity_rows``, memory-mapped."""
    with fs.local_copy(fs.join(directory, ROWS_FILE)) as local:
        return EntityRows(pa.ipc.open_file(pa.memory_map(local)).read_all())
