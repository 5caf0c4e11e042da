"""The dictionary's last step: the entity linker (``artifacts.linker``) built in one worker step from the entities/
and dictionary/names/ files once they are written (never on the launcher)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from artifacts import schemas, tables
from artifacts.linker import build_kb_trie, write_linker_columns
from artifacts.trie_map import iter_strings


def write_linker(entity_files: Sequence[str], name_files: Sequence[str], linker_dir: str,
                 config: dict[str, Any]) -> None:
    """The entity linker from the finished entities/ and names files (``config``: what the linker records, under
    its names for the options); only the name and key tries are global."""
    # Columns, not row dicts: 7M entities as Python dicts would take gigabytes on one worker.
    entities = tables.read_files(entity_files, schemas.ENTITIES, ["entity_id", "title", "qid"]).sort_by("entity_id")
    kb_keys = build_kb_trie(iter_strings(schemas.entity_keys(entities.column("qid"), entities.column("title"))))
    titles = entities.column("title")  # ids are 1..N: position i is entity i + 1
    counted = ["entity_id", "link_count", "total_link_count", "doc_count"]
    names = tables.read_files(name_files, schemas.NAMES, ["name", *counted])
    counts = np.empty((names.num_rows, len(counted)), dtype=np.uint32)  # the linker's own width, filled a column
    for index, column in enumerate(counted):  # at a time (int64 columns of 20M pairs stacked would take 640 MB)
        counts[:, index] = names.column(column).to_numpy()
    name_column = names.column("name")
    del names  # its int64 count columns (32 bytes a pair) are not held while the tries are built
    write_linker_columns(linker_dir, name_column, counts, kb_keys, titles, config)


def build_linker(_: None, entity_files: list[str], name_files: list[str], linker_dir: str,
                 config: dict[str, Any]) -> str:
    """The linker step: ``write_linker``; returns the linker's directory."""
    write_linker(entity_files, name_files, linker_dir, config)
    return linker_dir


class WriteLinker(beam.PTransform):
    """{"entities": written entity files, "names": written name files} -> the linker, built in one worker step
    once both are written."""

    def __init__(self, linker_dir: str, config: dict[str, Any]) -> None:
        super().__init__()
        self._linker_dir, self._config = linker_dir, config

    def expand(self, written: dict[str, beam.PCollection]) -> beam.PCollection:
        return (
            written["names"].pipeline
            | "Once" >> beam.Create([None])
            | "BuildLinker" >> beam.Map(build_linker, beam.pvalue.AsList(written["entities"]),
                                        beam.pvalue.AsList(written["names"]), self._linker_dir, self._config)
        )
