"""index's first part, run by every core: passages turned into the encoder's model inputs (token ids, and a KPR
encoder's entities, found by the dictionary stage's linker) and written as Parquet files for the part that holds
the GPU (``forward``), with the passages themselves: their rows in the index come from these files.

A worker builds the inputs of the passages it is given, in calls of up to ``PASSAGES_PER_CALL[1]``, counts what
they hold (a KPR encoder's entities) and writes a file every ``INPUT_FILE_ROWS`` passages
(``follow.WriteFollowedFiles``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import schemas
from artifacts.passages import Passage
from encoders.loading import load_inputs
from encoders.retrievers import EncoderOptions, ReadyInputs, TextInputs
from transforms.common.dead_letters import count
from transforms.common.follow import FollowedFiles, WriteFollowedFiles
from transforms.common.per_worker import PerProcess
from transforms.index.refresh import passage_digest

INPUT_PREFIX = "inputs-"  # the input files' names: the model's part follows these
INPUT_FILE_ROWS = 4096  # passages a worker buffers before writing a file
PASSAGES_PER_CALL = (64, 512)  # passages an input call takes (Beam's BatchElements bounds)
FEATURES = ("input_ids", "token_type_ids", "entity_ids", "entity_positions")  # what the model reads, if present


def passage_keys(salt: str, passages: Sequence[Passage]) -> np.ndarray:
    """The ``passage_key`` (uint64) of each passage under the encoder of ``salt``: 64 bits of blake2b over it, the
    passage's id and the digest of its title and text."""
    seed = hashlib.blake2b(bytes.fromhex(salt), digest_size=8)
    keys = np.empty(len(passages), dtype=np.uint64)
    for row, passage in enumerate(passages):
        digest = seed.copy()
        digest.update(passage.passage_id.to_bytes(8, "little", signed=True))
        digest.update(passage_digest(passage.title, passage.text))
        keys[row] = int.from_bytes(digest.digest(), "little")
    return keys


def inputs_table(passages: Sequence[Passage], features: Sequence[dict[str, Any]], salt: str) -> pa.Table:
    """Passages, their keys under the encoder of ``salt`` and their model inputs (``TextInputs.passages``' dicts)
    as a ``schemas.PASSAGE_INPUTS`` table; what an encoder does not make is null."""
    columns: dict[str, Any] = {"passage_id": [passage.passage_id for passage in passages],
                               "title": [passage.title for passage in passages],
                               "text": [passage.text for passage in passages],
                               "passage_key": passage_keys(salt, passages)}
    for name in FEATURES:
        columns[name] = [item.get(name) for item in features]
    return pa.table(columns, schema=schemas.PASSAGE_INPUTS)


def table_inputs(table: pa.Table) -> tuple[np.ndarray, ReadyInputs]:
    """The passages' keys and ready model inputs of a ``schemas.PASSAGE_INPUTS`` table (what the model's process
    needs of ``inputs_table``'s: no passage becomes a Python object there); the token ids stay packed arrays."""
    return table.column("passage_key").to_numpy(), ReadyInputs.of_table(table)


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
    """Lists of passages -> paths of the Parquet files holding them, their keys under the encoder of ``salt``
    (``passage_keys``) and their model inputs (``files``); what the inputs hold is counted (a KPR
    encoder's entities). ``tokenizer``: the passages' tokenizer saved by ``models.save_tokenizer`` ("": loaded by
    transformers in each worker)."""

    def __init__(self, encoder: EncoderOptions, files: FollowedFiles, salt: str,
                 rows_per_file: int = INPUT_FILE_ROWS, tokenizer: str = "") -> None:
        super().__init__(files, rows_per_file)
        self._key, self._salt = inputs_key(encoder, tokenizer), salt
        self._loaded = PerProcess(load_keyed_inputs)

    def setup(self) -> None:
        super().setup()
        self._inputs = self._loaded.get(self._key)

    def table(self, passages: list[Passage]) -> pa.Table:
        features = self._inputs.passages(passages)
        self._inputs.count(features, count)
        return inputs_table(passages, features, self._salt)


class PreparePassageInputs(beam.PTransform):
    """Passages -> the paths of the files holding them, their keys under the encoder of ``salt`` and their model
    inputs (written as ``files``, up to ``rows_per_file`` passages a file)."""

    def __init__(self, encoder: EncoderOptions, files: FollowedFiles, salt: str,
                 progress: beam.PTransform | None = None, rows_per_file: int = INPUT_FILE_ROWS,
                 tokenizer: str = "") -> None:
        super().__init__()
        self._build = BuildPassageInputs(encoder, files, salt, rows_per_file, tokenizer)
        self._progress = progress

    def expand(self, passages: beam.PCollection) -> beam.PCollection:
        if self._progress is not None:
            passages = passages | "Progress" >> self._progress
        return (passages
                | "BatchPassages" >> beam.BatchElements(min_batch_size=PASSAGES_PER_CALL[0],
                                                        max_batch_size=PASSAGES_PER_CALL[1])
                | "BuildInputs" >> beam.ParDo(self._build))
