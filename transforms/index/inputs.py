"""index's first part, run by every core: passages turned into the encoder's model inputs (token ids, and a KPR
encoder's entities, found by the dictionary stage's linker) and written as Parquet files for the part that holds
the GPU (``forward``), with the passages themselves: their rows in the index come from these files.

A worker builds the inputs of the passages it is given, in calls of up to ``PASSAGES_PER_CALL[1]``, counts what
they hold (a KPR encoder's entities) and writes a file every ``INPUT_FILE_ROWS`` passages
(``follow.WriteFollowedFiles``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from artifacts import schemas
from artifacts.passages import Passage
from encoders.loading import load_inputs
from encoders.retrievers import TOKEN_COLUMNS, EncoderOptions, ReadyInputs, TextInputs
from transforms.common.dead_letters import count
from transforms.common.follow import WriteFollowedFiles
from transforms.common.per_worker import PerProcess

INPUT_PREFIX = "inputs-"  # the input files' names: the model's part follows these
INPUT_FILE_ROWS = 4096  # passages a worker buffers before writing a file
PASSAGES_PER_CALL = (64, 512)  # passages an input call takes (Beam's BatchElements bounds)
FEATURES = ("input_ids", "token_type_ids", "entity_ids", "entity_positions")  # what the model reads, if present


def inputs_table(passages: Sequence[Passage], features: Sequence[dict[str, Any]]) -> pa.Table:
    """Passages and their model inputs (``TextInputs.passages``' dicts) as a ``schemas.PASSAGE_INPUTS`` table;
    what an encoder does not make is null."""
    columns: dict[str, list] = {"passage_id": [passage.passage_id for passage in passages],
                                "title": [passage.title for passage in passages],
                                "text": [passage.text for passage in passages]}
    for name in FEATURES:
        columns[name] = [item.get(name) for item in features]
    return pa.table(columns, schema=schemas.PASSAGE_INPUTS)


def table_inputs(table: pa.Table) -> tuple[list[Passage], ReadyInputs]:
    """The passages and ready model inputs of a ``schemas.PASSAGE_INPUTS`` table (the inverse of
    ``inputs_table``): the token ids stay packed arrays."""
    passages = [Passage(*row) for row in zip(*(table.column(name).to_pylist()
                                               for name in ("passage_id", "title", "text")), strict=True)]
    return passages, ReadyInputs.of_table(table, [name for name in FEATURES if name not in TOKEN_COLUMNS])


def encoder_key(options: EncoderOptions) -> str:
    """What identifies an encoder's inputs or model (the key of the one a worker process holds)."""
    return json.dumps(options.to_json(), sort_keys=True)


def inputs_key(options: EncoderOptions, tokenizer: str) -> str:
    """What identifies the inputs a worker process holds: the encoder and its saved tokenizer's file."""
    return json.dumps({"encoder": options.to_json(), "tokenizer": tokenizer}, sort_keys=True)


def load_keyed_inputs(key: str) -> TextInputs:
    fields = json.loads(key)
    return load_inputs(EncoderOptions.from_json(fields["encoder"]), tokenizer=fields["tokenizer"])


class BuildPassageInputs(WriteFollowedFiles):
    """Lists of passages -> paths of the Parquet files holding them and their model inputs, under ``directory``;
    what the inputs hold is counted (a KPR encoder's entities). ``tokenizer``: the passages' tokenizer saved by
    ``models.save_tokenizer`` ("": loaded by transformers in each worker)."""

    def __init__(self, encoder: EncoderOptions, directory: str, rows_per_file: int = INPUT_FILE_ROWS,
                 tokenizer: str = "") -> None:
        super().__init__(directory, INPUT_PREFIX, rows_per_file)
        self._key = inputs_key(encoder, tokenizer)
        self._loaded = PerProcess(load_keyed_inputs)

    def setup(self) -> None:
        self._inputs = self._loaded.get(self._key)

    def table(self, passages: list[Passage]) -> pa.Table:
        features = self._inputs.passages(passages)
        self._inputs.count(features, count)
        return inputs_table(passages, features)


class PreparePassageInputs(beam.PTransform):
    """Passages -> the paths of the files holding them and their model inputs (written under ``directory``, up to
    ``rows_per_file`` passages a file)."""

    def __init__(self, encoder: EncoderOptions, directory: str, progress: beam.PTransform | None = None,
                 rows_per_file: int = INPUT_FILE_ROWS, tokenizer: str = "") -> None:
        super().__init__()
        self._build = BuildPassageInputs(encoder, directory, rows_per_file, tokenizer)
        self._progress = progress

    def expand(self, passages: beam.PCollection) -> beam.PCollection:
        if self._progress is not None:
            passages = passages | "Progress" >> self._progress
        return (passages
                | "BatchPassages" >> beam.BatchElements(min_batch_size=PASSAGES_PER_CALL[0],
                                                        max_batch_size=PASSAGES_PER_CALL[1])
                | "BuildInputs" >> beam.ParDo(self._build))
